/**
 * Commands about processes, with or without a state dir: inspect, sweep.
 */
import { statSync } from 'node:fs';
import { backend } from '../backend/index.js';
import { inspect, isNoProcess, verify } from '../process/identity.js';
import { NotAProcessError } from '../errors.js';
import { readStateDir } from '../state/reads.js';
import { sweep } from '../process/sweep.js';
import type { ProcessIdentity } from '../types.js';
import { pidMax } from '../validate.js';
import {
  type Command,
  flag,
  JSON_OPTION,
  noArgs,
  oneArg,
  STATE_DIR_OPTION,
  stringOption,
  UsageError,
  wholeNumber,
} from './args.js';
import { CliError, errorJson, note, print, shownArg, shownArgv, table } from './output.js';

function pidArg(command: string, text: string): number {
  if (!/^-?\d+$/.test(text)) throw new UsageError(`PID must be a number, got ${JSON.stringify(text)}`, command);
  const pid = Number(text);
  if (text.startsWith('-') || pid === 0) throw new UsageError(`PID must be a positive integer, got ${text}`, command);
  if (pid > pidMax()) throw new UsageError(`PID must be at most ${pidMax()} (kernel.pid_max), got ${text}`, command);
  return pid;
}

/** inspect()'s errno errors, said about the pid that was asked for. */
function aboutPid(err: unknown, pid: number): unknown {
  const code = (err as NodeJS.ErrnoException)?.code;
  if (err instanceof NotAProcessError || typeof code !== 'string') return err;
  if (isNoProcess(err)) return new CliError(`no process ${pid} (it may have exited)`, code);
  if (code === 'EACCES' || code === 'EPERM') return new CliError(`not allowed to read process ${pid}`, code);
  return err;
}

/** The exe as people know it: its path, with the dev:ino that proves it beside it. */
function exeLine(exe: ProcessIdentity['exe'], path: string | null): string {
  if (exe === null) return path === null ? '-' : shownArg(path);
  const ids = `${exe.dev}:${exe.ino}`;
  if (path === null) return `(path unreadable) ${ids}`;
  let now: { dev: number; ino: number } | null = null;
  try {
    now = statSync(path);
  } catch {
    // deleted or unreachable: the kernel's " (deleted)" suffix already says the first
  }
  const moved = now !== null && (now.dev !== exe.dev || now.ino !== exe.ino);
  return `${shownArg(path)} (${ids}${moved ? '; the path now names another file' : ''})`;
}

export const inspectCommand: Command = {
  name: 'inspect',
  synopsis: 'inspect PID [--json]',
  summary: "a process's identity, as custody records and proves it",
  description: `Reads the identity custody records for a process and later proves it by: boot id,
start time, pidfs id (native backend, Linux >= 6.9), the executable (its path, and
the device:inode that proves it), argv as bytes (a byte that is not UTF-8 shown as
\\xNN; --json gives custody's lossless form), uid, parent and session; and the
cgroup v2 it is in (a systemd unit's, for a systemd-run target). Nothing is
signalled or changed.`,
  options: [JSON_OPTION],
  async run(p) {
    const pid = pidArg(p.command, oneArg(p, 'PID', true));
    let id: ProcessIdentity;
    try {
      id = inspect(pid);
    } catch (err) {
      throw aboutPid(err, pid);
    }
    const link = backend.exePath(pid);
    // Read after the identity: it counts only if the pid still names that process.
    const path = link !== null && verify(id).verdict === 'ok' ? link : null;
    // Its cgroup v2 (a systemd unit's, for a systemd-run target), as /proc/<pid>/cgroup names it; same check.
    const where = backend.cgroupOf(pid);
    const cgroup = where !== null && verify(id).verdict === 'ok' ? where : null;
    print(flag(p, 'json'), { ...id, exePath: path, cgroup }, () =>
      [
        ['pid', id.pid],
        ['ppid', id.ppid],
        ['uid', id.uid],
        ['session', id.session],
        ['state', id.state],
        ['startTicks', id.startTicks],
        ['bootId', id.bootId],
        ['pidfsId', id.pidfsId ?? '-'],
        ['pidNs', id.pidNs ?? '-'],
        ['exe', exeLine(id.exe, path)],
        ['argv', shownArgv(id.argv)],
        ['cgroup', cgroup ?? '-'],
      ]
        .map(([k, v]) => `${String(k).padEnd(12)}${v}`)
        .join('\n'),
    );
    return 0;
  },
};

