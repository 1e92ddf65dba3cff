/**
 * Errors with stable `code`s. Callers branch on `err.code`, never on the
 * message. Every class is exported so `instanceof` works too.
 */
import { constants } from 'node:os';
import { getSystemErrorMap } from 'node:util';
import { describeExit } from './process/exit.js';
import type { ExitStatus, OutputTails } from './types.js';

export type ErrnoCode = keyof typeof constants.errno;
export const isErrnoCode = (c: unknown): c is ErrnoCode => typeof c === 'string' && Object.hasOwn(constants.errno, c);

/**
 * An error shaped as Node's own system errors are (code, negative errno,
 * syscall, path), for failures the JS side finds itself: callers branch on
 * `code` whichever backend or layer raised it. The message follows the
 * addon's (`syscall CODE (description)`), with the path as Node's spawn
 * errors name it and a detail after a colon.
 */
/** libuv's words for an errno ("no such process"), read once: the map is rebuilt on every call. */
let errnoWords: Map<number, [string, string]> | undefined;
const describeErrno = (errno: number) => {
  errnoWords ??= getSystemErrorMap();
  return errnoWords.get(errno)?.[1];
};

export function errnoError(code: ErrnoCode, syscall: string, path?: string, detail?: string): NodeJS.ErrnoException {
  const errno = -constants.errno[code];
  const description = describeErrno(errno);
  const where = path === undefined ? '' : ` ${path}`;
  const err: NodeJS.ErrnoException = new Error(
    `${syscall}${where} ${code}${description ? ` (${description})` : ''}${detail ? `: ${detail}` : ''}`,
  );
  err.code = code;
  err.errno = errno;
  err.syscall = syscall;
  if (path !== undefined) err.path = path;
  return err;
}

/** Every `code` a CustodyError can carry. */
export type CustodyErrorCode =
  | 'ERR_CUSTODY_LAUNCH_EXITED'
  | 'ERR_CUSTODY_CONFIRM_TIMEOUT'
  | 'ERR_CUSTODY_READY_TIMEOUT'
  | 'ERR_CUSTODY_QUARANTINED'
  | 'ERR_CUSTODY_IDENTITY_UNRECORDED'
  | 'ERR_CUSTODY_IDENTITY_MISMATCH'
  | 'ERR_CUSTODY_STATE_LOCKED'
  | 'ERR_CUSTODY_BAD_MANIFEST'
  | 'ERR_CUSTODY_INVALID_ARG'
  | 'ERR_CUSTODY_UNSUPPORTED'
  | 'ERR_CUSTODY_STOP_TIMEOUT'
  | 'ERR_CUSTODY_NOT_FOUND'
  | 'ERR_CUSTODY_BUSY'
  | 'ERR_CUSTODY_CLOSED'
  | 'ERR_CUSTODY_STATE_IO'
  | 'ERR_CUSTODY_FOREIGN_PROC'
  | 'ERR_CUSTODY_NOT_A_PROCESS'
  | 'ERR_CUSTODY_DEFERRED'
  | 'ERR_CUSTODY_NOT_OURS'
  | 'ERR_CUSTODY_BAD_PIDFILE'
  | 'ERR_CUSTODY_BAD_LOG'
  | 'ERR_CUSTODY_NOT_CUSTODY_DIR'
  | 'ERR_CUSTODY_NO_STATE_DIR'
  | 'ERR_CUSTODY_UNSAFE_PATH'
  | 'ERR_CUSTODY_BAD_CGROUP'
  | 'ERR_CUSTODY_CGROUP_TIMEOUT';

/** The base of every error custody throws; `code` is stable (CustodyErrorCode), the message is for people. */
export class CustodyError extends Error {
  readonly code: CustodyErrorCode;
  constructor(code: CustodyErrorCode, message: string, options?: { cause?: unknown }) {
    super(message, options);
    this.code = code;
    this.name = new.target.name;
  }
}

