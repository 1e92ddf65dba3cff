/**
 * One launch attempt: spawn, find the pid, confirm exec into the expected
 * argv, wait until ready; and abandon, which undoes a failed attempt.
 *
 * The rule from the field: identity is recorded only from the inspection
 * that confirmed exec (the pid a launcher reports may still be the
 * launcher's fork), and a failed attempt is killed, reaped and its declared
 * paths removed before anything else happens.
 */
import { closeSync } from 'node:fs';
import { connect } from 'node:net';
import type { Readable } from 'node:stream';
import { backend } from '../backend/index.js';
import type { PidRef } from '../backend/types.js';
import type { CgroupLimits, InstanceCgroup } from '../process/cgroup.js';
import { ConfirmTimeoutError, InvalidArgError, LaunchExitedError, NotOursError, ReadyTimeoutError } from '../errors.js';
import type { Emit } from '../events.js';
import { exitStatusWithin, type ProcessHandle, spawn, type StdioOption } from '../process/handle.js';
import { callHook } from './hooks.js';
import { isNoProcess } from '../process/identity.js';
import { pin } from '../process/pin.js';
import { errorTail, openAppend, type LogFiles, type LogOptions } from '../state/logs.js';
import { removeDeclaredPaths } from '../state/paths.js';
import { isTargetPid, readPidfile } from './pidfile.js';
import { UNKNOWN_EXIT } from '../process/signals.js';
import type { NotifyChannel } from './notify.js';
import {
  describeRejection,
  isMember,
  ENVIRON_MAX_BYTES,
  judge,
  mayCarryEnvToken,
  TOKEN_VAR,
  tokenMarks,
  type Claim,
  type EnvironReader,
  type Rejection,
  type TokenMode,
} from '../process/ownership.js';
import { terminate } from '../process/terminate.js';
import { terminateCgroup, terminateMembers } from '../process/tree.js';
import { backoff, TIMED_OUT, within } from '../timing.js';
import type { ExitStatus, ProcessIdentity } from '../types.js';
import { describe, pidMax } from '../validate.js';

export interface Instance {
  id: string;
  pid: number;
  /** The 128-bit launch token (hex) the process's argv carries. */
  token: string;
  /** Recorded from the inspection that confirmed exec. */
  identity: ProcessIdentity;
  /** Settles once the process has exited; code and signal are null where the kernel cannot say. */
  exited: Promise<ExitStatus>;
  /**
   * The instance's cgroup (absolute path), where the supervisor has a cgroup
   * root and the target is in it; null otherwise (no root, or a pid
   * function's target created elsewhere).
   */
  cgroup: string | null;
}

export interface SocketReady {
  /** A unix socket the process listens on. A connect proves "bound", not "serving": give a probe to make it exact. */
  socket: string;
  /** An alias of LaunchSpec.readyTimeoutMs (giving both is ERR_CUSTODY_INVALID_ARG). */
  timeoutMs?: number;
  /**
   * Called, sync or async, once a connect succeeded and the process is still
   * alive (e.g. QMP `qmp_capabilities` + `query-status`). Readiness is reached
   * only when it resolves; a rejection is retried until the ready deadline,
   * whose ERR_CUSTODY_READY_TIMEOUT carries the last one as its cause. The
   * signal aborts once the wait is over.
   */
  probe?: (socket: string, signal: AbortSignal) => unknown;
}

/**
 * 'notify': systemd's sd_notify protocol (NOTIFY_SOCKET; READY=1 from the instance's processes only; native
 * backend). A unix socket to connect to. Or a check of your own (sync or async) that resolves once ready.
 */
export type ReadySpec = 'notify' | SocketReady | ((instance: Instance) => unknown);
/** The child itself, a pidfile (systemd Type=forking), or a function (sync or async) returning the pid. */
export type PidSpec = 'child' | { file: string } | (() => number | PromiseLike<number>);

