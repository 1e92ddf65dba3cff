/**
 * Identity: inspect() reads what proves a process is the one we mean;
 * verify() compares a record with the live process, in the order of
 * docs/DESIGN.md ("Identity"). Nothing here signals anything.
 */
import { backend } from '../backend/index.js';
import type { RawIdentity } from '../backend/types.js';
import { InvalidArgError, NotAProcessError } from '../errors.js';
import type { ProcessIdentity, VerifyResult } from '../types.js';
import { assertPid } from '../validate.js';

export function toIdentity(pid: number, raw: RawIdentity, bootId: string): ProcessIdentity {
  return {
    pid,
    bootId,
    startTicks: raw.startTicks,
    exe: raw.exe,
    pidfsId: raw.pidfsId,
    argv: raw.argv,
    uid: raw.uid,
    ppid: raw.ppid,
    session: raw.session,
    state: raw.state,
    pidNs: backend.ownPidNs(),
    processPidNs: raw.processPidNs,
  };
}

/**
 * Reads a process's identity. On the native backend this is race-free: a
 * pidfd pins the process before the reads and is checked after; a process
 * that died meanwhile throws ESRCH instead of yielding a mixed identity.
 * Throws an Error with code ESRCH when there is no such process.
 */
export function inspect(pid: number): ProcessIdentity {
  assertPid(pid);
  return toIdentity(pid, backend.inspect(pid), backend.bootId());
}

/**
 * The one test of "gone": an inspection or a read under a pin failed because there is no process at the pid
 * (ESRCH, ENOENT; a TID is not one), not because the kernel could not answer (EMFILE, ENOMEM...: isTransient).
 * pin() (pin.ts) turns it into null.
 */
export function isNoProcess(err: unknown): boolean {
  const code = (err as NodeJS.ErrnoException)?.code;
  return code === 'ESRCH' || code === 'ENOENT' || err instanceof NotAProcessError;
}

const TRANSIENT = new Set(['EMFILE', 'ENFILE', 'ENOMEM', 'EAGAIN', 'EIO', 'EINTR', 'ENOBUFS']);

/**
 * Whether an error means "the kernel cannot answer now" (fd or memory
 * exhaustion, a transient I/O error, an exec that kept moving under the
 * reads): never an answer about the process, so never "gone" or "no match".
 */
export function isTransient(err: unknown): boolean {
  return TRANSIENT.has((err as NodeJS.ErrnoException)?.code ?? '');
}

/** inspect(), with null for a process that does not exist. Exhaustion (EMFILE...) is thrown, never read as "no process". */
export function tryInspect(pid: number): ProcessIdentity | null {
  try {
    return inspect(pid);
  } catch (err) {
    if (isNoProcess(err)) return null;
    throw err;
  }
}

const isZombie = (state: string) => state === 'Z' || state === 'X';

/** Whether two recorded executables are the same file (dev and inode); an unreadable one proves nothing either way. */
export function sameExe(a: ProcessIdentity['exe'], b: ProcessIdentity['exe']): boolean {
  // An exe nobody could read proves nothing either way.
  if (a === null || b === null) return true;
  return a.dev === b.dev && a.ino === b.ino;
}

function sameArgv(a: readonly string[], b: readonly string[]): boolean {
  return a.length === b.length && a.every((v, i) => v === b[i]);
}

const present = (v: unknown) => v !== undefined && v !== null && v !== '';

/**
 * Decides whether `live` is the process `recorded` describes, in this order:
 * rebooted → unprovable (another pid namespace) → gone → unrecorded →
 * reused → mismatch → ok. A record from another boot or another namespace
 * says nothing about whatever runs at its pid here, so those come before
 * "gone"; and a namespace difference is never a mismatch (that path repairs).
 * Pass `live` as null for "no process at that pid"; omit it to inspect now.
 */
export function verify(
  recorded: Partial<ProcessIdentity> & { pid: number },
  live?: ProcessIdentity | null,
): VerifyResult {
  if (recorded === null || typeof recorded !== 'object')
    throw new InvalidArgError('verify() needs a recorded identity');
  assertPid(recorded.pid, 'recorded.pid');
  if (live === undefined) live = tryInspect(recorded.pid);
  if (live && live.pid !== recorded.pid) {
    throw new InvalidArgError(`verify() compares one pid: recorded ${recorded.pid}, live ${live.pid}`);
  }
  const bootId = live ? live.bootId : backend.bootId();
  const pidNs = live ? live.pidNs : backend.ownPidNs();
  if (present(recorded.bootId) && recorded.bootId !== bootId) return { verdict: 'rebooted', field: 'bootId' };
  if (present(recorded.pidNs) && present(pidNs) && recorded.pidNs !== pidNs)
    return { verdict: 'unprovable', field: 'pidNs' };
  // A zombie has exited: it holds its pid but is not the running process any more.
  if (live === null || isZombie(live.state)) return { verdict: 'gone' };
  if (!present(recorded.bootId)) return { verdict: 'unrecorded', field: 'bootId' };
  if (!present(recorded.startTicks)) return { verdict: 'unrecorded', field: 'startTicks' };
  if (!Array.isArray(recorded.argv)) return { verdict: 'unrecorded', field: 'argv' };
  // The pidfs id is unique per boot: where both sides have one it decides,
  // even when a reuse landed in the same clock tick as the original start.
  if (present(recorded.pidfsId) && present(live.pidfsId)) {
    if (recorded.pidfsId !== live.pidfsId) return { verdict: 'reused', field: 'pidfsId' };
  }
  if (recorded.startTicks !== live.startTicks) return { verdict: 'reused', field: 'startTicks' };
  if (recorded.exe !== undefined && !sameExe(recorded.exe, live.exe)) return { verdict: 'mismatch', field: 'exe' };
  if (!sameArgv(recorded.argv, live.argv)) return { verdict: 'mismatch', field: 'argv' };
  return { verdict: 'ok' };
}
