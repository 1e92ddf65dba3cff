/**
 * Identity: inspect() reads what proves a process is the one we mean;
 * verify() compares a record with the live process, in the order of the
 * design's table. Nothing here signals anything.
 */
import { backend } from './backend/index.js';
import type { RawIdentity } from './backend/types.js';
import { InvalidArgError } from './errors.js';
import type { ProcessIdentity, VerifyResult } from './types.js';
import { assertPid } from './validate.js';

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
    state: raw.state,
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

/** inspect(), with null for a process that does not exist. */
export function tryInspect(pid: number): ProcessIdentity | null {
  try {
    return inspect(pid);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ESRCH' || (err as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw err;
  }
}

const isZombie = (state: string) => state === 'Z' || state === 'X';

function sameExe(a: ProcessIdentity['exe'], b: ProcessIdentity['exe']): boolean {
  // An exe nobody could read proves nothing either way.
  if (a === null || b === null) return true;
  return a.dev === b.dev && a.ino === b.ino;
}

function sameArgv(a: readonly string[], b: readonly string[]): boolean {
  return a.length === b.length && a.every((v, i) => v === b[i]);
}

const present = (v: unknown) => v !== undefined && v !== null && v !== '';

/**
 * Decides whether `live` is the process `recorded` describes:
 * gone → rebooted → unrecorded → reused → mismatch → ok, in that order.
 * Pass `live` as null for "no process at that pid"; omit it to inspect now.
 */
export function verify(recorded: Partial<ProcessIdentity> & { pid: number }, live?: ProcessIdentity | null): VerifyResult {
  if (recorded === null || typeof recorded !== 'object') throw new InvalidArgError('verify() needs a recorded identity');
  assertPid(recorded.pid, 'recorded.pid');
  if (live === undefined) live = tryInspect(recorded.pid);
  // A zombie has exited: it holds its pid but is not the running process any more.
  if (live === null || isZombie(live.state)) return { verdict: 'gone' };
  if (live.pid !== recorded.pid) {
    throw new InvalidArgError(`verify() compares one pid: recorded ${recorded.pid}, live ${live.pid}`);
  }
  if (present(recorded.bootId) && recorded.bootId !== live.bootId) return { verdict: 'rebooted', field: 'bootId' };
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