/** ERR_CUSTODY_INVALID_ARG: a bad argument (pid, id, signal, spec, option), found before anything is created or signalled. The message names the rule. */
export class InvalidArgError extends CustodyError {
  constructor(message: string) {
    super('ERR_CUSTODY_INVALID_ARG', message);
  }
}

/** ERR_CUSTODY_UNSUPPORTED: this backend, kernel or platform cannot do what was asked (e.g. `ready: 'notify'` on the js backend). */
export class UnsupportedError extends CustodyError {
  constructor(message: string) {
    super('ERR_CUSTODY_UNSUPPORTED', message);
  }
}

/** The identity of a process could not be proven: the record lacks a field that proof needs. */
export class IdentityUnrecordedError extends CustodyError {
  readonly field: string;
  constructor(pid: number, field: string) {
    super(
      'ERR_CUSTODY_IDENTITY_UNRECORDED',
      `pid ${pid}: the recorded identity has no ${field}; ownership cannot be proven`,
    );
    this.field = field;
  }
}

/** The live process is not the recorded one (reused pid, other exe or argv, reboot, or gone). */
export class IdentityMismatchError extends CustodyError {
  readonly verdict: string;
  readonly field: string | undefined;
  constructor(pid: number, verdict: string, field?: string) {
    super(
      'ERR_CUSTODY_IDENTITY_MISMATCH',
      `pid ${pid}: the live process does not match the recorded identity (${verdict}${field ? `: ${field}` : ''})`,
    );
    this.verdict = verdict;
    this.field = field;
  }
}

/**
 * The attempt's process is gone before it was ready. `what` replaces "(pid N) exited with <status>" where
 * the status says nothing: a reported pid with no process behind it, a daemon gone after its launcher exited
 * 0. The message quotes the stderr tail, or the stdout tail where stderr has nothing; both are fields.
 */
export class LaunchExitedError extends CustodyError {
  readonly id: string;
  readonly pid: number | undefined;
  readonly exitCode: number | null;
  readonly signal: NodeJS.Signals | null;
  readonly stderrTail: string | undefined;
  readonly stdoutTail: string | undefined;
  constructor(id: string, pid: number | undefined, status: ExitStatus, tails: OutputTails = {}, what?: string) {
    const { stderrTail, stdoutTail } = tails;
    const quoted = stderrTail ? `; stderr: ${stderrTail.trim()}` : stdoutTail ? `; stdout: ${stdoutTail.trim()}` : '';
    const how = what ? `: ${what}` : `${pid ? ` (pid ${pid})` : ''} exited with ${describeExit(status)}`;
    super('ERR_CUSTODY_LAUNCH_EXITED', `launch of ${id}${how}${quoted}`);
    this.id = id;
    this.pid = pid;
    this.exitCode = status.code;
    this.signal = status.signal;
    this.stderrTail = stderrTail;
    this.stdoutTail = stdoutTail;
  }
}

/** ERR_CUSTODY_CONFIRM_TIMEOUT: the launched pid did not come to carry the token (and run `executable`) within `confirmTimeoutMs`; the attempt was abandoned. */
export class ConfirmTimeoutError extends CustodyError {
  readonly id: string;
  readonly pid: number | undefined;
  constructor(id: string, pid: number | undefined, timeoutMs: number, detail: string) {
    super(
      'ERR_CUSTODY_CONFIRM_TIMEOUT',
      `launch of ${id}: pid ${pid ?? '?'} did not exec into the expected argv within ${timeoutMs} ms (${detail})`,
    );
    this.id = id;
    this.pid = pid;
  }
}

/** ERR_CUSTODY_READY_TIMEOUT: the instance was not ready within its bound; the attempt was abandoned. */
export class ReadyTimeoutError extends CustodyError {
  readonly id: string;
  constructor(id: string, timeoutMs: number, detail: string, options?: { cause?: unknown }) {
    super('ERR_CUSTODY_READY_TIMEOUT', `launch of ${id}: not ready within ${timeoutMs} ms (${detail})`, options);
    this.id = id;
  }
}

