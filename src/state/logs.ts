/**
 * Instance logs: without stdio options, a launch's stdout and stderr go to
 * <stateDir>/.logs/<id>/stdout.log and stderr.log. The files live outside
 * the instance's manifest dir, so stop and the state-dir rules remove the
 * instance and keep its logs (post-mortem); a daemon holds a file, never a
 * pipe to us, so it never gets EPIPE when the agent restarts; and the
 * stderr tail of every failed launch is read back from the file.
 *
 * The cap: each launch starts fresh files (the previous run's become `.1`,
 * up to `keep` generations); while a supervisor holds the state dir it checks
 * the running instances' files every LOG_CHECK_MS and, past maxBytes, copies
 * the last maxBytes to `.1` and truncates the file in place (the daemon's fd
 * is O_APPEND, so its next write lands at the new end). Between two checks,
 * and while no supervisor runs, a daemon can write past the cap; the next
 * launch, adoption or check brings it back. Lines written between the copy
 * and the truncation are lost. Where the copy cannot be made (a full disk),
 * the last maxBytes are kept at the start of the file itself instead, and
 * the bytes dropped are reported (cutInPlace). Logs of an id with no state
 * left are removed once untouched for LOG_RETENTION_MS.
 */
import {
  closeSync,
  constants as fsc,
  fstat,
  ftruncate,
  lstatSync,
  mkdirSync,
  read,
  readdirSync,
  renameSync,
  rmSync,
  unlinkSync,
  write,
} from 'node:fs';
import { join } from 'node:path';
import { lstat as lstatAsync } from 'node:fs/promises';
import { promisify } from 'node:util';
import { BadLogError, InvalidArgError } from '../errors.js';
import { fileKind, openRegular } from './files.js';
import { LOGS } from './statedir.js';
import { assertId } from './manifest.js';
import { loopSlices } from '../timing.js';

// Reading a log (a tail, a follow) is log-read.ts's; exported here too, where the logs' other names are.
export { errorTail, followLog, OUTPUT_TAIL_BYTES, readLogTail } from './log-read.js';

/** How an instance's stdout and stderr are kept in its log files (LaunchSpec.logs). */
export interface LogOptions {
  /** A file past this size is rotated. Default 8 MiB. */
  maxBytes?: number;
  /** Rotated generations kept (`.1`, `.2`, ...). Default 1; 0 keeps none. */
  keep?: number;
}

/** The log files of an instance, from `logPaths(stateDir, id)`. */
export interface LogFiles {
  /** The instance's log dir: <stateDir>/.logs/<id>. */
  dir: string;
  /** Its stdout log (stdout.log; the previous run's is stdout.log.1). */
  stdout: string;
  /** Its stderr log (stderr.log; the previous run's is stderr.log.1). */
  stderr: string;
}

export const LOG_MAX_BYTES = 8 * 1024 * 1024;
export const LOG_KEEP = 1;
/** How often a supervisor checks the logs of the instances it runs. */
export const LOG_CHECK_MS = 10_000;
/** Logs of an id with no state left go once untouched this long. */
export const LOG_RETENTION_MS = 7 * 24 * 3600 * 1000;
const PRUNE_EVERY_MS = 3600 * 1000;
const MAX_KEEP = 9;
const LOGS_DIR = LOGS;
/** What a rotation's copy moves per read and write. */
const COPY_CHUNK = 1024 * 1024;

/** One object for every instance with the default limits (most of them), not one each. */
const DEFAULT_LIMITS: Readonly<Required<LogOptions>> = Object.freeze({ maxBytes: LOG_MAX_BYTES, keep: LOG_KEEP });

/** The caps a launch's `logs` option means; the manifest records them, so that they outlive the agent. */
export function logLimits(options: LogOptions | undefined): Readonly<Required<LogOptions>> {
  return options?.maxBytes === undefined && options?.keep === undefined
    ? DEFAULT_LIMITS
    : { maxBytes: options.maxBytes ?? LOG_MAX_BYTES, keep: options.keep ?? LOG_KEEP };
}

const APPEND = fsc.O_WRONLY | fsc.O_APPEND | fsc.O_CREAT;

