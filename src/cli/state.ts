/**
 * Commands on a state dir. `ls` only reads (no lock, nothing created);
 * recover, release and stop open it as a supervisor would (its lock, so
 * they refuse a dir a running supervisor holds and name the holder), and
 * never create it.
 */
import { QuarantinedError } from '../errors.js';
import type { CustodyEvent } from '../events.js';
import { STATE_FORMAT } from '../state/statedir.js';
import { IncompleteInstanceError, assertEntryName } from '../state/manifest.js';
import { readStateDir, type StateListing } from '../state/reads.js';
import { type StopResult, Supervisor } from '../supervisor.js';
import { describeExit } from '../process/exit.js';
import { verify } from '../process/identity.js';
import {
  checked,
  type Command,
  flag,
  idArg,
  JSON_OPTION,
  type Parsed,
  noArgs,
  oneArg,
  STATE_DIR_OPTION,
  stateDirOf,
  UsageError,
  wholeNumber,
} from './args.js';
import { CliError, note, print, shownArgv, table } from './output.js';

const joined = (a: string | undefined, b: string | undefined) => (a && b ? `${a}:${b}` : (a ?? null));

/** Formats older than this custody's, by the release that wrote them: 1 is 0.1's (unstamped), 2 is 0.2's. */
function formatOwner(format: number): string {
  return `custody 0.${format}'s format`;
}

function formatLine(l: StateListing): string {
  if (l.format !== null && l.format < STATE_FORMAT) {
    return `state dir ${l.stateDir}: left by custody 0.${l.format}; the next open upgrades it`;
  }
  if (l.format === null) return `state dir ${l.stateDir}: empty`;
  return `state dir ${l.stateDir}: format ${l.format}`;
}

export const lsCommand: Command = {
  name: 'ls',
  synopsis: 'ls [--state-dir DIR] [--json]',
  summary: 'instances in a state dir and what their processes verify as (read-only)',
  description: `Lists every instance of a state dir with its recorded state (backoff and failed
for one its restart policy restarts), what its process verifies as now (ok, gone,
reused, mismatch...), why its last run ended and its restarts where recorded, the
quarantine reason or what it waits for (after-exit: a hook owed; no-spec: a restart
that needs its spec) where there is one, its cgroup (a systemd unit's is marked
"(unit)"), entries that hold no valid manifest, and
files at the top that custody did not write. Read-only: no lock is taken and nothing is created or changed, so it also works
while a supervisor holds the dir. A dir that does not exist is an error.`,
  options: [STATE_DIR_OPTION, JSON_OPTION],
  async run(p) {
    noArgs(p);
    const listing = readStateDir(stateDirOf(p));
    const instances = listing.entries.map((entry) => {
      if (!entry.manifest) {
        const state = entry.error instanceof IncompleteInstanceError ? 'incomplete' : 'bad-manifest';
        return {
          id: entry.name,
          state,
          pid: null,
          verdict: null,
          field: null,
          quarantine: null,
          lastResult: null,
          restarts: null,
          waiting: null,
          command: null,
          cgroup: null,
          error: entry.error.message,
        };
      }
      const m = entry.manifest;
      const v = m.identity ? verify(m.identity) : null;
      return {
        id: m.id,
        state: m.state,
        pid: m.identity?.pid ?? m.owed?.pid ?? null,
        verdict: v?.verdict ?? null,
        field: v?.field ?? null,
        quarantine: m.quarantine,
        // Why its last run ended, where that is recorded (a restart policy's, or an end whose afterExit is owed).
        lastResult: m.owed?.result ?? m.restart?.lastExit?.result ?? null,
        restarts: m.restart?.restarts ?? null,
        // What it waits for: its afterExit hook (owed), or the spec a restart needs (no-spec).
        waiting: m.owed ? 'after-exit' : m.state === 'backoff' && m.waiting ? m.waiting : null,
        command: m.command,
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
        reason: i.error ?? joined(i.quarantine?.reason, i.quarantine?.field) ?? i.waiting,
        last: i.lastResult,
        cgroup: i.cgroup ? `${i.cgroup.path}${i.cgroup.unit ? ' (unit)' : ''}` : null,
      }));
      const lines = [
        formatLine(listing),
        table(
          rows,
          ['id', 'state', 'pid', 'verdict', 'last', 'restarts', 'reason', 'cgroup', 'command'],
          'no instances',
        ),
      ];
      if (listing.foreign.length) lines.push(`not custody's (left alone): ${shownArgv(listing.foreign)}`);
      return lines.join('\n');
    });
    return 0;
  },
};

