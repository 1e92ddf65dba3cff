/**
 * sweep(): ends orphans by exact argv. A process matches only when its argv
 * equals the given argv token for token (`avr-ubuntu` never matches
 * `avr-ubuntu-2`); it is pinned and re-checked under its pidfd before any
 * signal; pid 1, the caller and the excluded (tracked) pids are never
 * touched. TERM, then KILL after graceMs for what remains, all within
 * deadlineMs. A process that exits between the scan and the signal is success.
 */
import { statSync } from 'node:fs';
import { basename } from 'node:path';
import { backend } from '../backend/index.js';
import { InvalidArgError } from '../errors.js';
import { protectedPid } from './ownership.js';
import { type Pinned, pin } from './pin.js';
import { TIMED_OUT, within } from '../timing.js';
import type { ProcessIdentity } from '../types.js';
import { argvOf, assertDuration } from '../validate.js';

/** Options of `sweep()` and `supervisor.sweep()`. */
export interface SweepOptions {
  /**
   * The exact argv, argv[0] included, compared byte for byte: each element a
   * string (custody's lossless form, as inspect() reports argv) or the bytes
   * themselves (a Buffer), so an argv that is not UTF-8 can be named exactly.
   */
  argv: Array<string | Uint8Array>;
  /** A basename matches argv[0]'s basename; a path must also be /proc/<pid>/exe (same device and inode). */
  executable?: string;
  /** Only processes of this real uid. Default: ours. */
  uid?: number;
  /** Wait after SIGTERM before SIGKILL. Default 200. */
  graceMs?: number;
  /** Bound of the whole sweep. Default 2000. */
  deadlineMs?: number;
  /** Report what would be ended; signal nothing. */
  dryRun?: boolean;
  /** Aborts the sweep: what was already signalled stays signalled. */
  signal?: AbortSignal;
  /** Pids never to touch (a supervisor passes its tracked instances). */
  exclude?: Iterable<number>;
  /**
   * @internal Test seam: runs after every match is pinned and before the
   * first signal, the one moment a test cannot otherwise reach (a match
   * exiting between the scan and the signal).
   */
  beforeSignal?: (matched: ProcessIdentity[]) => Promise<void> | void;
}

/** What a sweep found and did: the matched identities, and which ended at SIGTERM, at SIGKILL, or survived. */
export interface SweepResult {
  /** Every process that matched, proven under its pidfd. */
  matched: ProcessIdentity[];
  /** Ended by SIGTERM (or already gone by the time of the signal). */
  terminated: ProcessIdentity[];
  /** Needed SIGKILL. */
  killed: ProcessIdentity[];
  /** Still alive when the deadline passed. */
  survivors: ProcessIdentity[];
}

function sameArgv(a: readonly string[], b: readonly string[]): boolean {
  return a.length === b.length && a.every((v, i) => v === b[i]);
}

/** Validates a sweep call; returns its argv as lossless strings. */
export function validateSweep(options: SweepOptions): string[] {
  if (!options || typeof options !== 'object') throw new InvalidArgError('sweep() needs { argv }');
  const argv = argvOf(options.argv, 'argv');
  if (argv.length === 0 || argv[0] === '') throw new InvalidArgError('argv must name at least the program (argv[0])');
  if (
    options.executable !== undefined &&
    (typeof options.executable !== 'string' || options.executable === '' || options.executable.includes('\0'))
  ) {
    throw new InvalidArgError('executable must be a non-empty string');
  }
  if (options.uid !== undefined && (!Number.isInteger(options.uid) || options.uid < 0))
    throw new InvalidArgError('uid must be a non-negative integer');
  if (options.graceMs !== undefined) assertDuration(options.graceMs, 'graceMs');
  if (options.deadlineMs !== undefined) assertDuration(options.deadlineMs, 'deadlineMs');
  return argv;
}

/** Ends orphans by exact argv: every process whose argv equals `argv` token for token, ours, never pid 1, the caller or its ancestors, re-checked under its pidfd before any signal; SIGTERM, then SIGKILL after `graceMs`, within `deadlineMs`. */
export async function sweep(options: SweepOptions): Promise<SweepResult> {
  const argv = validateSweep(options);
  const uid = options.uid ?? process.getuid?.() ?? -1;
  const graceMs = options.graceMs ?? 200;
  const deadlineMs = options.deadlineMs ?? 2000;
  const started = Date.now();
  const exclude = new Set(options.exclude ?? []);
  let exe: { dev: number; ino: number } | null = null;
  let exeBase: string | null = null;
  if (options.executable !== undefined) {
    if (options.executable.includes('/')) {
      const st = statSync(options.executable);
      exe = { dev: st.dev, ino: st.ino };
    } else exeBase = options.executable;
  }
  // A scan row has no exe (undefined): that is compared once the process is pinned and read.
  const matches = (p: { pid: number; argv: string[]; uid: number; state?: string; exe?: ProcessIdentity['exe'] }) => {
    // Never pid 1, ourselves or an ancestor (`custody sweep --exact -- bash` typed in bash).
    if (protectedPid(p.pid) || exclude.has(p.pid)) return false;
    if (p.state === 'Z' || p.uid !== uid || !sameArgv(p.argv, argv)) return false;
    if (exeBase !== null && basename(p.argv[0] ?? '') !== exeBase) return false;
    if (exe !== null && p.exe !== undefined && !(p.exe && p.exe.dev === exe.dev && p.exe.ino === exe.ino)) return false;
    return true;
  };

  const pinned: Pinned[] = [];
  // Argv first: only cmdline is read for every process (compared as bytes);
  // everything else, and the real uid, only for the candidates, under a pin.
  for (const pid of await backend.matchArgv(argv)) {
    if (!matches({ pid, argv, uid })) continue;
    // Exited since the scan: null; anything else (EMFILE) is no answer and is thrown.
    const p = pin(pid);
    if (!p) continue;
    // The scan proves nothing; the pinned read does.
    if (matches(p.identity)) pinned.push(p);
    else p.handle.close();
  }
  const result: SweepResult = { matched: pinned.map((p) => p.identity), terminated: [], killed: [], survivors: [] };
  try {
    if (options.dryRun || pinned.length === 0) return result;
    await options.beforeSignal?.(result.matched);
    for (const p of pinned) p.handle.signal('SIGTERM');
    const remaining = () => pinned.filter((p) => !p.handle.hasExited);
    const waitAll = (ps: typeof pinned, ms: number) =>
      within(Promise.all(ps.map((p) => p.handle.gone)), ms, options.signal);
    await waitAll(pinned, Math.min(graceMs, Math.max(0, deadlineMs - (Date.now() - started))));
    const afterTerm = remaining();
    for (const p of pinned) if (!afterTerm.includes(p)) result.terminated.push(p.identity);
    if (afterTerm.length === 0) return result;
    for (const p of afterTerm) p.handle.signal('SIGKILL');
    const r = await waitAll(afterTerm, Math.max(0, deadlineMs - (Date.now() - started)));
    for (const p of afterTerm) {
      if (p.handle.hasExited || (r === TIMED_OUT && !p.handle.isAlive())) result.killed.push(p.identity);
      else result.survivors.push(p.identity);
    }
    return result;
  } finally {
    for (const p of pinned) p.handle.close();
  }
}