/** ERR_CUSTODY_QUARANTINED: the id is quarantined (recovery could not prove whose its process is); `supervisor.release(id)` clears it. */
export class QuarantinedError extends CustodyError {
  readonly id: string;
  readonly reason: string | undefined;
  constructor(id: string, reason?: string) {
    super(
      'ERR_CUSTODY_QUARANTINED',
      `instance ${id} is quarantined${reason ? ` (${reason})` : ''}; release() it first`,
    );
    this.id = id;
    this.reason = reason;
  }
}

/** ERR_CUSTODY_STATE_LOCKED: another supervisor (`holderPid`) holds the state dir. */
export class StateLockedError extends CustodyError {
  readonly holderPid: number | null;
  readonly stateDir: string;
  constructor(stateDir: string, holderPid: number | null, detail?: string) {
    const holder = holderPid ? `pid ${holderPid}` : 'another supervisor';
    super('ERR_CUSTODY_STATE_LOCKED', `state dir ${stateDir} is locked by ${holder}${detail ? ` (${detail})` : ''}`);
    this.holderPid = holderPid;
    this.stateDir = stateDir;
  }
}

/** The state dir could not be read or written (ENOSPC, EIO, EROFS, EMFILE...): `cause` is the errno error. */
export class StateIOError extends CustodyError {
  constructor(message: string, cause: unknown) {
    super('ERR_CUSTODY_STATE_IO', `${message}: ${(cause as Error)?.message ?? cause}`, { cause });
  }
}

/** An existing dir custody did not make (no `.custody` stamp, not a 0.1 state dir): never written to. */
export class NotCustodyDirError extends CustodyError {
  readonly stateDir: string;
  constructor(stateDir: string, why: string) {
    super('ERR_CUSTODY_NOT_CUSTODY_DIR', `${stateDir} is not a custody state dir: ${why}; refusing to use it`);
    this.stateDir = stateDir;
  }
}

/** A read-only look at a state dir that does not exist (nothing is created for it). */
export class NoStateDirError extends CustodyError {
  readonly stateDir: string;
  constructor(stateDir: string) {
    super('ERR_CUSTODY_NO_STATE_DIR', `state dir ${stateDir} does not exist`);
    this.stateDir = stateDir;
  }
}

/**
 * A path another uid could change under custody, or one that is never a
 * state dir (/, $HOME, /etc). `path` is the offending component.
 */
export class UnsafePathError extends CustodyError {
  readonly path: string;
  constructor(path: string, why: string) {
    super('ERR_CUSTODY_UNSAFE_PATH', `${path} ${why}`);
    this.path = path;
  }
}

/** ERR_CUSTODY_BAD_MANIFEST: a manifest that is not valid JSON, of an unknown version, or a symlink. */
export class BadManifestError extends CustodyError {
  readonly path: string;
  constructor(path: string, why: string, options?: { cause?: unknown }) {
    super('ERR_CUSTODY_BAD_MANIFEST', `manifest ${path}: ${why}`, options);
    this.path = path;
  }
}

/** ERR_CUSTODY_STOP_TIMEOUT: a process was still alive after SIGKILL and its bound. */
export class StopTimeoutError extends CustodyError {
  readonly pid: number;
  constructor(pid: number, waitedMs: number) {
    super(
      'ERR_CUSTODY_STOP_TIMEOUT',
      `pid ${pid} did not exit within ${waitedMs} ms of SIGKILL (uninterruptible sleep?)`,
    );
    this.pid = pid;
  }
}

/**
 * /proc describes another pid namespace's processes than the ones our pids
 * (and pidfds) name: reading it would mix two processes. Seen in
 * `unshare --pid --fork` without `--mount-proc`.
 */
export class ForeignProcError extends CustodyError {
  readonly procRoot: string;
  constructor(procRoot: string, seenAs: string) {
    super(
      'ERR_CUSTODY_FOREIGN_PROC',
      `${procRoot} belongs to another pid namespace (${procRoot}/self is ${seenAs}, this process is pid ${process.pid}); ` +
        'mount a /proc of this namespace (unshare --mount-proc) before inspecting processes',
    );
    this.procRoot = procRoot;
  }
}