export function assertLogOptions(value: unknown): asserts value is false | LogOptions | undefined {
  if (value === undefined || value === false) return;
  if (!value || typeof value !== 'object') throw new InvalidArgError('logs must be false or { maxBytes?, keep? }');
  const { maxBytes, keep } = value as LogOptions;
  if (maxBytes !== undefined && !(Number.isSafeInteger(maxBytes) && maxBytes >= 1)) {
    throw new InvalidArgError('logs.maxBytes must be a positive integer');
  }
  if (keep !== undefined && !(Number.isInteger(keep) && keep >= 0 && keep <= MAX_KEEP)) {
    throw new InvalidArgError(`logs.keep must be an integer from 0 to ${MAX_KEEP}`);
  }
}

/** Where an instance's logs are (whether or not they exist yet). */
export function logPaths(stateDir: string, id: string): LogFiles {
  assertId(id);
  const dir = join(stateDir, LOGS_DIR, id);
  return { dir, stdout: join(dir, 'stdout.log'), stderr: join(dir, 'stderr.log') };
}

/**
 * Opens a file to append to (created 0600), refusing a symlink, a FIFO, a
 * device or a socket at the path (ERR_CUSTODY_BAD_LOG): a FIFO would hang
 * or starve the writer, a symlink would send a daemon's output anywhere.
 */
export function openAppend(path: string): number {
  const r = openRegular(path, APPEND, 0o600);
  if ('refused' in r) throw new BadLogError(path, r.refused, { cause: r.cause });
  return r.fd;
}

/**
 * The one rule for the logs' dirs, written (a launch) and read (`custody
 * logs`) alike: a dir, not a symlink, that only we can write. Inside a state
 * dir checked the same way, nothing else can then swap what is below it.
 */
function assertPrivateDir(path: string, use: string): void {
  const st = lstatSync(path);
  if (!st.isDirectory()) throw new BadLogError(path, `is ${fileKind(st)}, not a directory`);
  const uid = process.getuid?.();
  if ((uid !== undefined && st.uid !== uid) || st.mode & 0o022) {
    const mode = (st.mode & 0o777).toString(8);
    throw new BadLogError(path, `belongs to uid ${st.uid} with mode ${mode}; refusing to ${use} logs there`);
  }
}

/** A dir only we can write, not reached through a symlink: created 0700, or checked as found. */
function privateDir(path: string): void {
  try {
    mkdirSync(path, { mode: 0o700 });
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
  }
  assertPrivateDir(path, 'write');
}

/**
 * For a reader: whether the instance has logs, its dirs checked as a launch
 * checks them before writing (ERR_CUSTODY_BAD_LOG for a symlink or a dir
 * another uid could change); false when either dir is absent. The files are
 * then opened as readLogTail and followLog do, never through a symlink.
 */
export function hasLogDirs(stateDir: string, id: string): boolean {
  const { dir } = logPaths(stateDir, id);
  try {
    for (const each of [join(stateDir, LOGS_DIR), dir]) assertPrivateDir(each, 'read');
    return true;
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return false;
    throw err;
  }
}

function ignoreAbsent(fn: () => void): void {
  try {
    fn();
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT') throw err;
  }
}

/** The copy a rotation writes before renaming it to `.1`; removed whenever it is not renamed. */
const tempOf = (file: string) => `${file}.1.tmp`;

function removeTemp(file: string): void {
  try {
    unlinkSync(tempOf(file));
  } catch {
    // absent, or already renamed: nothing is left either way
  }
}

/** Makes room for a new `.1`: `.1` becomes `.2` and so on up to keep; generations past keep go. */
function shiftGenerations(file: string, keep: number): void {
  for (let k = MAX_KEEP; k > Math.max(keep - 1, 0); k--) ignoreAbsent(() => unlinkSync(`${file}.${k}`));
  for (let k = keep - 1; k >= 1; k--) ignoreAbsent(() => renameSync(`${file}.${k}`, `${file}.${k + 1}`));
}

/** At a launch: the previous run's file becomes `.1` (with keep 0 it goes), and a copy an agent that died mid-cap left goes. */
function rotateByRename(file: string, keep: number): void {
  removeTemp(file);
  shiftGenerations(file, keep);
  ignoreAbsent(() => (keep === 0 ? unlinkSync(file) : renameSync(file, `${file}.1`)));
}

/** Whether a log is a regular file over its cap: one lstat, never an open (a FIFO put there must not block). */
function overCap(file: string, maxBytes: number): boolean {
  try {
    const st = lstatSync(file, { throwIfNoEntry: false });
    return st?.isFile() === true && st.size > maxBytes;
  } catch {
    return false; // EACCES and the like: capLog would leave it alone too
  }
}