export interface LaunchSpec {
  id: string;
  command: string;
  /** The argv after the command; a function receives the launch token, which the argv must carry. */
  args: string[] | ((token: string) => string[]);
  /** argv elements the confirmed process must carry besides the token. */
  expect?: string[];
  /**
   * Where the token goes: 'argv' (default; args must carry it) or 'env': CUSTODY_TOKEN=<token> in the
   * initial environment, proven from /proc/<pid>/environ, for programs whose argv is fixed (`/bin/sleep 300`).
   * An environment that cannot be read (another uid) proves nothing: unprovable, never "no token".
   */
  token?: TokenMode;
  /**
   * The program the confirmed process must be running, compared by device
   * and inode with /proc/<pid>/exe. Give it when a launcher's own argv
   * carries the target's arguments (its fork, before exec, would match them).
   */
  executable?: string;
  ready?: ReadySpec;
  /**
   * Where the pid comes from: the child (default), a pidfile, or a function.
   * With a pidfile custody follows systemd's Type=forking: it waits (within
   * the confirm deadline) for the launcher to exit, then reads the pidfile;
   * a launcher that exits non-zero is ERR_CUSTODY_LAUNCH_EXITED with its
   * status and stderr tail.
   */
  pid?: PidSpec;
  /** With `pid: { file }`: false for a launcher that stays (systemd-run --scope, a shell that waits). Default true. */
  launcherExits?: boolean;
  /** Paths removed on abandon and stop (sockets, pidfiles). */
  paths?: string[];
  /** How long the pid may take to exec into the expected argv. Default 3000. */
  confirmTimeoutMs?: number;
  /** Tries in all, each abandoned cleanly before the next. Default 1. */
  attempts?: number;
  env?: Record<string, string | undefined>;
  cwd?: string;
  /**
   * Default: the instance's stdout log (see `logs`); 'ignore' with `logs: false`. Not 'pipe'
   * (ERR_CUSTODY_INVALID_ARG): an Instance has no streams to read it from.
   */
  stdout?: Exclude<StdioOption, 'pipe'>;
  /**
   * Default: the instance's stderr log, whose tail every ERR_CUSTODY_LAUNCH_EXITED carries; 'ignore' with
   * `logs: false`. `{ file }` appends (its tail is read on failure). 'pipe' keeps a tail too, but a daemon
   * writing to a pipe whose reader (this process) is gone gets EPIPE: not for anything that outlives the agent.
   */
  stderr?: StdioOption;
  /**
   * Where stdout and stderr go when not given: <stateDir>/.logs/<id>/stdout.log and stderr.log, fresh at
   * each launch (the previous run's kept as `.1`), capped at maxBytes (8 MiB) with `keep` (1) rotated
   * generations, kept after stop. false: nowhere.
   */
  logs?: false | LogOptions;
  /**
   * The uid the confirmed target may run as besides ours, for a launcher
   * that drops privileges (QEMU -runas, start-stop-daemon --chuid).
   */
  uid?: number;
  /** A new session for the process (default true): it must outlive the agent and its terminal. */
  detached?: boolean;
  /** Without a new session, still a new process group (setpgid), so the group can be told apart. */
  processGroup?: boolean;
  /** How long abandon waits after SIGTERM before SIGKILL. Default 2000. */
  abandonGraceMs?: number;
  /** How long readiness may take (a socket, its probe, or a ready function). Default 10000. */
  readyTimeoutMs?: number;
  /**
   * Limits of the instance's cgroup (a supervisor opened with `cgroup`): written before the process starts.
   * Each needs its controller offered by the cgroup root; ERR_CUSTODY_UNSUPPORTED where it is not.
   */
  limits?: CgroupLimits;
  /** Cancels the launch: the attempt is abandoned and the launch rejects with an AbortError. */
  signal?: AbortSignal;
}

const STDERR_TAIL_BYTES = 2048;

/** A short kernel wait for a child's argv to appear after exec: at most 40 x 50 us. */
const spinCell = new Int32Array(new SharedArrayBuffer(4));
const MAX_ARGV_SPINS = 40;
const ARGV_SPIN_MS = 0.05;

/**
 * Rejections that waiting cannot change for a reported pid: it is someone else's (not a launcher still
 * exec'ing); and, for any pid, an environment that may not be read (another uid; root reads every one).
 */
