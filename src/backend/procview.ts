/**
 * Whose processes a /proc describes. Pids and pidfds are numbered in our
 * pid namespace; a /proc mounted for another namespace (`unshare --pid
 * --fork` without `--mount-proc`) numbers the same processes differently, so
 * /proc/<pid> would be some other process. `<root>/self` resolves to our pid
 * as that /proc numbers it: equal to process.pid only when it is ours.
 */
import {
  closeSync,
  constants as fsc,
  existsSync,
  openSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  readSync,
  statSync,
} from 'node:fs';
import { decodeArg } from '../bytes.js';
import { errnoError, ForeignProcError } from '../errors.js';
import { parseImage, parseStat, type StatFields } from '../process/proc.js';
import { loopSlices } from '../timing.js';
import type { ExecStage, PidRef } from './types.js';
import { UnprovenPidRef } from './unproven.js';

/**
 * A /proc file read whole through one scratch buffer. readFileSync sees
 * size 0 for every /proc file and so reads it into two fresh 64 KiB buffers
 * (the second read finds end-of-file) and copies: ~20 µs a read here against
 * ~11, and at thousands of reads a second (recovery, the js backend's exit
 * poller) most of the collector's work. Here: open, read until end-of-file,
 * close. A file that fills the buffer (an argv of 32 KiB or more) is read
 * again by readFileSync.
 */
const procScratch = Buffer.allocUnsafeSlow(32 * 1024);

/** Bytes read into procScratch, or -1 when the file did not fit. Errors are the open's or the read's, as readFileSync's. */
function readIntoScratch(path: string): number {
  const fd = openSync(path, fsc.O_RDONLY);
  try {
    let n = 0;
    for (;;) {
      const got = readSync(fd, procScratch, n, procScratch.length - n, null);
      if (got === 0) return n;
      n += got;
      if (n === procScratch.length) return -1;
    }
  } finally {
    closeSync(fd);
  }
}

/** A /proc file's bytes (a copy the caller may keep). */
export function readProcBytes(path: string): Buffer {
  const n = readIntoScratch(path);
  return n < 0 ? readFileSync(path) : Buffer.from(procScratch.subarray(0, n));
}

/** A /proc file's text, one char per byte (latin1: stat's comm may be any bytes). */
export function readProcText(path: string): string {
  const n = readIntoScratch(path);
  return n < 0 ? readFileSync(path, 'latin1') : procScratch.toString('latin1', 0, n);
}

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
    return parseStat(readProcText(`${procRoot}/${pid}/stat`));
  } catch (err) {
    if (gone(err)) return null;
    throw err;
  }
}

/** The address-space layout /proc/<pid>/stat shows (parseImage), or null: none shown, or no such process. */
export function imageOf(pid: number, procRoot = '/proc'): string | null {
  try {
    return parseImage(readProcText(`${procRoot}/${pid}/stat`));
  } catch (err) {
    if (gone(err)) return null;
    throw err;
  }
}

export function execStageOf(pid: number, image: string, procRoot = '/proc'): ExecStage {
  let text: string;
  let cmdline: Buffer;
  try {
    text = readProcText(`${procRoot}/${pid}/stat`);
    if (parseImage(text) === image) return 'fork';
    cmdline = readProcBytes(`${procRoot}/${pid}/cmdline`);
  } catch (err) {
    if (gone(err)) return 'gone';
    throw err;
  }
  const state = parseStat(text)?.state;
  if (state === undefined || state === 'Z' || state === 'X') return 'gone';
  return cmdline.length === 0 ? 'exec' : 'done';
}

/**
 * When this boot began, in ms since the epoch: /proc/stat's btime. Whole
 * seconds, and moved by every clock step since boot, so read it anew where
 * it matters. null where /proc/stat has none.
 */
export function bootTimeMs(): number | null {
  try {
    const m = /^btime (\d+)$/m.exec(readProcText('/proc/stat'));
    return m ? Number(m[1]) * 1000 : null;
  } catch {
    return null;
  }
}

let forkImageCache: string | null | undefined;

/** personality(2)'s ADDR_NO_RANDOMIZE (setarch -R, a debugger's choice): this process's layout was not drawn at random. */
const ADDR_NO_RANDOMIZE = 0x0040000;

