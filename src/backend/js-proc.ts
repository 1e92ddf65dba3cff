/**
 * The js backend's /proc readers: what it knows of a process by path, with
 * a vanished process told apart from a read the kernel could not answer.
 * Its own module because inspection, the scans and the exit poller all read
 * through them, and each read here is where a pid reuse must be noticed.
 */
import { readdirSync, readlinkSync, statSync } from 'node:fs';
import { errnoError } from '../errors.js';
import { parseStat, type StatFields } from '../process/proc.js';
import { ownPidNs, readProcBytes, readProcText } from './procview.js';
import type { RawIdentity } from './types.js';

export const esrch = (pid: number, syscall: string) => errnoError('ESRCH', syscall, undefined, `pid ${pid}`);

/** A read that failed because the process is gone, as opposed to one the kernel could not answer (EMFILE, ENOMEM...). */
export const vanished = (err: unknown) => {
  const code = (err as NodeJS.ErrnoException).code;
  return code === 'ENOENT' || code === 'ESRCH';
};

/** A read of pid's /proc; ENOENT/ESRCH of a vanished process become ESRCH, every other error stays what it is. */
function ofProcess<T>(pid: number, read: () => T): T {
  try {
    return read();
  } catch (err) {
    if (vanished(err)) throw esrch(pid, 'read');
    throw err;
  }
}

export const readProc = (path: string, pid: number): Buffer => ofProcess(pid, () => readProcBytes(path));
export const readProcString = (path: string, pid: number): string => ofProcess(pid, () => readProcText(path));

export function readStat(path: string, pid: number): StatFields {
  const stat = parseStat(readProcString(path, pid));
  if (!stat) throw errnoError('EPROTO', 'read', path, 'unparseable');
  return stat;
}

export const isDead = (state: string) => state === 'Z' || state === 'X';

/**
 * A zombie leader whose other threads still run (its main thread called
 * pthread_exit) is a live process whose own cmdline and exe read empty:
 * the /proc dir of a live thread of it, with that thread's state, or null.
 */
export function liveThread(dir: string, pid: number): { dir: string; state: string } | null {
  let tids: string[];
  try {
    tids = readdirSync(`${dir}/task`);
  } catch (err) {
    if (vanished(err)) return null;
    throw err;
  }
  for (const tid of tids) {
    if (tid === String(pid)) continue;
    try {
      const st = parseStat(readProcText(`${dir}/task/${tid}/stat`));
      if (st && !isDead(st.state)) return { dir: `${dir}/task/${tid}`, state: st.state };
    } catch (err) {
      if (!vanished(err)) throw err;
    }
  }
  return null;
}

/**
 * The pid namespace a process lives in: the inode of its ns/pid link. The
 * link takes ptrace read access (EACCES/EPERM for another uid's process or
 * one that is not dumpable); there, status's NSpid lists one pid per
 * namespace from that of the /proc read (ours: assertOwnProc) down to the
 * process's own, so a single one means ours. null where it cannot be told.
 */
export function readPidNs(dir: string, status: string): number | null {
  try {
    // The link's text is the inode ("pid:[4026531836]"): cheaper than a stat through it.
    const ino = Number(/^pid:\[(\d+)\]$/.exec(readlinkSync(`${dir}/ns/pid`))?.[1]);
    return Number.isSafeInteger(ino) && ino > 0 ? ino : null;
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code !== 'EACCES' && code !== 'EPERM' && code !== 'ENOENT') throw err;
  }
  const line = /^NSpid:(.*)$/m.exec(status);
  return line?.[1]?.trim().split(/\s+/).length === 1 ? ownPidNs() : null;
}

/** The executable's dev/ino; null for a kernel thread (ENOENT) or one we may not look at (EACCES, EPERM). */
export function readExe(dir: string): RawIdentity['exe'] {
  try {
    const st = statSync(`${dir}/exe`);
    return { dev: st.dev, ino: st.ino };
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT' || code === 'EACCES' || code === 'EPERM') return null;
    throw err;
  }
}

/** The start ticks of a live process; null when there is none or it has exited (a zombie with no live thread). */
export function readStartTicks(pid: number, procRoot: string): number | null {
  try {
    const st = parseStat(readProcText(`${procRoot}/${pid}/stat`));
    if (!st) return null;
    if (isDead(st.state) && liveThread(`${procRoot}/${pid}`, pid) === null) return null;
    return st.startTicks;
  } catch (err) {
    // Gone is an answer; EMFILE or ENOMEM is not: taken for one, a live process would count as exited.
    if (vanished(err)) return null;
    throw err;
  }
}