const PERMANENT = new Set<Rejection>(['init', 'self', 'ancestor', 'uid', 'namespace', 'cgroup', 'environ']);

/** Our own child: exec'd into `executable` (if named) and carrying the marks; why not, or null. */
function ownChildMarks(a: Attempt, claim: Claim, live: ProcessIdentity, environ: EnvironReader): Rejection | null {
  if (a.executable && !(live.exe !== null && live.exe.dev === a.executable.dev && live.exe.ino === a.executable.ino)) {
    return 'exe';
  }
  return tokenMarks(claim, live, environ);
}

/** What the attempt's target must show, for the ownership rule. */
export function claimOf(a: Attempt): Claim {
  return {
    token: a.token,
    expect: a.expect,
    program: a.executable ? { exe: a.executable } : a.pidSpec === 'child' ? { argv: [a.command, ...a.argv] } : null,
    launcherExe: a.pidSpec === 'child' ? null : (a.launcherExe ?? null),
    uid: a.uid,
    tokenMode: a.tokenMode,
    // A pid function's target may be created elsewhere (a systemd-run
    // MainPID): only the child and what it forks are known to be inside.
    cgroup: a.cgroup && typeof a.pidSpec !== 'function' ? a.cgroup.node : null,
  };
}

/** Reads a pinned process's environment for an env-mode judgement (syscalls stay in the backend). */
export function environOf(ref: PidRef): EnvironReader {
  return () => backend.readEnviron(ref, ENVIRON_MAX_BYTES);
}

export interface Attempt {
  id: string;
  token: string;
  /** Where the token is: the argv, or CUSTODY_TOKEN in the environment. */
  tokenMode: TokenMode;
  /** The command as spawned (argv[0]) and its arguments. */
  command: string;
  argv: string[];
  /** The uid the target may run as besides ours (a launcher that drops privileges). */
  uid: number | null;
  expect: string[];
  /** dev/ino the confirmed exe must have, when the spec names an executable. */
  executable: { dev: number; ino: number } | null;
  /** The executable as the spec names it (env-mode scans look for processes whose argv[0] names it). */
  executablePath: string | null;
  /** dev/ino of the spawned child's program (the launcher, in pidfile or function mode). */
  launcherExe?: { dev: number; ino: number } | null;
  paths: string[];
  pidSpec: PidSpec;
  /** With a pidfile: the launcher exits once the pidfile is written (Type=forking). */
  launcherExits: boolean;
  /** The process we spawned (the target itself, or a launcher). */
  child: ProcessHandle | null;
  /** The session custody created for the attempt (the detached child leads it), whose every process is the attempt's. */
  session: number | null;
  /** The confirmed target, pinned by the inspection that confirmed it. */
  target: ProcessHandle | null;
  /** The attempt's cgroup, which the child was placed in before exec; null without a cgroup root. */
  cgroup: InstanceCgroup | null;
  identity: ProcessIdentity | null;
  stderrTail: () => string | undefined;
  /** With ready: 'notify', the socket bound for the attempt (closed when the attempt ends, whichever way). */
  notify: NotifyChannel | null;
}

/**
 * The child's environment: the spec's (or ours), plus CUSTODY_TOKEN (env mode; first, so a bounded read of
 * /proc/<pid>/environ finds it) and NOTIFY_SOCKET (ready: 'notify'), which nothing inherited may override.
 * undefined when nothing is added: the child then takes the spec's env as given.
 */
type Env = Record<string, string | undefined>;
export function childEnv(a: Attempt, env: Env | undefined): Env | undefined {
  if (a.tokenMode !== 'env' && !a.notify) return env;
  const out: Env = {};
  if (a.tokenMode === 'env') out[TOKEN_VAR] = a.token;
  Object.assign(out, env ?? process.env);
  if (a.tokenMode === 'env') out[TOKEN_VAR] = a.token;
  if (a.notify) out.NOTIFY_SOCKET = a.notify.address;
  return out;
}

/**
 * Spawns the command. stdout and stderr not given go to the instance's logs
 * (`logs`, null for none); the stderr tail error messages carry comes from
 * the stderr log or `{ file }`, read back bounded, or from a pipe.
 */