/**
 * What any fork of this process shows until it execs: our own layout
 * (parseImage), fixed at our exec. null where it would not tell our forks
 * from other processes of our program: addresses not randomized (the
 * sysctl kernel.randomize_va_space is 0, or our personality says
 * ADDR_NO_RANDOMIZE), or /proc shows none.
 */
export function ownForkImage(): string | null {
  if (forkImageCache !== undefined) return forkImageCache;
  let image: string | null = null;
  try {
    const randomized =
      readProcText('/proc/sys/kernel/randomize_va_space').trim() !== '0' &&
      (Number.parseInt(readProcText('/proc/self/personality'), 16) & ADDR_NO_RANDOMIZE) === 0;
    if (randomized) image = imageOf(process.pid);
  } catch {
    // no /proc, or one that hides these: no image
  }
  forkImageCache = image;
  return image;
}

/**
 * The path /proc/<pid>/exe links to, in custody's lossless string form (a
 * path is bytes, as argv is), with the kernel's " (deleted)" suffix when the
 * file is gone. A name for people: identity.exe (dev, ino) is what proves
 * the executable, and the pid may name another process by the time this
 * returns, so a caller re-verifies the identity after it. null for a kernel
 * thread, a process we may not look at (EACCES, EPERM) or no process.
 */
export function exePath(pid: number, procRoot = '/proc'): string | null {
  assertOwnProc(procRoot);
  try {
    return decodeArg(readlinkSync(`${procRoot}/${pid}/exe`, { encoding: 'buffer' }));
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (gone(err) || code === 'EACCES' || code === 'EPERM') return null;
    throw err;
  }
}

/**
 * The children of a process, from /proc/<pid>/task/<tid>/children (every
 * thread's: a child belongs to the thread that forked it), or a ppid scan
 * where that file does not exist (CONFIG_PROC_CHILDREN off). [] when the
 * process is gone; exhaustion (EMFILE) is thrown, never read as "no children".
 */
export function childrenOf(pid: number, procRoot = '/proc'): number[] {
  assertOwnProc(procRoot);
  const out = new Set<number>();
  let tasks: string[];
  try {
    tasks = readdirSync(`${procRoot}/${pid}/task`);
  } catch (err) {
    if (gone(err)) return [];
    throw err;
  }
  let sawFile = false;
  for (const tid of tasks) {
    let text: string;
    try {
      text = readProcText(`${procRoot}/${pid}/task/${tid}/children`);
    } catch (err) {
      if (gone(err)) continue;
      throw err;
    }
    sawFile = true;
    for (const c of text.split(' ')) if (c.trim()) out.add(Number(c));
  }
  if (!sawFile && tasks.length > 0) {
    for (const name of readdirSync(procRoot)) {
      if (!/^\d+$/.test(name)) continue;
      try {
        if (parseStat(readProcText(`${procRoot}/${name}/stat`))?.ppid === pid) out.add(Number(name));
      } catch (err) {
        if (!gone(err)) throw err;
      }
    }
  }
  return [...out];
}

function gone(err: unknown): boolean {
  const code = (err as NodeJS.ErrnoException).code;
  return code === 'ENOENT' || code === 'ESRCH';
}

/**
 * [pid, session, ...] of every process, for the js backend (the native one
 * reads them on the threadpool, in C++). Read on this thread in slices of
 * at most LOOP_SLICE_MS, with a turn of the loop between them. Through
 * fs/promises each /proc file cost five threadpool round trips (open,
 * fstat, two reads, close) and a 64 KiB buffer: ~9 ms of every js stop at
 * 170 processes, most of its time. A pool held by someone else's work (four
 * reads of FIFOs with no writer) no longer holds this scan up either.
 */
export async function sessionPairsOf(procRoot = '/proc'): Promise<Int32Array> {
  assertOwnProc(procRoot);
  const names = readdirSync(procRoot).filter(isPidName);
  const out = new Int32Array(names.length * 2);
  let filled = 0;
  const sliceOver = loopSlices();
  for (const name of names) {
    const turn = sliceOver();
    if (turn) await turn;
    filled = readSessionPair(procRoot, name, out, filled);
  }
  return out.subarray(0, filled);
}

