/**
 * Reading a log that may be written as it is read, and that others may
 * have put something else in place of: the last lines within a byte bound,
 * and a follow in the manner of `tail -F` across the cap's truncation and a
 * launch's rotation. Every open is openRegular's: never through a symlink,
 * never a FIFO or device (ERR_CUSTODY_BAD_LOG), never blocking.
 */
import { closeSync, constants as fsc, fstatSync, lstatSync, readSync, type Stats } from 'node:fs';
import { StringDecoder } from 'node:string_decoder';
import { BadLogError, InvalidArgError } from '../errors.js';
import { sleep } from '../timing.js';
import { assertDuration } from '../validate.js';
import { openRegular } from './files.js';

const CHUNK = 64 * 1024;

function openRead(path: string): { fd: number; size: number } {
  const r = openRegular(path, fsc.O_RDONLY);
  if ('refused' in r) throw new BadLogError(path, r.refused, { cause: r.cause });
  return { fd: r.fd, size: r.st.size };
}

/** The offset where the last `lines` lines of the `window` bytes before `end` begin. */
function lastLinesStart(fd: number, end: number, lines: number, window: number): number {
  const len = Math.min(end, window);
  const buf = Buffer.alloc(len);
  const n = readSync(fd, buf, 0, len, end - len);
  let i = n;
  // A final newline ends the last line; it does not start another.
  if (i > 0 && buf[i - 1] === 0x0a) i--;
  for (let seen = 0; i > 0; i--) {
    if (buf[i - 1] === 0x0a && ++seen === lines) break;
  }
  // Cut by the window, not by a newline: drop the partial first line (unless it is all there is).
  if (i === 0 && len < end) {
    const nl = buf.indexOf(0x0a);
    if (nl >= 0 && nl < n - 1) i = nl + 1;
  }
  return end - len + i;
}

function readRange(fd: number, from: number, to: number): string {
  const buf = Buffer.alloc(to - from);
  const n = readSync(fd, buf, 0, buf.length, from);
  return buf.toString('utf8', 0, n);
}

/**
 * The last `lines` lines of a log (default 10), reading at most `maxBytes`
 * (default 1 MiB) from its end. ENOENT passes through; a path that is not a
 * regular file is ERR_CUSTODY_BAD_LOG, never a hang.
 */
export function readLogTail(path: string, options: { lines?: number; maxBytes?: number } = {}): string {
  const lines = options.lines ?? 10;
  const maxBytes = options.maxBytes ?? 1024 * 1024;
  if (!Number.isSafeInteger(lines) || lines < 0) throw new InvalidArgError('lines must be an integer >= 0');
  if (!Number.isSafeInteger(maxBytes) || maxBytes < 1) throw new InvalidArgError('maxBytes must be a positive integer');
  if (lines === 0) return '';
  const { fd, size } = openRead(path);
  try {
    return readRange(fd, lastLinesStart(fd, size, lines, maxBytes), size);
  } finally {
    closeSync(fd);
  }
}

/** The bound of every output tail an error or an exit event carries. */
export const OUTPUT_TAIL_BYTES = 2048;

/** The output tail an error message carries: the last whole lines within maxBytes, or undefined. */
export function errorTail(path: string, maxBytes: number): string | undefined {
  try {
    return readLogTail(path, { lines: Number.MAX_SAFE_INTEGER, maxBytes }) || undefined;
  } catch {
    return undefined;
  }
}

/**
 * Follows a log as `tail -F` does: yields its last `lines` lines (default
 * 10), then what is appended, until `signal` aborts (then it returns). A
 * truncation (the cap's copy-and-truncate) restarts at the file's start; a
 * rename (the next launch's rotation) finishes the old file and follows the
 * new one at the path. The file must exist when following starts.
 */
export async function* followLog(
  path: string,
  options: { lines?: number; signal?: AbortSignal; pollMs?: number } = {},
): AsyncGenerator<string, void, undefined> {
  const pollMs = options.pollMs ?? 250;
  assertDuration(pollMs, 'pollMs');
  const signal = options.signal;
  const lines = options.lines ?? 10;
  let { fd, size } = openRead(path);
  let offset = lines === 0 ? size : lastLinesStart(fd, size, lines, 1024 * 1024);
  let decoder = new StringDecoder('utf8');
  const buf = Buffer.alloc(CHUNK);
  const drain = function* () {
    for (let n = readSync(fd, buf, 0, CHUNK, offset); n > 0; n = readSync(fd, buf, 0, CHUNK, offset)) {
      offset += n;
      yield decoder.write(buf.subarray(0, n));
    }
  };
  try {
    for (;;) {
      yield* drain();
      if (signal?.aborted) return;
      try {
        await sleep(pollMs, signal);
      } catch {
        return;
      }
      const cur = fstatSync(fd);
      if (cur.size < offset) offset = 0;
      let now: Stats;
      try {
        now = lstatSync(path);
      } catch {
        continue;
      }
      if (now.ino === cur.ino && now.dev === cur.dev) continue;
      yield* drain();
      let next: { fd: number; size: number };
      try {
        next = openRead(path);
      } catch (err) {
        // Renamed away, its successor not created yet: look again next time.
        if ((err as NodeJS.ErrnoException).code === 'ENOENT') continue;
        throw err;
      }
      closeSync(fd);
      ({ fd, size } = next);
      offset = 0;
      decoder = new StringDecoder('utf8');
    }
  } finally {
    closeSync(fd);
  }
}