/**
 * Opens the state dir as a supervisor (never creating it), runs `fn`, and
 * closes it; processes keep running. Warnings and escalations go to stderr
 * as they happen.
 */
async function withSupervisor<T>(
  p: Parsed,
  fn: (s: Supervisor, report: Awaited<ReturnType<typeof Supervisor.open>>['report']) => Promise<T>,
): Promise<T> {
  const onEvent = (e: CustodyEvent) => {
    if (e.type === 'warning' || e.type === 'escalate') note(`${e.type}: ${e.message ?? ''}`);
  };
  const { supervisor, report } = await Supervisor.open({ stateDir: stateDirOf(p), create: false, onEvent });
  try {
    return await fn(supervisor, report);
  } finally {
    await supervisor.close();
  }
}

export const recoverCommand: Command = {
  name: 'recover',
  synopsis: 'recover [--state-dir DIR] [--json]',
  summary: 'open a state dir, recover every manifest, print the report',
  description: `Opens the state dir as a supervisor does and recovers every manifest in it: a
process proven to be the instance's is adopted, a manifest whose process is gone is
cleaned, one that cannot be proven is quarantined (never signalled). A dir left by
custody 0.1 or 0.2 is upgraded in place. Takes the dir's lock, so it refuses a dir a running
supervisor holds, naming it; never creates the dir. The processes keep running.`,
  options: [STATE_DIR_OPTION, JSON_OPTION],
  async run(p) {
    noArgs(p);
    // Only to say whether the open upgraded it; the open checks everything again, under the lock.
    const before = readStateDir(stateDirOf(p));
    const report = await withSupervisor(p, async (_s, r) => r);
    const upgradedFrom = before.format !== null && before.format < STATE_FORMAT ? before.format : null;
    const deferred = report.deferred.map(({ error, ...e }) => ({
      ...e,
      error: { code: (error as NodeJS.ErrnoException).code ?? null, message: error.message },
    }));
    print(flag(p, 'json'), { stateDir: before.stateDir, upgradedFrom, ...report, deferred }, () => {
      const outcomes = ['adopted', 'repaired', 'cleaned', 'quarantined', 'deferred'] as const;
      const rows = outcomes.flatMap((outcome) =>
        report[outcome].map((e) => ({ outcome, id: e.id, pid: e.pid, reason: joined(e.reason, e.field) })),
      );
      const head = upgradedFrom ? [`state dir ${before.stateDir}: upgraded from ${formatOwner(upgradedFrom)}`] : [];
      return [...head, table(rows, ['outcome', 'id', 'pid', 'reason'], `no instances in ${before.stateDir}`)].join(
        '\n',
      );
    });
    return 0;
  },
};

export const releaseCommand: Command = {
  name: 'release',
  synopsis: 'release ID|--all [--state-dir DIR] [--json]',
  summary: 'clear a quarantine, or every one (never signals the process)',
  description: `Clears the quarantine of ID (the name ls shows, even one that is not a valid id),
or with --all every quarantine of the state dir: an operator's decision that the
state can go. The manifest is removed; the process, if any, is never signalled.
Takes the dir's lock (refused while a supervisor holds it); never creates the dir.`,
  options: [{ name: '--all', help: 'release every quarantined instance' }, STATE_DIR_OPTION, JSON_OPTION],
  async run(p) {
    const all = flag(p, 'all');
    const name = oneArg(p, 'ID', false);
    if (all === (name !== undefined)) throw new UsageError('release takes one ID or --all', p.command);
    // Before anything is opened: a name that could reach outside the state dir never gets that far.
    if (name !== undefined) checked(p, () => assertEntryName(name));
    const released = await withSupervisor(p, async (s) => {
      const pids = new Map(s.list().map((i) => [i.id, i.pid]));
      if (name === undefined) return (await s.releaseAll()).map((id) => ({ id, pid: pids.get(id) ?? null }));
      await s.release(name);
      return [{ id: name, pid: pids.get(name) ?? null }];
    });
    print(flag(p, 'json'), { released }, () =>
      released.length === 0
        ? 'no instance is quarantined; nothing released'
        : released.map((r) => `released ${r.id}${r.pid ? ` (pid ${r.pid})` : ''}; nothing was signalled`).join('\n'),
    );
    return 0;
  },
};