export function startChild(a: Attempt, spec: LaunchSpec, logs: LogFiles | null): void {
  const opened: number[] = [];
  const stdio = (given: StdioOption | undefined, log: string | undefined): StdioOption => {
    if (given !== undefined || log === undefined) return given ?? 'ignore';
    const fd = openAppend(log);
    opened.push(fd);
    return { fd };
  };
  let child: ProcessHandle;
  try {
    child = spawn(spec.command, a.argv, {
      stdio: ['ignore', stdio(spec.stdout, logs?.stdout), stdio(spec.stderr, logs?.stderr)],
      env: childEnv(a, spec.env),
      cwd: spec.cwd,
      detached: spec.detached !== false,
      newGroup: spec.processGroup === true,
      ...(a.cgroup ? { cgroup: a.cgroup.path } : {}),
    });
  } finally {
    // The child holds its own copies; ours would keep the files open.
    for (const fd of opened) closeSync(fd);
  }
  a.child = child;
  // setsid made it the leader of a session of its own: every process in it is the attempt's.
  a.session = spec.detached !== false ? child.pid : null;
  // The launcher's own program: a reported pid still running it is the
  // launcher's fork before exec, whatever its argv says. (Not needed when the
  // child is the target.)
  if (a.pidSpec !== 'child') {
    try {
      a.launcherExe = backend.inspect(child.pid).exe;
    } catch {
      a.launcherExe = null;
    }
  }
  const stderr = spec.stderr;
  if (stderr === 'pipe' && child.stderr) {
    let tail = '';
    // Read for the tail, but never hold the agent's loop open for a daemon's stderr.
    (child.stderr as Readable & { unref?: () => void }).unref?.();
    (child.stderr as Readable).on('data', (d: Buffer) => {
      tail = (tail + d.toString('utf8')).slice(-STDERR_TAIL_BYTES);
    });
    a.stderrTail = () => tail || undefined;
  } else if (stderr && typeof stderr === 'object' && 'file' in stderr) {
    a.stderrTail = () => errorTail(stderr.file, STDERR_TAIL_BYTES);
  } else if (stderr === undefined && logs) {
    a.stderrTail = () => errorTail(logs.stderr, STDERR_TAIL_BYTES);
  }
}

/** The identity the confirming inspection recorded; a launch step that needs it before confirm is a bug. */
export function confirmedIdentity(a: Attempt): ProcessIdentity {
  if (!a.identity) throw new Error(`launch of ${a.id}: no confirmed identity yet`);
  return a.identity;
}

/** The confirmed target's handle (our child, or the pid pinned by the confirming inspection). */
export function confirmedTarget(a: Attempt): ProcessHandle {
  if (!a.target) throw new Error(`launch of ${a.id}: no confirmed target yet`);
  return a.target;
}

/** The process startChild() spawned. */
export function spawned(a: Attempt): ProcessHandle {
  if (!a.child) throw new Error(`launch of ${a.id}: nothing spawned yet`);
  return a.child;
}

export function exitedError(a: Attempt, pid: number | undefined, status: ExitStatus): LaunchExitedError {
  return new LaunchExitedError(a.id, pid, status, a.stderrTail());
}

/** The error for a confirmed target that exited before it was ready: a non-child's status is worth a bounded wait. */
export async function targetExitedError(
  a: Attempt,
  target: ProcessHandle,
  signal?: AbortSignal,
): Promise<LaunchExitedError> {
  return exitedError(a, target.pid, await exitStatusWithin(target, EXIT_STATUS_WAIT_MS, signal));
}

/**
 * Resolves the pid: the child's, a function's, or a pidfile's, every wait
 * bounded by the confirm deadline and the abort signal. A pidfile is read
 * once the launcher has exited 0 (Type=forking; a failed launcher is
 * ERR_CUSTODY_LAUNCH_EXITED), or, for a launcher that stays, polled while it
 * runs. Its content is untrusted: see pidfile.ts.
 */