export const sweepCommand: Command = {
  name: 'sweep',
  synopsis:
    'sweep --exact [--dry-run] [--uid N] [--executable X] [--grace-ms N] [--deadline-ms N]\n' +
    '                     [--state-dir DIR] [--json] -- ARGV...',
  summary: 'end orphans whose argv is exactly ARGV (argv[0] included)',
  description: `Ends the processes whose whole argv is ARGV, byte for byte (an argument that is not
UTF-8 is compared as the bytes it is): each is pinned and re-checked before any
signal, then SIGTERM, SIGKILL after --grace-ms for what remains, all within
--deadline-ms. Never pid 1, this process or its ancestors; only processes of
--uid (default: yours); with a state dir, never a process an instance there records.
--dry-run lists what would be ended and signals nothing. Exit status 1 when a
process outlived the deadline.`,
  options: [
    { name: '--exact', help: 'required: ARGV is the whole argv, not a pattern' },
    { name: '--dry-run', help: 'list what would be ended; signal nothing' },
    { name: '--uid', value: 'N', help: 'only processes of this real uid (default: yours)' },
    { name: '--executable', value: 'X', help: 'a basename argv[0] must have, or a path /proc/<pid>/exe must be' },
    { name: '--grace-ms', value: 'N', help: 'wait after SIGTERM before SIGKILL (default 200)' },
    { name: '--deadline-ms', value: 'N', help: 'bound of the whole sweep (default 2000)' },
    {
      ...STATE_DIR_OPTION,
      help: 'spare every process an instance of this state dir records (default: $CUSTODY_STATE_DIR)',
    },
    JSON_OPTION,
  ],
  takesTail: true,
  async run(p) {
    // ARGV typed without the `--` before it arrives as arguments: say what is missing.
    if (p.tail === null && p.positionals.length > 0) {
      throw new UsageError(
        `sweep takes ARGV after --, and the -- is missing: custody sweep --exact -- ${shownArgv(p.positionals)}`,
        p.command,
      );
    }
    noArgs(p);
    if (!flag(p, 'exact') || !p.tail || p.tail.length === 0) {
      throw new UsageError('sweep needs --exact -- ARGV... (the whole argv, argv[0] included)', p.command);
    }
    const options = {
      argv: p.tail,
      executable: stringOption(p, 'executable'),
      uid: wholeNumber(p, 'uid'),
      graceMs: wholeNumber(p, 'grace-ms', 'milliseconds'),
      deadlineMs: wholeNumber(p, 'deadline-ms', 'milliseconds'),
      dryRun: flag(p, 'dry-run'),
    };
    const stateDir = stringOption(p, 'state-dir') ?? (process.env.CUSTODY_STATE_DIR || undefined);
    const exclude: number[] = [];
    if (stateDir) {
      // Read-only; a bad manifest names nothing to spare.
      for (const entry of readStateDir(stateDir).entries) {
        if (entry.manifest?.identity) exclude.push(entry.manifest.identity.pid);
      }
    }
    const r = await sweep({ ...options, exclude });
    const outcomes = options.dryRun ? (['matched'] as const) : (['terminated', 'killed', 'survivors'] as const);
    const rows = outcomes.flatMap((k) =>
      r[k].map((i) => ({ result: options.dryRun ? 'would end' : k, pid: i.pid, uid: i.uid, argv: shownArgv(i.argv) })),
    );
    print(flag(p, 'json'), r, () => table(rows, ['result', 'pid', 'uid', 'argv'], 'no process matched'));
    if (r.survivors.length === 0) return 0;
    const survived = {
      message: `pids ${r.survivors.map((i) => i.pid).join(', ')} outlived the sweep's deadline`,
      code: 'ERR_CUSTODY_STOP_TIMEOUT',
    };
    if (flag(p, 'json')) process.stderr.write(`${errorJson(survived)}\n`);
    else note(`${survived.message} [${survived.code}]`);
    return 1;
  },
};