export const removeCommand: Command = {
  name: 'remove',
  synopsis: 'remove ID [--state-dir DIR] [--json]',
  summary: 'forget an instance that does not run: backoff (its restart cancelled), failed, or exited',
  description: `Forgets the instance ID when nothing of it runs: one waiting for its restart (the
restart is cancelled), one its restart policy gave up on (failed), or one that exited
with its afterExit hook owed (the hook is not run: the operator's call). Its state is
removed; nothing is signalled. A running instance is refused (stop it); so is a
quarantined one (release it). Takes the dir's lock; never creates the dir. The CLI has
no specs, so it never restarts an instance nor runs a hook.`,
  options: [STATE_DIR_OPTION, JSON_OPTION],
  async run(p) {
    const id = idArg(p);
    const status = await withSupervisor(p, async (s) => {
      const was = s.list().find((i) => i.id === id)?.status ?? null;
      await s.remove(id).catch(inCliTerms);
      return was;
    });
    print(flag(p, 'json'), { id, status }, () => `removed ${id} (${status}); nothing was signalled`);
    return 0;
  },
};

function howItEnded(r: StopResult): string {
  if (r.outcome === 'already-gone') return 'it had already exited';
  // A process that is not our child may end with no status the kernel will tell (before Linux 6.15).
  const how = `exited (${describeExit(r)})`;
  return r.escalated ? `${how} (it outlived the grace period: SIGKILL)` : how;
}

/** The library's remedy is a call (release()); a CLI user's is a command. The code stays the library's. */
function inCliTerms(err: unknown): never {
  if (err instanceof QuarantinedError) {
    const why = err.reason ? ` (${err.reason})` : '';
    throw new CliError(`instance ${err.id} is quarantined${why}; run \`custody release ${err.id}\` first`, err.code);
  }
  throw err;
}

export const stopCommand: Command = {
  name: 'stop',
  synopsis: 'stop ID [--grace-ms N] [--state-dir DIR] [--json]',
  summary: 'stop an instance: SIGTERM, a bounded wait, SIGKILL; its state removed',
  description: `Stops the instance ID as its supervisor would: the whole instance, SIGTERM, up to
--grace-ms for it to exit, then SIGKILL. With a cgroup (recorded at launch) the
instance is its cgroup: whatever runs in it is ended, however it forked or setsid,
and the cgroup is removed. Without one: its process, its descendants and the session
custody created for it, each signalled through its own pidfd. Once it is proven gone
its state and declared paths are removed (its logs stay: custody logs). Opens the
state dir first (its lock: refused while a supervisor holds it, so stop it there) and
recovers it, so a quarantined instance is refused, never signalled; so is one whose
cgroup is no longer the one recorded, or lies where another uid could change it.`,
  options: [
    { name: '--grace-ms', value: 'N', help: 'wait after SIGTERM before SIGKILL (default 30000)' },
    STATE_DIR_OPTION,
    JSON_OPTION,
  ],
  async run(p) {
    const id = idArg(p);
    const graceMs = wholeNumber(p, 'grace-ms', 'milliseconds');
    const { pid, result } = await withSupervisor(p, async (s) => {
      const info = s.list().find((i) => i.id === id);
      return { pid: info?.pid ?? null, result: await s.stop(id, { graceMs }).catch(inCliTerms) };
    });
    print(
      flag(p, 'json'),
      { id, pid, ...result },
      () => `stopped ${id}${pid ? ` (pid ${pid})` : ''}: ${howItEnded(result)}; its state is removed`,
    );
    return 0;
  },
};