export async function obtainPid(
  a: Attempt,
  deadline: number,
  timeoutMs: number,
  signal?: AbortSignal,
): Promise<number> {
  const child = spawned(a);
  const left = () => Math.max(0, deadline - Date.now());
  if (a.pidSpec === 'child') return child.pid;
  if (typeof a.pidSpec === 'function') {
    const r = await within(callHook(a.pidSpec), left(), signal);
    if (r === TIMED_OUT) {
      throw new ConfirmTimeoutError(a.id, undefined, timeoutMs, 'the pid function did not resolve in time');
    }
    // A pid out of range would be cut to another pid somewhere down the line: refused, never wrapped.
    if (!isTargetPid(r)) {
      const range = `a pid is an integer from 2 to ${pidMax()}`;
      throw new InvalidArgError(`the pid function of ${a.id} returned ${describe(r)}; ${range}`);
    }
    return r;
  }
  const file = a.pidSpec.file;
  if (a.launcherExits) {
    const st = await within(child.exited, left(), signal);
    if (st === TIMED_OUT) {
      const why = `the launcher (pid ${child.pid}) did not exit; give launcherExits: false for one that stays`;
      throw new ConfirmTimeoutError(a.id, undefined, timeoutMs, why);
    }
    if (st.code !== 0 || st.signal) throw exitedError(a, child.pid, st);
  }
  for await (const _ of backoff({ maxMs: 25, deadline, signal })) {
    const pid = readPidfile(file);
    if (pid !== null) return pid;
    // A launcher that failed will never write it; one that exited 0 may
    // have daemonized after writing, so keep reading until the deadline.
    const st = child.exitStatus;
    if (st && (st.code !== 0 || st.signal)) throw exitedError(a, child.pid, st);
  }
  throw new ConfirmTimeoutError(a.id, undefined, timeoutMs, `no pid in ${file}`);
}

/** What one inspection of the reported pid showed, for decideConfirm(). */
export interface ConfirmFacts {
  /** Whether the pid is our own child (ours by birth), not one a launcher or a function reported. */
  own: boolean;
  /** Not there any more, or a zombie: it exited before it carried our marks. */
  gone: boolean;
  /** Why it is not (yet) the target, by the ownership rule or our child's marks; null: it is. */
  why: Rejection | null;
  /** Our child exec'd but its argv not laid out yet (an empty cmdline). */
  argvEmpty: boolean;
  /** Short kernel waits spent on an empty argv so far. */
  spins: number;
  /** Whether the confirm deadline has passed. */
  timedOut: boolean;
}

export type ConfirmStep =
  | { do: 'exited' }
  | { do: 'not-ours'; why: Rejection }
  | { do: 'confirmed' }
  | { do: 'spin' }
  | { do: 'retry' }
  | { do: 'timeout' };

/**
 * The confirm loop's next step after one inspection: the pid is the target,
 * has exited, is someone else's for good, or may still exec into the marks
 * (spin on our child's empty argv, retry later, or give up at the deadline).
 */
export function decideConfirm(f: ConfirmFacts): ConfirmStep {
  if (f.gone) return { do: 'exited' };
  // Our own child may still be exec'ing whatever it shows (only an environment that may not be read stays
  // so); a reported pid that is someone else's will not become ours by waiting.
  if (f.why && PERMANENT.has(f.why) && (!f.own || f.why === 'environ')) return { do: 'not-ours', why: f.why };
  if (f.why === null) return { do: 'confirmed' };
  // Exec'd (clone returns only then) but its argv not laid out yet: that takes microseconds, a timer a millisecond.
  if (f.own && f.argvEmpty && f.spins < MAX_ARGV_SPINS) return { do: 'spin' };
  return f.timedOut ? { do: 'timeout' } : { do: 'retry' };
}

/**
 * Polls the pid's argv until it carries the token and every expected
 * element, and records the identity from that very inspection, under the
 * pin the inspection was made with.
 */
