/**
 * Whose processes a /proc describes. Pids and pidfds are numbered in our
 * pid namespace; a /proc mounted for another namespace (`unshare --pid
 * --fork` without `--mount-proc`) numbers the same processes differently, so
 * /proc/<pid> would be some other process. `<root>/self` resolves to our pid
 * as that /proc numbers it: equal to process.pid only when it is ours.
 */
import { existsSync, readFileSync, readlinkSync, statSync } from 'node:fs';
import { ForeignProcError } from '../errors.js';
import { parseStat, type StatFields } from '../proc.js';

let pidNsCache: number | null | undefined;

/** The inode of our pid namespace (/proc/self/ns/pid): a process never changes its own. null where it cannot be read. */
export function ownPidNs(): number | null {
  if (pidNsCache === undefined) {
    try {
      pidNsCache = statSync('/proc/self/ns/pid').ino;
    } catch {
      pidNsCache = null;
    }
  }
  return pidNsCache;
}

/** Throws ForeignProcError unless `<procRoot>/self` is this process. Cheap (one readlink): run before every read of /proc. */
export function assertOwnProc(procRoot = '/proc'): void {
  let self: string;
  try {
    self = readlinkSync(`${procRoot}/self`);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
    // A /proc of a namespace we are not in has no self for us; no /proc at
    // all is the caller's ENOENT to report, not a namespace question.
    if (existsSync(`${procRoot}/stat`)) throw new ForeignProcError(procRoot, 'absent');
    return;
  }
  if (self !== String(process.pid)) throw new ForeignProcError(procRoot, self);
}

/** /proc/<pid>/stat parsed, or null for no such process (both backends: a plain read is all either needs). */
export function readStatOf(pid: number, procRoot = '/proc'): StatFields | null {
  assertOwnProc(procRoot);
  try {
    return parseStat(readFileSync(`${procRoot}/${pid}/stat`, 'latin1'));
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT' || code === 'ESRCH') return null;
    throw err;
  }
}
