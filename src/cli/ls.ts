/**
 * custody ls: every instance of a state dir, what its process verifies as
 * now, how long it has run, its restarts and its arguments. Only reads: no
 * lock is taken and nothing is created or changed.
 */
import { backend } from '../backend/index.js';
import { verify } from '../process/identity.js';
import { startedAtMs } from '../process/proc.js';
import { IncompleteInstanceError } from '../state/manifest.js';
import { readStateDir, type StateListing } from '../state/reads.js';
import { STATE_FORMAT } from '../state/statedir.js';
import { type Command, flag, JSON_OPTION, noArgs, STATE_DIR_OPTION, stateDirOf } from './args.js';
import { joined, print, shownArgv, table } from './output.js';

/** The widest the human table's ARGS column gets; --json has them whole. */
const ARGS_WIDTH = 100;

function formatLine(l: StateListing): string {
  if (l.format !== null && l.format < STATE_FORMAT) {
    return `state dir ${l.stateDir}: left by custody 0.${l.format}; the next open upgrades it`;
  }
  if (l.format === null) return `state dir ${l.stateDir}: empty`;
  return `state dir ${l.stateDir}: format ${l.format}`;
}

/** A duration for people, its two largest units: 45s, 12m05s, 3h07m, 2d04h. */
export function shownDuration(seconds: number): string {
  const s = Math.max(0, Math.floor(seconds));
  const two = (n: number) => String(n).padStart(2, '0');
  if (s < 60) return `${s}s`;
  if (s < 3600) return `${Math.floor(s / 60)}m${two(s % 60)}s`;
  if (s < 86_400) return `${Math.floor(s / 3600)}h${two(Math.floor((s % 3600) / 60))}m`;
  return `${Math.floor(s / 86_400)}d${two(Math.floor((s % 86_400) / 3600))}h`;
}

const clipped = (s: string, n: number) => (s.length > n ? `${s.slice(0, n - 1)}…` : s);

export const lsCommand: Command = {
  name: 'ls',
  synopsis: 'ls [--state-dir DIR] [--json]',
  summary: 'instances in a state dir: verdict, uptime, restarts, arguments (read-only)',
  description: `Lists every instance of a state dir with its recorded state (backoff and failed
for one its restart policy restarts), the uid it was started as (runAs, where one
was given), what its process verifies as now (ok, gone,
reused, mismatch...), how long that process has run (when it verifies), its restarts,
why its last run ended where recorded, the quarantine reason or what it waits for
(after-exit: a hook owed; no-spec: a restart that needs its spec) where there is one,
its cgroup where it has one (a systemd unit's is marked "(unit)"),
and its arguments (argv, argv[0] included; the table clips long ones, --json has them
whole). Also entries that hold no valid manifest, and files at the top that custody
did not write. Read-only: no lock is taken and nothing is created or changed, so it
also works while a supervisor holds the dir. A dir that does not exist is an error.`,
  options: [STATE_DIR_OPTION, JSON_OPTION],
  async run(p) {
    noArgs(p);
    const listing = readStateDir(stateDirOf(p));
    const bootMs = backend.bootTimeMs();
    const now = Date.now();
    const instances = listing.entries.map((entry) => {
      if (!entry.manifest) {
        const state = entry.error instanceof IncompleteInstanceError ? 'incomplete' : 'bad-manifest';
        return {
          id: entry.name,
          state,
          pid: null,
          runAs: null,
          verdict: null,
          field: null,
          uptimeSeconds: null,
          quarantine: null,
          lastResult: null,
          restarts: null,
          waiting: null,
          command: null,
          argv: null,
          cgroup: null,
          error: entry.error.message,
        };
      }
      const m = entry.manifest;
      const v = m.identity ? verify(m.identity) : null;
      // How long the process has run: only for one that is still the recorded process.
      const started =
        m.identity && v?.verdict === 'ok' && bootMs !== null ? startedAtMs(m.identity.startTicks, bootMs) : null;
      return {
        id: m.id,
        state: m.state,
        pid: m.identity?.pid ?? m.owed?.pid ?? null,
        // The uid the launch started it as (LaunchSpec.runAs); null: the supervisor's.
        runAs: m.runAs?.uid ?? null,
        verdict: v?.verdict ?? null,
        field: v?.field ?? null,
        uptimeSeconds: started === null ? null : Math.max(0, Math.round((now - started) / 1000)),
        quarantine: m.quarantine,
        // Why its last run ended, where that is recorded (a restart policy's, or an end whose afterExit is owed).
        lastResult: m.owed?.result ?? m.restart?.lastExit?.result ?? null,
        restarts: m.restart?.restarts ?? 0,
        // What it waits for: its afterExit hook (owed), or the spec a restart needs (no-spec).
        waiting: m.owed ? 'after-exit' : m.state === 'backoff' && m.waiting ? m.waiting : null,
        command: m.command,
        argv: m.identity?.argv ?? null,
        // The instance's cgroup: one custody made, or a systemd unit's (unit: true), which custody never removes.
        cgroup: m.cgroup ?? null,
        error: null,
      };
    });
    const value = { stateDir: listing.stateDir, format: listing.format, instances, foreign: listing.foreign };
    print(flag(p, 'json'), value, () => {
      const rows = instances.map((i) => ({
        ...i,
        verdict: joined(i.verdict ?? undefined, i.field ?? undefined),
        uptime: i.uptimeSeconds === null ? null : shownDuration(i.uptimeSeconds),
        reason: i.error ?? joined(i.quarantine?.reason, i.quarantine?.field) ?? i.waiting,
        last: i.lastResult,
        // The process's argv where one is recorded; else the command it was launched with.
        args: i.argv ? clipped(shownArgv(i.argv), ARGS_WIDTH) : i.command,
        cgroup: i.cgroup ? `${i.cgroup.path}${i.cgroup.unit ? ' (unit)' : ''}` : null,
      }));
      // RUNAS only where an instance was started as another uid: most state dirs have none.
      const runAs = instances.some((i) => i.runAs !== null) ? ['runAs'] : [];
      // CGROUP likewise only where an instance has one (a systemd unit's is marked "(unit)").
      const cgroup = instances.some((i) => i.cgroup !== null) ? ['cgroup'] : [];
      const columns = [
        'id',
        'state',
        'pid',
        ...runAs,
        'verdict',
        'uptime',
        'last',
        'restarts',
        'reason',
        ...cgroup,
        'args',
      ];
      const lines = [formatLine(listing), table(rows, columns, 'no instances')];
      if (listing.foreign.length) lines.push(`not custody's (left alone): ${shownArgv(listing.foreign)}`);
      return lines.join('\n');
    });
    return 0;
  },
};