export async function confirm(
  a: Attempt,
  pid: number,
  deadline: number,
  timeoutMs: number,
  signal?: AbortSignal,
): Promise<void> {
  const child = spawned(a);
  const own = pid === child.pid;
  let lastArgv: string[] | null = null;
  let spins = 0;
  const timeout = () =>
    new ConfirmTimeoutError(a.id, pid, timeoutMs, `last argv seen: ${JSON.stringify(lastArgv).slice(0, 200)}`);
  for await (const _ of backoff({ firstMs: 0, maxMs: 20, deadline, signal })) {
    for (;;) {
      // A pid function may name a child of Node's child_process: its owner
      // reaps it, and reaping it here would rob libuv of its exit. A TID is
      // refused (ERR_CUSTODY_NOT_A_PROCESS), exhaustion thrown: only a vanished pid means "exited".
      const pinned = pin(pid, { reapIfChild: typeof a.pidSpec !== 'function', thread: 'refuse' });
      let why: Rejection | null = null;
      let live: ProcessIdentity | null = null;
      if (pinned && pinned.identity.state !== 'Z') {
        live = pinned.identity;
        const claim = claimOf(a);
        const environ = pinned.environ;
        // Our own child is ours by birth: it only has to have exec'd into the
        // argv (or, in env mode, into an environment with the token: before exec
        // the child's is ours). A pid a launcher or a function reported must pass
        // the ownership rule on its own marks (token, program, uid; never the
        // launcher's fork). (A child exec'ing through a wrapper must still reach `executable`.)
        // With a cgroup our child is judged too: the js backend's placing
        // wrapper carries the target's argv before it is placed and has exec'd
        // it, and only the exec'd target in the cgroup is it.
        const verdict = own && !a.cgroup ? null : judge(claim, live, undefined, true, environ);
        why = verdict ? (verdict.ours ? null : verdict.why) : ownChildMarks(a, claim, live, environ);
      }
      const step = decideConfirm({
        own,
        gone: live === null,
        why,
        argvEmpty: pinned?.identity.argv.length === 0,
        spins,
        timedOut: Date.now() >= deadline,
      });
      if (step.do === 'confirmed' && pinned && live) {
        a.identity = live;
        if (own) {
          // Our own child: its pidfd from birth already pins it.
          pinned.handle.close();
          a.target = child;
        } else {
          a.target = pinned.handle;
        }
        return;
      }
      if (pinned) lastArgv = pinned.identity.argv;
      pinned?.handle.close();
      switch (step.do) {
        case 'exited': {
          // The pid is gone before it carried our argv. (Our child's status
          // comes with its reaping, at once; the bound is for the unexpected.)
          const bound = Math.max(0, deadline - Date.now()) + EXIT_STATUS_WAIT_MS;
          const reaped = own ? await within(child.exited, bound, signal) : TIMED_OUT;
          throw exitedError(a, pid, reaped !== TIMED_OUT ? reaped : (child.exitStatus ?? UNKNOWN_EXIT));
        }
        case 'not-ours':
          throw new NotOursError(a.id, pid, describeRejection(pid, step.why));
        case 'spin':
          spins++;
          Atomics.wait(spinCell, 0, 0, ARGV_SPIN_MS);
          continue;
        case 'timeout':
          throw timeout();
      }
      break;
    }
  }
  throw timeout();
}

/**
 * Waits until ready, failing the moment the process exits (with its status
 * and stderr tail). Bounded by timeoutMs and the abort signal; whatever is
 * still polling or probing is told to stop when the wait ends.
 */