/**
 * sessionPairsOf, read now in one go: for when the threadpool is too busy
 * (a consumer's file work, our own fsyncs) to serve a bounded scan in time,
 * and waiting longer would let something go unfound.
 */
export function sessionPairsNow(procRoot = '/proc'): Int32Array {
  assertOwnProc(procRoot);
  const names = readdirSync(procRoot).filter(isPidName);
  const out = new Int32Array(names.length * 2);
  let filled = 0;
  for (const name of names) filled = readSessionPair(procRoot, name, out, filled);
  return out.subarray(0, filled);
}

/** Puts the [pid, session] of /proc/<name> at out[filled]; returns the new fill (unchanged for a process gone). */
function readSessionPair(procRoot: string, name: string, out: Int32Array, filled: number): number {
  try {
    return putSessionPair(out, filled, readProcText(`${procRoot}/${name}/stat`));
  } catch (err) {
    if (!gone(err)) throw err;
    return filled;
  }
}

/**
 * [pid, session, ...] pairs as session -> pids: built once per scan, so that each of the thousands of stops
 * sharing one scan looks up its sessions instead of reading the whole table again (O(N) each, O(N²) in all).
 */
function bySession(pairs: Int32Array): Map<number, number[]> {
  const index = new Map<number, number[]>();
  for (let i = 0; i + 1 < pairs.length; i += 2) {
    const session = pairs[i + 1] as number;
    const pids = index.get(session);
    if (pids) pids.push(pairs[i] as number);
    else index.set(session, [pairs[i] as number]);
  }
  return index;
}

/** The pids whose session is one of `sessions`. */
function membersIn(index: Map<number, number[]>, sessions: ReadonlySet<number>): number[] {
  return [...sessions].flatMap((s) => index.get(s) ?? []);
}

/** A /proc entry's name is a pid's: it starts with a digit 1-9. */
const isPidName = (name: string) => name.charCodeAt(0) >= 49 && name.charCodeAt(0) <= 57;

/** Puts stat's [pid, session] at out[filled]; returns the new fill (unchanged for a stat that does not parse). */
function putSessionPair(out: Int32Array, filled: number, stat: string): number {
  const st = parseStat(stat);
  if (!st) return filled;
  out[filled] = st.pid;
  out[filled + 1] = st.session;
  return filled + 2;
}

/**
 * One scan for many callers, each given a scan that began after it asked (so it sees every process that
 * existed when it asked): a caller that comes while a scan runs waits for the next one, which it shares
 * with everyone else who came meanwhile. Thirty-two tree stops in flight cost two scans, not thirty-two.
 */
export class FreshScan<T> {
  readonly #scan: () => Promise<T>;
  #running: Promise<T> | null = null;
  #next: Promise<T> | null = null;

  constructor(scan: () => Promise<T>) {
    this.#scan = scan;
  }

  fresh(): Promise<T> {
    if (!this.#running) return this.#start();
    if (!this.#next) {
      this.#next = this.#running
        .catch(() => undefined)
        .then(() => {
          this.#next = null;
          return this.#start();
        });
    }
    return this.#next;
  }

  #start(): Promise<T> {
    const p = this.#scan().finally(() => {
      if (this.#running === p) this.#running = null;
    });
    this.#running = p;
    return p;
  }
}

const noSuchProcess = (pid: number) => errnoError('ESRCH', 'read', undefined, `pid ${pid}`);

/**
 * A pinned process's /proc/<pid>/environ, both backends (a plain read is all either needs, then the pin
 * decides whether it was the pinned process's). At most maxBytes; never through a symlink.
 */
