/**
 * Pidfiles, read as untrusted input: whatever wrote one (a daemon, its
 * launcher, or someone racing them) decides what is at the path. So the path
 * is never followed through a symlink, never opened so that a FIFO or a device
 * can block the event loop, never read past a pid's size, and its text is
 * parsed strictly and range-checked: "4294967296" + X is refused, never
 * wrapped to pid X.
 */
import { closeSync, constants as fsc, readSync } from 'node:fs';
import { BadPidfileError } from '../errors.js';
import { openRegular } from '../state/files.js';
import { pidMax } from '../validate.js';

/** "4194304\n" is 8 bytes; anything past this bound is not a pidfile. */
export const PIDFILE_MAX_BYTES = 64;

/** Whether n can be the pid of a process custody launched: an integer in [2, pid_max] (1 is init). */
export function isTargetPid(n: unknown): n is number {
  return typeof n === 'number' && Number.isSafeInteger(n) && n >= 2 && n <= pidMax();
}

/**
 * Strict pidfile text: decimal digits and at most one trailing newline.
 * Returns null for an empty file (not written yet); throws for anything else
 * that is not a pid in range.
 */
export function parsePidfile(text: string, path: string): number | null {
  if (text === '') return null;
  if (!/^[0-9]+\n?$/.test(text)) {
    throw new BadPidfileError(path, `does not hold a decimal pid: ${JSON.stringify(text.slice(0, 32))}`);
  }
  const digits = text.trimEnd();
  // More digits than any pid_max has can only be out of range (and Number() of them may round).
  const n = digits.length > 10 ? Number.POSITIVE_INFINITY : Number(digits);
  if (!isTargetPid(n)) throw new BadPidfileError(path, `pid ${digits.slice(0, 24)} is out of range (2 to ${pidMax()})`);
  return n;
}

/**
 * Reads a pidfile: its pid, or null while it does not exist or is empty.
 * Refuses (ERR_CUSTODY_BAD_PIDFILE) a symlink, a FIFO, a device, a file
 * swapped while it was opened, one larger than PIDFILE_MAX_BYTES, and text
 * that is not a pid in range. Never blocks.
 */
export function readPidfile(path: string): number | null {
  let opened: ReturnType<typeof openRegular>;
  try {
    opened = openRegular(path, fsc.O_RDONLY);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return null;
    throw new BadPidfileError(path, `cannot be read (${(err as NodeJS.ErrnoException).code})`, { cause: err });
  }
  if ('refused' in opened) throw new BadPidfileError(path, opened.refused, { cause: opened.cause });
  const { fd, st } = opened;
  try {
    if (st.size > PIDFILE_MAX_BYTES) {
      throw new BadPidfileError(path, `is ${st.size} bytes; a pidfile holds at most ${PIDFILE_MAX_BYTES}`);
    }
    // One byte past the bound tells a file that grew after the fstat.
    const buf = Buffer.alloc(PIDFILE_MAX_BYTES + 1);
    const n = readSync(fd, buf, 0, buf.length, 0);
    if (n > PIDFILE_MAX_BYTES) throw new BadPidfileError(path, `holds more than ${PIDFILE_MAX_BYTES} bytes`);
    return parsePidfile(buf.toString('latin1', 0, n), path);
  } finally {
    closeSync(fd);
  }
}