export async function waitReady(
  a: Attempt,
  instance: Instance,
  ready: ReadySpec,
  timeoutMs: number,
  signal?: AbortSignal,
): Promise<void> {
  if (ready === 'notify') {
    if (!a.notify) throw new Error(`launch of ${a.id}: ready 'notify' without its socket`);
    await a.notify.wait(timeoutMs, signal);
    return;
  }
  const target = confirmedTarget(a);
  const over = new AbortController();
  const probeFailure: { last?: unknown } = {};
  const died = target.gone.then(() => 'died' as const);
  const check =
    typeof ready === 'function'
      ? callHook(ready, instance).then(() => 'ready' as const)
      : pollSocket(ready, target, confirmedIdentity(a), probeFailure, over.signal);
  try {
    const r = await within(Promise.race([check, died]), timeoutMs, signal);
    if (r === TIMED_OUT) {
      const last = probeFailure.last as Error | undefined;
      const detail =
        typeof ready === 'function'
          ? 'the ready check did not resolve'
          : 'last' in probeFailure
            ? `the probe of ${ready.socket} never succeeded: ${last?.message ?? String(last)}`
            : `nothing accepted on ${ready.socket}`;
      const cause = 'last' in probeFailure ? { cause: probeFailure.last } : undefined;
      throw new ReadyTimeoutError(a.id, timeoutMs, detail, cause);
    }
    if (r === 'died') {
      throw await targetExitedError(a, target, signal);
    }
  } finally {
    over.abort();
  }
}

/** How long a failed launch waits for an exit status the kernel does not have yet. */
export const EXIT_STATUS_WAIT_MS = 2000;

/**
 * Whether the confirmed process still runs: not seen to exit, not a zombie,
 * and the pid still its own (same start). Read now, not when the exit
 * watcher next runs: a connect can succeed on a socket whose owner just died.
 */
function stillRunning(target: ProcessHandle, identity: ProcessIdentity): boolean {
  if (target.hasExited) return false;
  try {
    const raw = backend.inspect(target.pid);
    return raw.state !== 'Z' && raw.startTicks === identity.startTicks;
  } catch (err) {
    return !isNoProcess(err);
  }
}

/**
 * Connects until the socket accepts while the process still runs, then
 * probes, if there is a probe, until it resolves. Never resolves when the
 * process is gone: the exit wins the race in waitReady.
 */
async function pollSocket(
  ready: SocketReady,
  target: ProcessHandle,
  identity: ProcessIdentity,
  failure: { last?: unknown },
  signal: AbortSignal,
): Promise<'ready'> {
  const never = new Promise<never>(() => {});
  for await (const _ of backoff({ maxMs: 50, signal })) {
    if (!stillRunning(target, identity)) return never;
    if (await connects(ready.socket)) {
      // The wait may have ended while the connect was in flight: a probe
      // called now would run after the timeout was reported, against a
      // process being abandoned, and its failure would be lost.
      if (signal.aborted || !stillRunning(target, identity)) return never;
      if (!ready.probe) return 'ready';
      try {
        await callHook(ready.probe, ready.socket, signal);
        if (!stillRunning(target, identity)) return never;
        return 'ready';
      } catch (err) {
        if (signal.aborted) return never;
        failure.last = err;
      }
    }
  }
  return never;
}

function connects(path: string): Promise<boolean> {
  return new Promise<boolean>((resolve) => {
    const s = connect({ path });
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => {
      s.destroy();
      resolve(false);
    });
  });
}

/**
 * Undoes an attempt: the child we spawned (ours by birth), the confirmed
 * target, everything that descends from them or stays in the session we
 * created, and token carriers the ownership rule accepts (a daemon that
 * double-forked away) get TERM, a bounded wait, KILL, rescans until none is
 * left; our child is reaped; then the declared paths go. A carrier the rule
 * rejects (an operator's `tail -f <token>.log`, another uid's copy) is never
 * signalled: a warning says why. With a cgroup, the cgroup is the attempt:
 * TERM to the child and target, cgroup.kill after the grace, `populated 0`,
 * and nothing outside it is looked at (but a pid function's target created
 * elsewhere, ended as above). Throws when something ours would not die
 * (the caller keeps the manifest). Returns the pids that were ended.
 */