const readAsync = promisify(read);
const writeAsync = promisify(write);
const truncateAsync = promisify(ftruncate);
const fstatAsync = promisify(fstat);

/**
 * What capLog did: nothing (under its cap, or not a regular file to touch),
 * the rotation, or a cut in place because the rotated copy could not be
 * made: `kept` bytes (the log's last, or none) stay at the start of the
 * file, `dropped` went, and `why` says why the copy failed.
 */
export type CapResult =
  | { done: 'nothing' }
  | { done: 'rotated' }
  | { done: 'cut'; kept: number; dropped: number; why: Error; keepFailed?: Error };

const NOTHING: CapResult = Object.freeze({ done: 'nothing' });
const ROTATED: CapResult = Object.freeze({ done: 'rotated' });

/** Copies [from, from + length) of `fd` to the start of `out`, COPY_CHUNK bytes at a time, off the loop. */
async function copyRange(fd: number, from: number, length: number, out: number, positional: boolean): Promise<number> {
  const buf = Buffer.alloc(Math.min(COPY_CHUNK, length));
  let done = 0;
  while (done < length) {
    const { bytesRead } = await readAsync(fd, buf, 0, Math.min(buf.length, length - done), from + done);
    if (bytesRead === 0) break;
    await writeAsync(out, buf, 0, bytesRead, positional ? done : null);
    done += bytesRead;
  }
  return done;
}

/** The last maxBytes of the first `size` bytes of `fd`, as `file.1` (through a temp file, never left behind). */
async function copyTail(fd: number, size: number, maxBytes: number, file: string): Promise<void> {
  const tmp = tempOf(file);
  try {
    ignoreAbsent(() => unlinkSync(tmp));
    const out = openAppend(tmp);
    try {
      await copyRange(fd, size - maxBytes, maxBytes, out, false);
    } finally {
      closeSync(out);
    }
    renameSync(tmp, `${file}.1`);
  } catch (err) {
    removeTemp(file);
    throw err;
  }
}

/**
 * The cap when its copy cannot be made (ENOSPC, EDQUOT, EIO...): the last
 * maxBytes move to the start of the file itself and the rest is cut off.
 * Rewriting bytes the file already holds needs no new blocks on tmpfs, ext4
 * or xfs, so it frees space on a full disk, and the newest lines (what an
 * operator reads first when a daemon failed) survive, as a rotation would
 * have kept them in `.1`. Where even that fails (a copy-on-write file
 * system, an I/O error) the file is cut to nothing: a log that stays full
 * would keep the disk full. The destination lies before the source, so a
 * forward copy never overwrites bytes it has yet to read.
 */
async function cutInPlace(fd: number, size: number, maxBytes: number, why: Error): Promise<CapResult> {
  let kept = 0;
  let keepFailed: Error | undefined;
  try {
    kept = await copyRange(fd, size - maxBytes, maxBytes, fd, true);
  } catch (err) {
    keepFailed = err as Error;
  }
  // A partial copy is an older stretch, not the end of the log: none rather than that.
  if (keepFailed || kept < maxBytes) kept = 0;
  // What the daemon appended meanwhile goes too: counted, as the bytes dropped.
  const end = (await fstatAsync(fd)).size;
  await truncateAsync(fd, kept);
  return { done: 'cut', kept, dropped: Math.max(end - kept, 0), why, ...(keepFailed ? { keepFailed } : {}) };
}

/**
 * Brings a log a daemon still appends to back under maxBytes: its last
 * maxBytes go to `.1` (older generations shifted), then it is truncated in
 * place; where that copy cannot be made, cutInPlace. Off the event loop; a
 * path that is not a regular file is left alone. A log under its cap costs
 * one lstat on the threadpool (a supervisor's periodic check has already
 * lstat'ed it on the loop: see InstanceLogs).
 */
export async function capLog(file: string, maxBytes: number, keep: number): Promise<CapResult> {
  try {
    const before = await lstatAsync(file);
    if (!before.isFile() || before.size <= maxBytes) return NOTHING;
  } catch {
    return NOTHING;
  }
  let r: ReturnType<typeof openRegular>;
  try {
    r = openRegular(file, fsc.O_RDWR);
  } catch {
    return NOTHING;
  }
  if ('refused' in r) return NOTHING;
  const { fd, st } = r;
  try {
    if (st.size <= maxBytes) return NOTHING;
    try {
      shiftGenerations(file, keep);
      if (keep > 0) await copyTail(fd, st.size, maxBytes, file);
    } catch (err) {
      return await cutInPlace(fd, st.size, maxBytes, err as Error);
    }
    await truncateAsync(fd, 0);
    return ROTATED;
  } finally {
    closeSync(fd);
  }
}

