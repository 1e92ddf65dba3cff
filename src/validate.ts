import { readFileSync } from 'node:fs';
import { decodeArg, isByteString } from './bytes.js';
import { InvalidArgError } from './errors.js';

let pidMaxCache: number | undefined;

/** kernel.pid_max, read once; the kernel's absolute ceiling (2^22) where it cannot be read. */
export function pidMax(): number {
  if (pidMaxCache === undefined) {
    try {
      const n = Number(readFileSync('/proc/sys/kernel/pid_max', 'utf8').trim());
      pidMaxCache = Number.isSafeInteger(n) && n > 0 ? n : 4194304;
    } catch {
      pidMaxCache = 4194304;
    }
  }
  return pidMaxCache;
}

/** A pid is an integer in [1, pid_max]. Anything else is ERR_CUSTODY_INVALID_ARG, before any syscall. */
export function assertPid(pid: unknown, what = 'pid'): asserts pid is number {
  if (typeof pid !== 'number' || !Number.isInteger(pid) || pid < 1 || pid > pidMax()) {
    throw new InvalidArgError(`${what} must be an integer from 1 to ${pidMax()}, got ${describe(pid)}`);
  }
}

/** terminate() and friends never aim at init or at the caller itself. */
export function assertSignallable(pid: number): void {
  if (pid === 1) throw new InvalidArgError('refusing to signal pid 1 (init)');
  if (pid === process.pid) throw new InvalidArgError(`refusing to signal this process itself (pid ${pid})`);
}

/**
 * Node clamps a timer past 2^31 - 1 ms to 1 ms: a longer wait would end at
 * once instead of never, so it is refused, as a fraction, NaN or a negative is.
 */
export const MAX_MS = 2 ** 31 - 1;

/** Every `*Ms` option: an integer number of milliseconds from 0 to MAX_MS. */
export function assertDuration(value: unknown, what: string): asserts value is number {
  if (typeof value !== 'number' || !Number.isInteger(value) || value < 0 || value > MAX_MS) {
    throw new InvalidArgError(
      `${what} must be an integer number of milliseconds from 0 to ${MAX_MS}, got ${describe(value)}`,
    );
  }
}

/**
 * An options object holds only the keys custody knows: a misspelt one
 * (`readyTimeout`) would otherwise be a silent no-op in plain JavaScript.
 * `known` is a record so that the compiler keeps it in step with the type.
 */
export function assertKnownKeys<T extends object>(
  value: T,
  known: Readonly<Record<keyof T, true>>,
  what: string,
): void {
  for (const key of Object.keys(value)) {
    if (Object.hasOwn(known, key)) continue;
    const near = closest(key, Object.keys(known));
    throw new InvalidArgError(`${what} has no option \`${key}\`${near ? ` (did you mean \`${near}\`?)` : ''}`);
  }
}

/** The known name a typo most likely meant: the nearest by edit distance, ignoring case, if near enough. */
function closest(key: string, names: string[]): string | undefined {
  const lower = key.toLowerCase();
  let best: string | undefined;
  let bestDistance = Number.POSITIVE_INFINITY;
  for (const name of names) {
    const d = editDistance(lower, name.toLowerCase());
    if (d < bestDistance) [best, bestDistance] = [name, d];
  }
  // Two edits cover a dropped unit (`grace` for `graceMs`) and most slips; a short key gets one, lest any
  // three letters be taken for `cwd` or `uid`.
  const allowed = key.length <= 4 ? 1 : key.length < 12 ? 2 : 3;
  return bestDistance <= allowed ? best : undefined;
}

/** Levenshtein distance, one row at a time (option names are short). */
function editDistance(a: string, b: string): number {
  let row = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const next = [i];
    for (let j = 1; j <= b.length; j++) {
      const substitute = (row[j - 1] ?? 0) + (a[i - 1] === b[j - 1] ? 0 : 1);
      next.push(Math.min(substitute, (row[j] ?? 0) + 1, (next[j - 1] ?? 0) + 1));
    }
    row = next;
  }
  return row[b.length] ?? 0;
}

export function assertStringArray(value: unknown, what: string): asserts value is string[] {
  if (!Array.isArray(value) || !value.every((v) => typeof v === 'string')) {
    throw new InvalidArgError(`${what} must be an array of strings`);
  }
  for (const v of value) {
    if (v.includes('\0')) throw new InvalidArgError(`${what} must not contain NUL bytes`);
    if (!isByteString(v))
      throw new InvalidArgError(
        `${what} holds a lone surrogate that stands for no byte (only U+DC80-U+DCFF escape bytes)`,
      );
  }
}

/**
 * An argv given as strings (custody's lossless form) or bytes (Buffer,
 * Uint8Array): the lossless strings, so that comparing them compares bytes.
 */
export function argvOf(value: unknown, what: string): string[] {
  if (!Array.isArray(value)) throw new InvalidArgError(`${what} must be an array of strings or Buffers`);
  const out = value.map((v) => (v instanceof Uint8Array ? decodeArg(v) : v));
  assertStringArray(out, what);
  return out;
}

export function describe(value: unknown): string {
  if (typeof value === 'string') return JSON.stringify(value.length > 64 ? `${value.slice(0, 64)}…` : value);
  if (typeof value === 'bigint') return `${value}n`;
  if (typeof value === 'number' || typeof value === 'boolean' || value === null || value === undefined)
    return String(value);
  return typeof value;
}

/** An environment: an object of variable names to strings (undefined leaves one out), as the TypeScript type says. */
export function assertEnv(env: unknown, what = 'env'): asserts env is Record<string, string | undefined> {
  if (env === null || typeof env !== 'object' || Array.isArray(env)) {
    throw new InvalidArgError(`${what} must be an object of variable names to strings`);
  }
  for (const [k, v] of Object.entries(env)) {
    if (v === undefined) continue;
    if (typeof v !== 'string') throw new InvalidArgError(`${what}.${k} must be a string, not ${typeof v}`);
    if (k === '' || k.includes('=') || k.includes('\0') || v.includes('\0')) {
      throw new InvalidArgError(`${what} entry ${JSON.stringify(k)} is not a valid variable (no '=', no NUL)`);
    }
    if (!isByteString(v)) throw new InvalidArgError(`${what}.${k} holds a lone surrogate that stands for no byte`);
  }
}

/** A working directory: a non-empty path without NUL (an empty one means nothing the kernel accepts). */
export function assertCwd(cwd: unknown): asserts cwd is string | undefined {
  if (cwd !== undefined && (typeof cwd !== 'string' || cwd === '' || cwd.includes('\0'))) {
    throw new InvalidArgError('cwd must be a non-empty string without NUL bytes');
  }
}

/** An optional boolean option. */
export function assertFlag(value: unknown, what: string): asserts value is boolean | undefined {
  if (value !== undefined && typeof value !== 'boolean') throw new InvalidArgError(`${what} must be a boolean`);
}

/** One string of bytes (as an argument is): non-empty, without NUL, every lone surrogate an escaped byte. */
export function assertString(value: unknown, what: string): asserts value is string {
  if (typeof value !== 'string' || value === '') throw new InvalidArgError(`${what} must be a non-empty string`);
  assertStringArray([value], what);
}