export async function abandon(a: Attempt, graceMs: number, emit: Emit): Promise<number[]> {
  const child = a.child;
  const cg = a.cgroup;
  const targetInside = !!a.target && (a.target === child || !cg || targetInCgroup(a));
  const onEscalate = ({ pid }: { pid: number }) =>
    emit('escalate', {
      id: a.id,
      pid,
      message: `members of ${a.id} ignored SIGTERM for ${graceMs} ms during abandon; sent SIGKILL`,
    });
  const inCgroup: ProcessHandle[] = [];
  if (child) inCgroup.push(child);
  if (a.target && a.target !== child && targetInside) inCgroup.push(a.target);
  const ended: Array<Promise<number[]>> = [];
  if (cg) {
    const members = cg.procs();
    ended.push(
      terminateCgroup(cg, inCgroup, { graceMs, onEscalate }).then(() => [
        ...new Set([...inCgroup.map((h) => h.pid), ...members]),
      ]),
    );
  }
  const outside = cg ? (a.target && !targetInside ? [a.target] : []) : inCgroup;
  if (outside.length) ended.push(endTree(a, outside, graceMs, emit, onEscalate));
  const settled = await Promise.allSettled(ended);
  const failed = settled.find((r) => r.status === 'rejected');
  if (failed) {
    if (child?.hasExited) await child.exited;
    throw (failed as PromiseRejectedResult).reason;
  }
  // Our child is reaped by its watcher; wait for that so no zombie outlives abandon.
  if (child) await child.exited;
  removeDeclaredPaths(a.paths, emit, a.id);
  return settled.flatMap((r) => (r.status === 'fulfilled' ? r.value : []));
}

/** Whether the attempt's target is in its cgroup (a pid function's may have been created elsewhere). */
export function targetInCgroup(a: Attempt): boolean {
  return !!a.cgroup && !!a.identity && isMember(a.identity, { pids: new Set(), cgroup: a.cgroup.node });
}

/** Ends roots that no cgroup holds, with their descendants, session and the token carriers the rule accepts. */
async function endTree(
  a: Attempt,
  roots: ProcessHandle[],
  graceMs: number,
  emit: Emit,
  onEscalate: (i: { pid: number }) => void,
): Promise<number[]> {
  const rootPids = new Set(roots.map((r) => r.pid));
  const extra: ProcessHandle[] = [];
  const claim = claimOf(a);
  const launched = [a.command, ...a.argv];
  // Env mode: the token is in environments, read only of processes whose argv fits the launch.
  const candidate = (argv: string[]) =>
    a.tokenMode === 'env' ? mayCarryEnvToken(argv, launched, a.executablePath) : argv.some((x) => x.includes(a.token));
  try {
    // The attempt's own session, made by the child it spawned: its launcher may have exited already (a
    // pidfile launch's does), its fork not exec'd yet. Freed and taken by a stranger only after all of it
    // left, within this attempt's bounds (a stop, later, asks for a member in it: sessionHeld).
    const session = a.session;
    for (const p of await backend.listProcesses()) {
      if (rootPids.has(p.pid) || !candidate(p.argv)) continue;
      const pinned = pin(p.pid, { reapIfChild: true });
      if (!pinned) continue;
      // Re-checked under the pin: the scan alone proves nothing.
      const verdict = judge(claim, pinned.identity, { pids: rootPids, session }, false, pinned.environ);
      if (verdict.ours) {
        extra.push(pinned.handle);
        continue;
      }
      pinned.handle.close();
      // In env mode most candidates are merely the same program: only a token carrier is worth a warning.
      if (a.tokenMode === 'env' && verdict.why === 'token') continue;
      if (verdict.why !== 'gone')
        emit('warning', {
          id: a.id,
          pid: p.pid,
          reason: verdict.why,
          message: `abandon left ${describeRejection(p.pid, verdict.why)}`,
        });
    }
    const { members } = await terminateMembers([...roots, ...extra], {
      session,
      sessionProven: session !== null,
      graceMs,
      reapIfChild: true,
      onEscalate,
    });
    return members;
  } catch (err) {
    // A scan or a pin that failed (EMFILE) proves nothing gone, but the roots are ours by birth and by the
    // confirming inspection: they end all the same, and the error tells the caller to keep the state.
    const warn = (r: ProcessHandle, e: unknown) =>
      emit('warning', { id: a.id, pid: r.pid, message: `abandon could not end pid ${r.pid}: ${(e as Error).message}` });
    await Promise.all(roots.map((r) => terminate(r, { graceMs }).catch((e: unknown) => warn(r, e))));
    throw err;
  } finally {
    for (const h of extra) h.close();
  }
}