/** The warning a cut in place is reported with: what was kept, how many bytes went, and why. */
export function describeCut(file: string, cut: Extract<CapResult, { done: 'cut' }>): string {
  const head = `${file} over its cap: its last bytes could not be copied to ${file}.1 (${cut.why.message})`;
  return cut.kept > 0
    ? `${head}; kept its last ${cut.kept} bytes in place, dropped ${cut.dropped} bytes`
    : `${head}, nor kept in place (${cut.keepFailed?.message ?? 'short read'}); truncated, dropped ${cut.dropped} bytes`;
}

/** Removes the logs of ids not in `live` that nothing has written for retentionMs. */
export function pruneLogs(
  stateDir: string,
  live: ReadonlySet<string>,
  retentionMs = LOG_RETENTION_MS,
  now = Date.now(),
): string[] {
  const root = join(stateDir, LOGS_DIR);
  let names: string[];
  try {
    names = readdirSync(root);
  } catch {
    return [];
  }
  const removed: string[] = [];
  for (const id of names) {
    if (live.has(id)) continue;
    const dir = join(root, id);
    try {
      const st = lstatSync(dir);
      if (!st.isDirectory()) continue;
      let newest = st.mtimeMs;
      for (const f of readdirSync(dir)) newest = Math.max(newest, lstatSync(join(dir, f)).mtimeMs);
      if (now - newest < retentionMs) continue;
      // rmSync never follows a symlink inside the dir; it removes the link.
      rmSync(dir, { recursive: true, force: true });
      removed.push(id);
    } catch {
      // changed under us: the next prune looks again
    }
  }
  return removed;
}

/** Where the supervisor's log keeping reports: failures as warnings, pruned logs as clean events. */
export type LogReport = (type: 'warning' | 'clean', fields: { id: string; message: string; path?: string }) => void;

/**
 * A supervisor's side of the logs: prepares them at each launch (private
 * dirs, the previous run's files rotated away), keeps the running
 * instances' files under their cap, and prunes the logs nothing owns.
 */
export class InstanceLogs {
  readonly stateDir: string;
  readonly checkMs: number;
  /** Limits of launches prepared and not yet watched (null: logs: false). */
  #limits = new Map<string, Readonly<Required<LogOptions>> | null>();
  /** Running instances whose logs are checked, and their limits. */
  #watched = new Map<string, Readonly<Required<LogOptions>>>();
  /** Instances watched this turn, waiting for their first check; and that check, once scheduled. */
  #firstChecks: Array<[string, Readonly<Required<LogOptions>>]> = [];
  #firstCheck: Promise<void> | null = null;
  /** First checks wait for this: resolved, or pending while holdFirstChecks() holds. */
  #unheld: Promise<void> = Promise.resolve();
  #holds = 0;
  #releaseHolds: (() => void) | null = null;
  #busy = new Set<string>();
  #timer: NodeJS.Timeout | undefined;
  #lastPrune = 0;
  #report: LogReport;
  #live: () => Iterable<string>;

  constructor(stateDir: string, options: { report: LogReport; live: () => Iterable<string>; checkMs?: number }) {
    this.stateDir = stateDir;
    this.checkMs = options.checkMs ?? LOG_CHECK_MS;
    this.#report = options.report;
    this.#live = options.live;
  }

  /**
   * Before a launch: the files the launch writes to (null with `logs:
   * false`). The previous run's files become `.1`, so every attempt's
   * stderr tail is its own.
   */
  prepare(id: string, options: LogOptions | false | undefined, rotate = true): LogFiles | null {
    if (options === false) {
      this.#limits.set(id, null);
      return null;
    }
    const limits = logLimits(options);
    const files = logPaths(this.stateDir, id);
    privateDir(join(this.stateDir, LOGS_DIR));
    privateDir(files.dir);
    if (rotate) {
      rotateByRename(files.stdout, limits.keep);
      rotateByRename(files.stderr, limits.keep);
    }
    this.#limits.set(id, limits);
    this.#maybePrune(id);
    return files;
  }