/** The pid names a thread that is not its thread group's leader: a TID is not a process. */
export class NotAProcessError extends CustodyError {
  readonly pid: number;
  readonly tgid: number | null;
  constructor(pid: number, tgid: number | null) {
    super('ERR_CUSTODY_NOT_A_PROCESS', `pid ${pid} is a thread${tgid ? ` of process ${tgid}` : ''}, not a process`);
    this.pid = pid;
    this.tgid = tgid;
  }
}

/** The pid a launcher or a pid function reported is provably not the instance's (another uid, pid 1, an ancestor...). */
export class NotOursError extends CustodyError {
  readonly id: string;
  readonly pid: number;
  constructor(id: string, pid: number, why: string) {
    super('ERR_CUSTODY_NOT_OURS', `launch of ${id}: ${why}; refusing to take it for the instance`);
    this.id = id;
    this.pid = pid;
  }
}

/**
 * Recovery could not decide this instance now (the kernel could not answer:
 * EMFILE, ENOMEM, a transient I/O error); a later recover() will. Until
 * then it is neither launched nor stopped.
 */
export class DeferredError extends CustodyError {
  readonly id: string;
  constructor(id: string, cause?: unknown) {
    super(
      'ERR_CUSTODY_DEFERRED',
      `instance ${id} is deferred: recovery could not decide it yet; the supervisor looks again on its own (recover() looks now)`,
      { cause },
    );
    this.id = id;
  }
}

/** A path custody refuses to read or write as it stands (a symlink, a FIFO, a device, too big, malformed). */
export class PathRefusedError extends CustodyError {
  readonly path: string;
  constructor(code: CustodyErrorCode, what: string, path: string, why: string, options?: { cause?: unknown }) {
    super(code, `${what} ${path}: ${why}`, options);
    this.path = path;
  }
}

/**
 * A pidfile that cannot hold a pid custody may act on: a symlink, a FIFO, a
 * device, larger than a pid can be, not a decimal pid, or out of range.
 * Refused before anything is pinned, never read past its bound.
 */
export class BadPidfileError extends PathRefusedError {
  constructor(path: string, why: string, options?: { cause?: unknown }) {
    super('ERR_CUSTODY_BAD_PIDFILE', 'pidfile', path, why, options);
  }
}

/** A log path (a stdio `{ file }` or an instance log) that is not a regular file, or is a symlink. */
export class BadLogError extends PathRefusedError {
  constructor(path: string, why: string, options?: { cause?: unknown }) {
    super('ERR_CUSTODY_BAD_LOG', 'log', path, why, options);
  }
}

/**
 * A cgroup custody cannot use as it stands: a root that is relative, not a
 * directory, not on a cgroup v2 mount, or not writable; an instance cgroup
 * a child could not be placed in.
 */
export class BadCgroupError extends PathRefusedError {
  constructor(path: string, why: string, options?: { cause?: unknown }) {
    super('ERR_CUSTODY_BAD_CGROUP', 'cgroup', path, why, options);
  }
}

/** A cgroup did not reach the state asked for (frozen, thawed, empty) within its bound. */
export class CgroupTimeoutError extends CustodyError {
  readonly path: string;
  constructor(path: string, what: string, waitedMs: number) {
    super('ERR_CUSTODY_CGROUP_TIMEOUT', `cgroup ${path} was not ${what} within ${waitedMs} ms`);
    this.path = path;
  }
}

/** Node's convention for a cancelled operation: name AbortError, code ABORT_ERR, cause the signal's reason. */
export class AbortError extends Error {
  readonly code = 'ABORT_ERR';
  constructor(reason?: unknown) {
    super('The operation was aborted', reason === undefined ? undefined : { cause: reason });
    this.name = 'AbortError';
  }
}