export function readEnvironOf(ref: PidRef, maxBytes: number, procRoot = '/proc'): Buffer {
  assertOwnProc(procRoot);
  let fd: number;
  try {
    fd = openSync(`${procRoot}/${ref.pid}/environ`, fsc.O_RDONLY | fsc.O_NOFOLLOW);
  } catch (err) {
    if (gone(err)) throw noSuchProcess(ref.pid);
    throw err;
  }
  const chunks: Buffer[] = [];
  let n = 0;
  try {
    // An environment is a few KiB; read it in pieces rather than reserve maxBytes each time.
    while (n < maxBytes) {
      const chunk = Buffer.allocUnsafe(Math.min(16384, maxBytes - n));
      const got = readSync(fd, chunk, 0, chunk.length, null);
      if (got === 0) break;
      chunks.push(chunk.subarray(0, got));
      n += got;
    }
  } catch (err) {
    if (gone(err)) throw noSuchProcess(ref.pid);
    throw err;
  } finally {
    closeSync(fd);
  }
  // Read by path: only if the pinned process still runs now was the pid still its own during the read.
  if (!pinnedAlive(ref)) throw noSuchProcess(ref.pid);
  return Buffer.concat(chunks, n);
}

/** Whether a pinned process still exists (signal 0 through its pin; EPERM means it does, and is not ours to signal). */
export function pinnedAlive(ref: PidRef): boolean {
  try {
    return ref.signal(0);
  } catch (err) {
    // EPERM: not ours to signal, but it exists.
    if ((err as NodeJS.ErrnoException).code === 'EPERM') return true;
    throw err;
  }
}

/**
 * A process's cgroup v2 path (the `0::` line of /proc/<pid>/cgroup), as its
 * hierarchy names it from our cgroup namespace; null when the process is
 * gone or the host has no cgroup v2 hierarchy. A read, not proof: callers
 * re-check the start ticks of the process they pinned.
 */
export function cgroupOfPid(pid: number, procRoot = '/proc'): string | null {
  assertOwnProc(procRoot);
  let text: string;
  try {
    text = readProcText(`${procRoot}/${pid}/cgroup`);
  } catch (err) {
    if (gone(err)) return null;
    throw err;
  }
  return parseCgroupV2Line(text);
}

/** The path of the `0::<path>` line of /proc/<pid>/cgroup text, or null. */
export function parseCgroupV2Line(text: string): string | null {
  for (const line of text.split('\n')) if (line.startsWith('0::')) return line.slice(3);
  return null;
}

/** /proc/self/mountinfo as text (where cgroup v2 is mounted is read from it, never assumed). */
export function readMountinfo(): string {
  return readProcText('/proc/self/mountinfo');
}

/**
 * What both backends read the same way, through plain /proc reads: stat,
 * children, session members, cgroup, mountinfo, a pinned process's environ,
 * our own pid namespace, layout and boot time, an exe's path; and the
 * reference for an unprovable process.
 */
export abstract class ProcReads {
  stat(pid: number): StatFields | null {
    return readStatOf(pid);
  }

  execStage(pid: number, image: string): ExecStage {
    return execStageOf(pid, image);
  }

  children(pid: number): number[] {
    return childrenOf(pid);
  }

  readonly #sessions = new FreshScan(async () => bySession(await this.listSessions()));

  /** [pid, session, ...] of every process; the native backend reads them on the threadpool. */
  protected listSessions(): Promise<Int32Array> {
    return sessionPairsOf();
  }

  async sessionMembers(sessions: ReadonlySet<number>): Promise<number[]> {
    return membersIn(await this.#sessions.fresh(), sessions);
  }

  sessionMembersNow(sessions: ReadonlySet<number>): number[] {
    return membersIn(bySession(sessionPairsNow()), sessions);
  }

  cgroupOf(pid: number): string | null {
    return cgroupOfPid(pid);
  }

  mountinfo(): string {
    return readMountinfo();
  }

  unproven(pid: number): PidRef {
    return new UnprovenPidRef(pid);
  }

  readEnviron(ref: PidRef, maxBytes: number): Buffer {
    return readEnvironOf(ref, maxBytes);
  }

  ownPidNs(): number | null {
    return ownPidNs();
  }

  assertOwnProc(procRoot?: string): void {
    assertOwnProc(procRoot);
  }

  ownForkImage(): string | null {
    return ownForkImage();
  }

  bootTimeMs(): number | null {
    return bootTimeMs();
  }

  exePath(pid: number): string | null {
    return exePath(pid);
  }

  pinnedAlive(ref: PidRef): boolean {
    return pinnedAlive(ref);
  }
}