  /**
   * While the instance runs (until unwatch()), its logs are kept under their
   * cap: checked at once (an adopted daemon may have written past it while
   * no supervisor ran), then every checkMs. Returns the first check.
   * `recorded`: the caps its manifest records (an adopted instance: no
   * prepare() in this process); absent in a manifest older than version 3,
   * which means custody's defaults; null where its output was not logged.
   */
  watch(id: string, recorded?: LogOptions | null): Promise<void> {
    const prepared = this.#limits.get(id);
    this.#limits.delete(id);
    const limits = prepared !== undefined ? prepared : recorded === null ? null : logLimits(recorded);
    if (limits === null) return Promise.resolve();
    this.#watched.set(id, limits);
    if (!this.#timer) {
      this.#timer = setInterval(() => void this.#check([...this.#watched]), this.checkMs);
      this.#timer.unref();
    }
    // The first check (an adopted daemon may have written past its cap while no supervisor ran) of every
    // instance watched in one turn runs once, after that turn, one file at a time: recovering thousands of
    // instances must neither read their logs inside open() nor queue thousands of stats on the threadpool.
    this.#firstChecks.push([id, limits]);
    this.#firstCheck ??= this.#unheld
      .then(() => new Promise<void>((resolve) => setImmediate(resolve)))
      .then(() => {
        const batch = this.#firstChecks.splice(0).filter(([each, l]) => this.#watched.get(each) === l);
        this.#firstCheck = null;
        return this.#check(batch);
      });
    return this.#firstCheck;
  }

  /**
   * First checks wait until every hold is released: recovery adopts
   * thousands of instances, and their logs are looked at once it is done,
   * not between its steps. Returns the release (idempotent).
   */
  holdFirstChecks(): () => void {
    if (this.#holds++ === 0) this.#unheld = new Promise<void>((resolve) => (this.#releaseHolds = resolve));
    let released = false;
    return () => {
      if (released) return;
      released = true;
      if (--this.#holds === 0) this.#unhold();
    };
  }

  #unhold(): void {
    this.#holds = 0;
    this.#releaseHolds?.();
    this.#releaseHolds = null;
    this.#unheld = Promise.resolve();
  }

  /** The instance is gone (or its launch failed): its logs are no longer checked; the files stay. */
  unwatch(id: string): void {
    this.#limits.delete(id);
    if (this.#watched.delete(id) && this.#watched.size === 0) this.#stopTimer();
  }

  close(): void {
    this.#watched.clear();
    this.#stopTimer();
    // Held checks run now, and find nothing watched.
    this.#unhold();
  }

  #stopTimer(): void {
    if (this.#timer) clearInterval(this.#timer);
    this.#timer = undefined;
  }

  /**
   * Each entry's two files: a synchronous lstat each, in slices of at most
   * LOOP_SLICE_MS with a turn of the loop between them; only a file over
   * its cap goes on to capLog's copy, off the loop. At 5 000 instances a
   * check is 10 000 lstats: through fs/promises, one after the other, they
   * took ~500 ms of this thread every checkMs; here ~25 ms.
   */
  async #check(entries: Array<[string, Readonly<Required<LogOptions>>]>): Promise<void> {
    const sliceOver = loopSlices();
    for (const [id, { maxBytes, keep }] of entries) {
      const files = logPaths(this.stateDir, id);
      for (const file of [files.stdout, files.stderr]) {
        const turn = sliceOver();
        if (turn) await turn;
        // A check still copying this file (a slow disk) is not raced.
        if (this.#busy.has(file) || !overCap(file, maxBytes)) continue;
        this.#busy.add(file);
        try {
          const capped = await capLog(file, maxBytes, keep);
          if (capped.done === 'cut') this.#report('warning', { id, path: file, message: describeCut(file, capped) });
        } catch (err) {
          this.#report('warning', { id, message: `could not rotate ${file}: ${(err as Error).message}` });
        } finally {
          this.#busy.delete(file);
        }
      }
    }
  }

  #maybePrune(launching: string): void {
    const now = Date.now();
    if (now - this.#lastPrune < PRUNE_EVERY_MS) return;
    this.#lastPrune = now;
    let live: Set<string>;
    try {
      live = new Set([launching, ...this.#live()]);
    } catch (err) {
      const message = `logs not pruned: the live ids could not be listed: ${(err as Error).message}`;
      this.#report('warning', { id: launching, message });
      return;
    }
    for (const id of pruneLogs(this.stateDir, live, LOG_RETENTION_MS, now)) {
      const message = `logs of ${id} removed: no state left and untouched for ${LOG_RETENTION_MS / 86_400_000} days`;
      this.#report('clean', { id, message });
    }
  }
}
