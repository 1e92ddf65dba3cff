/**
 * One launch attempt: what it is (the spec, the Attempt record, the Instance
 * it becomes), starting its child and finding the pid. The later steps have
 * files of their own: confirm.ts (exec into the expected marks), ready.ts
 * (the readiness waits) and abandon.ts (undoing a failed attempt).
 *
 * The rule from the field: identity is recorded only from the inspection
 * that confirmed exec (the pid a launcher reports may still be the
 * launcher's fork), and a failed attempt is killed, reaped and its declared
 * paths removed before anything else happens.
 */
import { closeSync, existsSync } from 'node:fs';
import type { Readable } from 'node:stream';
import { backend } from '../backend/index.js';
import type { ExecAttrs, RawIdentity } from '../backend/types.js';
import type { CgroupLimits, InstanceCgroup } from '../process/cgroup.js';
import { ConfirmTimeoutError, InvalidArgError, LaunchExitedError } from '../errors.js';
import type { ExecAttributes } from '../process/exec-attrs.js';
import { exitStatusWithin, type ProcessHandle, spawn, spawnedFile, type StdioOption } from '../process/handle.js';
import { callHook } from './hooks.js';
import { errorTail, OUTPUT_TAIL_BYTES, openAppend, type LogFiles, type LogOptions } from '../state/logs.js';
import { isTargetPid, readPidfile } from './pidfile.js';
import type { NotifyChannel } from './notify.js';
import { TOKEN_VAR, type Claim, type DevIno, type TokenMode } from '../process/ownership.js';
import { UNKNOWN_EXIT } from '../process/signals.js';
import { backoff, TIMED_OUT, within } from '../timing.js';
import type { AfterExitEnd, ExitStatus, LastExit, ProcessIdentity } from '../types.js';
import { describe, pidMax } from '../validate.js';
import type { RestartOptions } from './restart-policy.js';

/** A launched (or adopted) instance: a live view that follows its current run (`pid`, `token`, `identity`, `cgroup`) across restarts. */
export interface Instance {
  /** The instance's id, as given to launch(). */
  id: string;
  /** The current run's main process (follows restarts). */
  pid: number;
  /** The 128-bit launch token (hex) the process's argv carries. */
  token: string;
  /** Recorded from the inspection that confirmed exec. */
  identity: ProcessIdentity;
  /**
   * Settles once the process has exited; code and signal are null where the kernel cannot say. With a restart
   * policy it settles once the instance ends for good: at stop(), when it gives up (`failed`), or at an end
   * its policy does not restart.
   */
  exited: Promise<ExitStatus>;
  /**
   * The instance's cgroup (absolute path), where the supervisor has a cgroup
   * root and the target is in it; null otherwise (no root, or a pid
   * function's target created elsewhere).
   */
  cgroup: string | null;
  /** Its last end and why (systemd's Result=), once it has ended (on its own, or by stop()); null before. */
  lastExit: LastExit | null;
  /** The restarts its policy made since launch() (carried on across agent restarts); 0 without a policy. */
  restarts: number;
}

/** A liveness probe after readiness (src/lifecycle/health.ts). */
export interface HealthSpec {
  /** Resolves (sync or async) when the instance is healthy; a throw, a rejection or a timeout is a failure. */
  probe: (instance: Instance, signal: AbortSignal) => unknown;
  /** The time from one probe's end to the next one's start. */
  intervalMs: number;
  /** How long one probe may take before it counts as failed (its signal is aborted). Default intervalMs, at most 30 000. */
  timeoutMs?: number;
  /** Failed probes in a row that end the instance. Default 3. */
  failures?: number;
  /** The stop's grace after SIGTERM, when the probes end it. Default 10 000. */
  graceMs?: number;
}

/** Readiness by a unix socket: ready once it accepts a connection (and `probe`, when given, resolves). */
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

/**
 * What `supervisor.launch(spec)` starts, and how it proves, waits for and stops it. Also the exec attributes
 * (ExecAttributes): runAs, umask, rlimits, oomScoreAdj and noNewPrivileges, given to the child before it execs
 * (what a service manager does for a daemon). With runAs the ownership rule expects runAs.uid (or `uid`)
 * instead of ours, and the manifest records it for recovery.
 */
