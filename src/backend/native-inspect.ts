/**
 * What the addon's inspection gives, made the backend's: its flat row as a
 * RawIdentity, its failure as the error custody means (a thread id is not a
 * process). Shared by the one-pid and the batched pinned reads.
 */
import { readFileSync } from 'node:fs';
import { NotAProcessError } from '../errors.js';
import { parseStatusField } from '../process/proc.js';
import type { AddonInspect } from './addon.js';
import { ownPidNs } from './procview.js';
import type { RawIdentity } from './types.js';

/** For the message only: whose thread a TID is. */
function tgidOf(pid: number, procRoot = '/proc'): number | null {
  try {
    return parseStatusField(readFileSync(`${procRoot}/${pid}/status`, 'latin1'), 'Tgid');
  } catch {
    return null;
  }
}

export function fromAddon(r: AddonInspect): RawIdentity {
  return {
    state: r[0],
    ppid: r[1],
    startTicks: r[2],
    uid: r[3],
    exe: r[4] < 0 ? null : { dev: r[4], ino: r[5] },
    pidfsId: r[6],
    session: r[8],
    // 0: the /proc's own namespace, whose inode the addon did not read (the reader's: assertOwnProc).
    processPidNs: r[9] > 0 ? r[9] : r[9] === 0 ? ownPidNs() : null,
    argv: r.slice(10) as string[],
  };
}

/**
 * What a failed inspection of pid throws: the addon's errno error, except
 * that pidfd_open refuses a thread that is not a thread-group leader
 * (EINVAL before Linux 6.9, ENOENT since, where PIDFD_THREAD can name
 * threads), which is a TID, not a process.
 */
export function inspectFailure(pid: number, procRoot: string | undefined, err: Error): Error {
  const { code, syscall } = err as NodeJS.ErrnoException;
  if ((code === 'EINVAL' || code === 'ENOENT') && syscall === 'pidfd_open') {
    const tgid = tgidOf(pid, procRoot);
    if (tgid !== null && tgid !== pid) return new NotAProcessError(pid, tgid);
  }
  return err;
}