export interface LaunchSpec extends ExecAttributes {
  /** The instance's name in the state dir: 1-128 characters of [A-Za-z0-9._-], not starting with a dot. */
  id: string;
  /** The program to run: a path, or a name looked up on PATH. */
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
  /** When the instance is ready: a unix socket that accepts (`{ socket, probe? }`), `'notify'` (sd_notify READY=1, native backend), or a function that resolves once it is. Without it, ready once confirmed. */
  ready?: ReadySpec;
  /** A liveness probe once it is ready: `failures` failed probes in a row end it (stop result `health`). */
  health?: HealthSpec;
  /**
   * With ready: 'notify': the instance must send WATCHDOG=1 at least this often once ready (WATCHDOG_USEC is
   * set for it); a miss, or WATCHDOG=trigger, is SIGABRT to the main process, and the stop path after as long
   * again. Its end says `result: 'watchdog'`.
   */
  watchdogMs?: number;
  /**
   * Restart it when it ends (systemd's Restart=): which ends restart it, the delay (doubling to maxDelayMs), the
   * limit past which it is `failed`, and the exit codes that are clean. A restart is a whole launch, begun once
   * every process of the old run is proven gone and its paths removed; stop() never leads to one.
   */
  restart?: RestartOptions;
  /**
   * Runs once per end of the instance or of a launch attempt (an exit, a stop, an abandon), after every process
   * of it is proven gone and before its state is removed (a TAP device, an IP lease, a jailer's chroot to
   * release). Recorded as owed before it runs: an agent that dies before it returns runs it again at recovery
   * (from open({ specs })), so it must be idempotent. A throw or a timeout is a warning; it never blocks the end.
   */
  afterExit?: (end: AfterExitEnd) => unknown;
  /** How long afterExit may take. Default 10 000. */
  afterExitTimeoutMs?: number;
  /**
   * Where the pid comes from: the child (default), a pidfile, or a function.
   * With a pidfile custody follows systemd's Type=forking: it waits (within
   * the confirm deadline) for the launcher to exit, then reads the pidfile;
   * a launcher that exits non-zero is ERR_CUSTODY_LAUNCH_EXITED with its
   * status and output tails; so is a daemon gone after its launcher exited 0
   * (the pidfile still empty at the confirm deadline, or naming no process).
   */
  pid?: PidSpec;
  /** With `pid: { file }`: false for a launcher that stays (systemd-run --scope, a shell that waits). Default true. */
  launcherExits?: boolean;
  /**
   * Paths (sockets, pidfiles) removed before each attempt (a stale one from an earlier run would make
   * readiness or the pid lie), on abandon, and once the instance is proven gone (stopped, or exited on its
   * own). The ready socket and the pidfile are declared without being listed. Kept while it is quarantined.
   */
  paths?: string[];
  /** How long the pid may take to exec into the expected argv. Default 3000. */
  confirmTimeoutMs?: number;
  /** Tries in all, each abandoned cleanly before the next. Default 1. */
  attempts?: number;
  /** The environment (default: this process's); an undefined value removes a variable. */
  env?: Record<string, string | undefined>;
  /** The working directory (default: this process's). */
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
   * The uid the confirmed target may run as besides ours (or runAs.uid), for a launcher
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

/** How long a failed launch waits for an exit status the kernel does not have yet. */
export const EXIT_STATUS_WAIT_MS = 2000;

/** What the attempt's target must show, for the ownership rule. */
export function claimOf(a: Attempt): Claim {
  return {
    token: a.token,
    expect: a.expect,
    program: a.executable ? { exe: a.executable } : a.pidSpec === 'child' ? { argv: [a.command, ...a.argv] } : null,
    launcherExe: a.pidSpec === 'child' ? null : (a.launcherExe ?? null),
    uid: a.uid,
    runAsUid: a.exec?.runAs?.uid ?? null,
    tokenMode: a.tokenMode,
    // A pid function's target may be created elsewhere (a systemd-run
    // MainPID): only the child and what it forks are known to be inside.
    cgroup: a.cgroup && typeof a.pidSpec !== 'function' ? a.cgroup.node : null,
  };
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
  /** The exec attributes the child is spawned with (runAs: the uid it runs as instead of ours); null: none. */
  exec?: ExecAttrs | null;
  expect: string[];
  /** dev/ino the confirmed exe must have, when the spec names an executable. */
  executable: { dev: number; ino: number } | null;
  /** The executable as the spec names it (env-mode scans look for processes whose argv[0] names it). */
  executablePath: string | null;
  /** dev/ino of the spawned child's program (the launcher, in pidfile or function mode). */
  launcherExe?: { dev: number; ino: number } | null;
  /**
   * dev/ino of the binary spawned as the target itself (pid 'child'; null for a script, whose exe is its
   * interpreter): our child running it has exec'd it, whatever title it shows by now.
   */
  spawnedExe?: { dev: number; ino: number } | null;
  /** The launcher's start ticks: nothing started before them is the launch's own fork. */
  launcherStartTicks?: number | null;
  paths: string[];
  pidSpec: PidSpec;
  /** With a pidfile: the launcher exits once the pidfile is written (Type=forking). */
  launcherExits: boolean;
  /** The process we spawned (the target itself, or a launcher). */
  child: ProcessHandle | null;
  /**
   * Set by confirm: our child exec'd into the target and was then moved out of the attempt's cgroup (by its
   * launcher, into a cgroup of someone else's). Not the instance's, so abandon leaves it alone.
   */
  childMovedOut?: boolean;
  /** The session custody created for the attempt (the detached child leads it), whose every process is the attempt's. */
  session: number | null;
  /** The confirmed target, pinned by the inspection that confirmed it. */
  target: ProcessHandle | null;
  /**
   * The target was named by MAINPID= (ready: 'notify'), a member of the instance that may carry no token and
   * may exec after it was named: its record is proven by the kernel (pidfs id, cgroup), not by its marks.
   */
  handedOff?: boolean;
  /**
   * The attempt's cgroup, which the child was placed in before exec; null without a cgroup root. Once a pid
   * function's target is confirmed in a systemd unit of the launch's, that unit's cgroup (`unit`).
   */
  cgroup: InstanceCgroup | null;
  /** The cgroup made for the launcher, where the target turned out to be in a unit's (removed once it exits). */
  launcherCgroup?: InstanceCgroup | null;
  identity: ProcessIdentity | null;
  /** The attempt's last output, read when it fails (see startChild). */
  stderrTail: () => string | undefined;
  stdoutTail: () => string | undefined;
  /** With ready: 'notify', the socket bound for the attempt (closed when the attempt ends, whichever way). */
  notify: NotifyChannel | null;
}

/**
 * The child's environment: the spec's (or ours), plus CUSTODY_TOKEN (env mode; first, so a bounded read of
 * /proc/<pid>/environ finds it) and NOTIFY_SOCKET (ready: 'notify'), which nothing inherited may override.
 * undefined when nothing is added: the child then takes the spec's env as given.
 */
type Env = Record<string, string | undefined>;
export function childEnv(a: Attempt, env: Env | undefined, watchdogMs?: number): Env | undefined {
  if (a.tokenMode !== 'env' && !a.notify) return env;
  const out: Env = {};
  if (a.tokenMode === 'env') out[TOKEN_VAR] = a.token;
  Object.assign(out, env ?? process.env);
  if (a.tokenMode === 'env') out[TOKEN_VAR] = a.token;
  if (a.notify) out.NOTIFY_SOCKET = a.notify.address;
  // Only for this process: an inherited watchdog (the agent's own, under systemd) is not the instance's.
  delete out.WATCHDOG_USEC;
  delete out.WATCHDOG_PID;
  if (a.notify && watchdogMs !== undefined) out.WATCHDOG_USEC = String(watchdogMs * 1000);
  return out;
}

/**
 * Spawns the command. stdout and stderr not given go to the instance's logs
 * (`logs`, null for none); the output tails errors carry come from those
 * logs or a `{ file }`, read back bounded, or from a pipe (stderr only).
 */
export function startChild(a: Attempt, spec: LaunchSpec, logs: LogFiles | null): void {
  const opened: number[] = [];
  const stdio = (given: StdioOption | undefined, log: string | undefined): StdioOption => {
    if (given !== undefined || log === undefined) return given ?? 'ignore';
    const fd = openAppend(log);
    opened.push(fd);
    return { fd };
  };
  const env = childEnv(a, spec.env, spec.watchdogMs);
  let child: ProcessHandle;
  try {
    child = spawn(spec.command, a.argv, {
      stdio: ['ignore', stdio(spec.stdout, logs?.stdout), stdio(spec.stderr, logs?.stderr)],
      env,
      cwd: spec.cwd,
      detached: spec.detached !== false,
      newGroup: spec.processGroup === true,
      ...(a.cgroup ? { cgroup: a.cgroup.path } : {}),
      runAs: spec.runAs,
      umask: spec.umask,
      rlimits: spec.rlimits,
      oomScoreAdj: spec.oomScoreAdj,
      noNewPrivileges: spec.noNewPrivileges,
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
  if (a.pidSpec !== 'child') [a.launcherExe, a.launcherStartTicks] = launcherProgram(child.pid, spec, env);
  else a.spawnedExe = spawnedBinary(spec, env);
  const stderr = spec.stderr;
  if (stderr === 'pipe' && child.stderr) {
    let tail = '';
    // Read for the tail, but never hold the agent's loop open for a daemon's stderr.
    (child.stderr as Readable & { unref?: () => void }).unref?.();
    (child.stderr as Readable).on('data', (d: Buffer) => {
      tail = (tail + d.toString('utf8')).slice(-OUTPUT_TAIL_BYTES);
    });
    a.stderrTail = () => tail || undefined;
  } else {
    a.stderrTail = fileTail(stderr, logs?.stderr);
  }
  a.stdoutTail = fileTail(spec.stdout, logs?.stdout);
}

/** The tail of the file a stream went to: the `{ file }` given, or its instance log when none was given. */
function fileTail(given: StdioOption | undefined, log: string | undefined): () => string | undefined {
  if (given && typeof given === 'object' && 'file' in given) return () => errorTail(given.file, OUTPUT_TAIL_BYTES);
  if (given === undefined && log !== undefined) return () => errorTail(log, OUTPUT_TAIL_BYTES);
  return () => undefined;
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

/**
 * What the launcher's forks run before they exec, and since when the launcher
 * runs. For a binary, the file spawned: the launcher itself may show another
 * exe by the time we look. It may be done already (start-stop-daemon
 * --background exits once its fork has written the pidfile, before that fork
 * execs: 6 in 100 js launches, 1 in 100 native), a zombie with no exe; or,
 * placed in a cgroup by the js backend, still its placing shell (35 in 40).
 * Either way its fork would be taken for the target. A script's forks run its
 * interpreter, which only the launcher shows (#!/usr/bin/env names another).
 */
function launcherProgram(pid: number, spec: LaunchSpec, env: Env | undefined): [DevIno | null, number | null] {
  let seen: RawIdentity | null = null;
  try {
    seen = backend.inspect(pid);
  } catch {
    // gone or unreadable: the file it was spawned from still says what its forks run
  }
  const since = seen?.startTicks ?? null;
  let file: { id: DevIno; script: boolean } | null = null;
  try {
    file = spawnedFile(spec.command, env ?? process.env, spec.cwd);
  } catch {
    // replaced or removed since the spawn: what the launcher shows is all there is
  }
  if (file && !file.script) return [file.id, since];
  return [seen?.exe ?? file?.id ?? null, since];
}

/** The binary the target was spawned from, as spawn() resolved it; null for a script or a file gone since. */
function spawnedBinary(spec: LaunchSpec, env: Env | undefined): DevIno | null {
  try {
    const file = spawnedFile(spec.command, env ?? process.env, spec.cwd);
    return file.script ? null : file.id;
  } catch {
    return null;
  }
}

export function spawned(a: Attempt): ProcessHandle {
  if (!a.child) throw new Error(`launch of ${a.id}: nothing spawned yet`);
  return a.child;
}

export function exitedError(a: Attempt, pid: number | undefined, status: ExitStatus, what?: string): LaunchExitedError {
  return new LaunchExitedError(a.id, pid, status, { stderrTail: a.stderrTail(), stdoutTail: a.stdoutTail() }, what);
}

/**
 * Why a reported pid was gone at confirm, where its status (which only a child's reaping gives) would say
 * nothing: a pid function's pid no process had when first looked at, or a forking daemon gone after its
 * launcher exited 0. undefined: "exited with <status>" says it.
 */
export function goneBeforeConfirm(a: Attempt, pid: number, everSeen: boolean): string | undefined {
  if (typeof a.pidSpec === 'function' && !everSeen) {
    return `the pid function returned ${pid}, and no process has that pid (it never existed, or ended before it could be inspected)`;
  }
  if (typeof a.pidSpec === 'object' && a.launcherExits) {
    return `the daemon died: its launcher exited 0, but no process is left with the pid ${pid} that ${a.pidSpec.file} names`;
  }
  return undefined;
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
  if (a.launcherExits) {
    // The launcher succeeded: what failed is the daemon it left, and its output says why.
    const where = existsSync(file) ? `${file} is still empty` : `${file} does not exist`;
    const what = `the daemon died or never wrote its pid: its launcher exited 0, but ${where} after ${timeoutMs} ms`;
    throw exitedError(a, undefined, child.exitStatus ?? UNKNOWN_EXIT, what);
  }
  throw new ConfirmTimeoutError(a.id, undefined, timeoutMs, `no pid in ${file}`);
}
