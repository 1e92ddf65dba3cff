/**
 * The state dir itself: which dirs custody accepts (its own, stamped
 * `.custody`, or one custody 0.1 left), which it refuses (/, $HOME, /etc, a
 * dir that is not custody's, any path another uid could change: OpenSSH's
 * StrictModes), and the open fd every later access goes through, so a path
 * swapped after open never redirects a read, a write or a removal.
 */
import {
  closeSync,
  constants as fsc,
  fstatSync,
  fsync,
  fsyncSync,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readSync,
  realpathSync,
  renameSync,
  statSync,
  unlinkSync,
  writeSync,
  type Dirent,
  type Stats,
} from 'node:fs';
import { homedir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { promisify } from 'node:util';
import { openRegular, refusedSize } from './files.js';
import {
  InvalidArgError,
  NoStateDirError,
  NotCustodyDirError,
  StateIOError,
  UnsupportedError,
  UnsafePathError,
} from '../errors.js';

/** The format the stamp names. Custody 0.1 wrote format 1 and no stamp. */
export const STATE_FORMAT = 3;
export const STAMP = '.custody';
export const LOCK = '.lock';
/** Instance logs (logs.ts): custody's, beside the instances, never one of them. */
export const LOGS = '.logs';
/** The sub-cgroup custody made for this dir (src/process/cgroup-guard.ts): a reserved name, beside the stamp. */
export const CGROUP_RECORD = `${STAMP}.cgroup`;
const MAX_STAMP_BYTES = 4096;
const S_ISVTX = 0o1000;

/** Names custody keeps for itself at the top of a state dir: never instances. */
export function isReservedName(name: string): boolean {
  return (
    name === STAMP || name === LOCK || name === LOGS || name.startsWith(`${STAMP}.`) || name.startsWith(`${LOCK}.`)
  );
}

/** A sub-cgroup as custody made it: its path, its cgroup id (the directory's inode), the boot it was made in. */
export interface CgroupRecord {
  path: string;
  id: string;
  bootId: string;
}

export function errnoCode(err: unknown): string | undefined {
  return (err as NodeJS.ErrnoException)?.code;
}

const octal = (st: Stats) => (st.mode & 0o7777).toString(8).padStart(4, '0');

/**
 * Reads a regular file through openRegular (no symlink, FIFO or device, no
 * blocking). `problem` says why it is not one to read ("is a FIFO"); errno
 * errors (ENOENT, EMFILE...) are thrown as they are.
 */
export function readPlainFile(path: string, maxBytes: number): { data: Buffer } | { problem: string } {
  const opened = openRegular(path, fsc.O_RDONLY);
  if ('refused' in opened) return { problem: opened.refused };
  const { fd, st } = opened;
  try {
    if (st.size > maxBytes) return { problem: refusedSize(st.size, maxBytes) };
    const buf = Buffer.alloc(st.size);
    let off = 0;
    while (off < buf.length) {
      const n = readSync(fd, buf, off, buf.length - off, off);
      if (n === 0) break;
      off += n;
    }
    return { data: buf.subarray(0, off) };
  } finally {
    closeSync(fd);
  }
}

/**
 * Whether /proc/self/fd/<fd>/<name> reaches <name> in the dir the fd holds:
 * Node has no openat(2), and this path is the kernel's way to the same
 * lookup. Probed once; where it does not work, paths are re-checked instead.
 */
let procFd: boolean | undefined;

/** The path through which names inside the dir held by `fd` are reached. */
export function pathOf(fd: number, fallback: string): string {
  if (procFd === undefined) {
    try {
      const a = statSync(`/proc/self/fd/${fd}`);
      const b = fstatSync(fd);
      procFd = a.dev === b.dev && a.ino === b.ino;
    } catch {
      procFd = false;
    }
  }
  return procFd ? `/proc/self/fd/${fd}` : fallback;
}

function lstatOrNull(path: string): Stats | null {
  try {
    return lstatSync(path);
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return null;
    throw new StateIOError(`cannot inspect ${path}`, err);
  }
}

function realpathOrNull(path: string | undefined): string | null {
  if (!path) return null;
  try {
    return realpathSync(path);
  } catch {
    return null;
  }
}

/** /, $HOME and /etc hold what is not custody's to clean: never state dirs, even as root. */
function refuseSpecial(path: string): void {
  const special = new Map<string, string>([['/', '/']]);
  for (const [name, p] of [
    ['/etc', '/etc'],
    ['$HOME', process.env.HOME],
    ['$HOME', homedir()],
  ] as const) {
    const real = realpathOrNull(p);
    if (real) special.set(real, name);
    if (p) special.set(resolve(p), name);
  }
  const hit = special.get(path);
  if (hit) throw new UnsafePathError(path, hit === path ? 'is never a state dir' : `is ${hit}, never a state dir`);
}

/**
 * Whose the first dir of a checked path must be: `own` ours alone (a state
 * dir); `root-or-own` root's or ours, and writable by no one else, sticky or
 * not (a cgroup custody creates cgroups in or acts through: a sticky dir
 * still lets others create a name first); `above` as every dir above it (the
 * dir a new one is created in).
 */
export type TrustLeaf = 'own' | 'root-or-own' | 'above';

export interface TrustRule {
  leaf: TrustLeaf;
  /** What the path is, for messages: "state dir", "cgroup". */
  what: string;
  /** The last dir checked (a mount point); '/' when absent. */
  top?: string;
}

/**
 * OpenSSH's StrictModes, on the real path: the dir belongs to us (or root,
 * as `rule.leaf` says) and only its owner can write it; every dir above it,
 * up to `rule.top`, belongs to root or us and no one else can write it,
 * except a sticky dir such as /tmp (the sticky bit stops others renaming or
 * removing what is root's or ours in it). Without this, another uid could
 * swap a path under us between two syscalls. Throws UnsafePathError naming
 * the dir; returns the first dir's stats.
 */
export function checkTrusted(real: string, rule: TrustRule): Stats {
  const uid = process.geteuid?.();
  const { what } = rule;
  const chain: string[] = [];
  for (let p = real; ; p = dirname(p)) {
    chain.push(p);
    if (p === rule.top || dirname(p) === p) break;
  }
  let first: Stats | undefined;
  for (const p of chain) {
    const st = lstatOrNull(p);
    if (!st) throw new UnsafePathError(p, 'vanished while it was being checked');
    if (uid !== undefined) {
      if (!first && rule.leaf === 'own') {
        if (st.uid !== uid)
          throw new UnsafePathError(p, `belongs to uid ${st.uid}, not to uid ${uid} that runs custody`);
        if (st.mode & 0o022)
          throw new UnsafePathError(
            p,
            `is writable by group or others (mode ${octal(st)}); a ${what} must be its owner's alone`,
          );
      } else if (!first && rule.leaf === 'root-or-own') {
        if (st.uid !== 0 && st.uid !== uid)
          throw new UnsafePathError(
            p,
            `belongs to uid ${st.uid}: a ${what} custody uses must belong to root or uid ${uid}`,
          );
        if (st.mode & 0o022)
          throw new UnsafePathError(
            p,
            `is writable by group or others (mode ${octal(st)}): another uid could create, remove or replace cgroups in it`,
          );
      } else {
        if (st.uid !== 0 && st.uid !== uid) {
          throw new UnsafePathError(
            p,
            `belongs to uid ${st.uid}: every dir above a ${what} must belong to root or uid ${uid}`,
          );
        }
        // Sticky (/tmp): others may write it, but only an entry's owner or root may rename or remove
        // it, and the entry below is checked to be root's or ours (or is the one we create).
        if (st.mode & 0o022 && !(st.mode & S_ISVTX)) {
          throw new UnsafePathError(
            p,
            `is writable by group or others (mode ${octal(st)}): another uid could replace the ${what}`,
          );
        }
      }
    }
    first ??= st;
  }
  // The chain starts at `real` itself, so the loop ran at least once.
  return first as Stats;
}

/** Creates a missing state dir (0700) once the dir it goes in is proven safe to create it in. */
function createDir(abs: string): void {
  let existing = dirname(abs);
  while (lstatOrNull(existing) === null && dirname(existing) !== existing) existing = dirname(existing);
  const real = realpathOrNull(existing);
  if (!real) throw new UnsafePathError(existing, 'cannot be resolved');
  checkTrusted(real, { leaf: 'above', what: 'state dir' });
  try {
    mkdirSync(abs, { recursive: true, mode: 0o700 });
  } catch (err) {
    throw new StateIOError(`cannot create state dir ${abs}`, err);
  }
}

export interface StateDirOptions {
  /** Create the dir when it does not exist (false: a NoStateDirError instead, and nothing is created). */
  create: boolean;
}

export class StateDir {
  /** The path as given, made absolute: what messages name. */
  readonly path: string;
  /** The dir, held open from the checks on: every access goes through it. */
  readonly fd: number;
  readonly dev: number;
  readonly ino: number;
  /** STATE_FORMAT or an older stamp; 1: unstamped, as custody 0.1 left it; null: empty. */
  format: number | null = null;
  #base: string;

  private constructor(path: string, real: string, fd: number, st: Stats) {
    this.path = path;
    this.fd = fd;
    this.dev = st.dev;
    this.ino = st.ino;
    this.#base = pathOf(fd, real);
  }

  /** Checks the path, creates it if asked, opens it and says what it holds; refuses what is not custody's. */
  static open(path: unknown, options: StateDirOptions): StateDir {
    if (typeof path !== 'string' || path === '' || path.includes('\0'))
      throw new InvalidArgError('stateDir must be a non-empty path without NUL bytes');
    const abs = resolve(path);
    refuseSpecial(abs);
    let st = lstatOrNull(abs);
    if (!st) {
      if (!options.create) throw new NoStateDirError(abs);
      createDir(abs);
      st = lstatOrNull(abs);
      if (!st) throw new UnsafePathError(abs, 'vanished after it was created');
    }
    if (st.isSymbolicLink()) throw new UnsafePathError(abs, 'is a symlink; a state dir is never reached through one');
    if (!st.isDirectory()) throw new InvalidArgError(`state dir ${abs} is not a directory`);
    const real = realpathOrNull(abs);
    if (!real) throw new UnsafePathError(abs, 'cannot be resolved');
    refuseSpecial(real);
    const checked = checkTrusted(real, { leaf: 'own', what: 'state dir' });
    let fd: number;
    try {
      fd = openSync(real, fsc.O_RDONLY | fsc.O_DIRECTORY | fsc.O_NOFOLLOW);
    } catch (err) {
      throw new StateIOError(`cannot open state dir ${abs}`, err);
    }
    try {
      const held = fstatSync(fd);
      if (held.dev !== checked.dev || held.ino !== checked.ino)
        throw new UnsafePathError(abs, 'was replaced while it was being checked');
      const dir = new StateDir(abs, real, fd, held);
      dir.format = dir.classify();
      return dir;
    } catch (err) {
      closeSync(fd);
      throw err;
    }
  }

  /** The path of `name` inside the held dir (through its fd where the kernel allows). */
  at(...names: string[]): string {
    return join(this.#base, ...names);
  }

  /** The path of `name` for messages: under the path the caller gave. */
  show(...names: string[]): string {
    return join(this.path, ...names);
  }

  names(): string[] {
    return this.entries().map((e) => e.name);
  }

  /** The entries with the type readdir reports (d_type); a file system that reports none leaves every is*() false. */
  entries(): Dirent[] {
    try {
      return readdirSync(this.#base, { withFileTypes: true }).sort((a, b) =>
        a.name < b.name ? -1 : a.name > b.name ? 1 : 0,
      );
    } catch (err) {
      throw new StateIOError(`cannot list state dir ${this.path}`, err);
    }
  }

  /**
   * What the dir is: stamped (its format), empty (null), or left by custody
   * 0.1 (1). Anything else is not custody's and is refused, untouched.
   */
  classify(): number | null {
    const names = this.names();
    if (names.includes(STAMP)) return this.#readStamp();
    const others = names.filter((n) => !isReservedName(n));
    if (others.length === 0) return null;
    if (this.#looksLike01(others)) return 1;
    const sample = others
      .slice(0, 3)
      .map((n) => JSON.stringify(n))
      .join(', ');
    throw new NotCustodyDirError(
      this.path,
      `it holds ${sample}${others.length > 3 ? ', ...' : ''} but no ${STAMP} stamp`,
    );
  }

  #readStamp(): number {
    let r: ReturnType<typeof readPlainFile>;
    try {
      r = readPlainFile(this.at(STAMP), MAX_STAMP_BYTES);
    } catch (err) {
      throw new StateIOError(`cannot read ${this.show(STAMP)}`, err);
    }
    if ('problem' in r) throw new NotCustodyDirError(this.path, `its ${STAMP} ${r.problem}`);
    let format: unknown;
    try {
      format = (JSON.parse(r.data.toString('utf8')) as { format?: unknown })?.format;
    } catch {
      format = undefined;
    }
    if (typeof format !== 'number' || !Number.isSafeInteger(format) || format < 1) {
      throw new NotCustodyDirError(this.path, `its ${STAMP} names no format custody wrote`);
    }
    if (format > STATE_FORMAT) {
      throw new UnsupportedError(
        `state dir ${this.path} has format ${format}; this custody reads formats up to ${STATE_FORMAT} (a newer custody wrote it)`,
      );
    }
    return format;
  }

  /**
   * Custody 0.1 stamped nothing. Its dirs hold `.lock` (empty, or its
   * holder's {pid, startTicks}) and instance dirs with version-1 manifests,
   * and never a file at the top: one of those marks, and nothing else.
   */
  #looksLike01(others: string[]): boolean {
    let marked = false;
    const lock = lstatOrNull(this.at(LOCK));
    if (lock?.isFile()) {
      try {
        const r = readPlainFile(this.at(LOCK), 256);
        marked = 'data' in r && (r.data.length === 0 || isLegacyRecord(r.data.toString('utf8')));
      } catch {
        marked = false;
      }
    }
    for (const name of others) {
      const st = lstatOrNull(this.at(name));
      if (!st) continue;
      if (!st.isDirectory() && !st.isSymbolicLink()) return false;
      if (!marked && st.isDirectory()) marked = isV1Manifest(this.at(name, 'manifest.json'), name);
    }
    return marked;
  }

  /** Writes the stamp (atomically: temp file, fsync, rename, fsync of the dir). */
  stamp(): void {
    this.#replace(STAMP, { custody: 'state dir', format: STATE_FORMAT }, 'stamp state dir');
    this.format = STATE_FORMAT;
  }

  /**
   * The sub-cgroup custody made for this dir, as it recorded it; null where
   * none is recorded (a dir of custody 0.2 or older, or a supervisor never
   * given a cgroup root). A record that cannot be one is `problem`.
   */
  readCgroupRecord(): CgroupRecord | { problem: string } | null {
    let r: ReturnType<typeof readPlainFile>;
    try {
      r = readPlainFile(this.at(CGROUP_RECORD), MAX_STAMP_BYTES);
    } catch (err) {
      if (errnoCode(err) === 'ENOENT') return null;
      throw new StateIOError(`cannot read ${this.show(CGROUP_RECORD)}`, err);
    }
    if ('problem' in r) return { problem: `${this.show(CGROUP_RECORD)} ${r.problem}` };
    let v: Partial<Record<keyof CgroupRecord, unknown>> = {};
    try {
      v = (JSON.parse(r.data.toString('utf8')) as typeof v | null) ?? {};
    } catch {
      // not JSON: refused below like any other shape
    }
    const { path, id, bootId } = v;
    if (typeof path !== 'string' || typeof id !== 'string' || !/^\d+$/.test(id) || typeof bootId !== 'string')
      return { problem: `${this.show(CGROUP_RECORD)} is not a cgroup record custody wrote` };
    return { path, id, bootId };
  }

  /**
   * Records the sub-cgroup custody made for this dir (atomically, mode 0600,
   * as the stamp), without an fsync: the record means something only on the
   * boot that wrote it, and only a power loss, which ends that boot, loses a
   * write that was not synced.
   */
  writeCgroupRecord(record: CgroupRecord): void {
    const { path, id, bootId } = record;
    this.#replace(CGROUP_RECORD, { path, id, bootId }, 'record the cgroup of state dir', false);
  }

  /** Replaces a file of custody's at the top: temp file (0600), fsync, rename, fsync of the dir (`durable`). */
  #replace(name: string, value: object, what: string, durable = true): void {
    const tmp = this.at(`${name}.${process.pid}.tmp`);
    try {
      const fd = openSync(tmp, fsc.O_WRONLY | fsc.O_CREAT | fsc.O_TRUNC | fsc.O_NOFOLLOW, 0o600);
      try {
        writeSync(fd, `${JSON.stringify(value)}\n`);
        if (durable) fsyncSync(fd);
      } finally {
        closeSync(fd);
      }
      renameSync(tmp, this.at(name));
      if (durable) fsyncSync(this.fd);
    } catch (err) {
      try {
        unlinkSync(tmp);
      } catch {
        // never written, or already renamed
      }
      throw new StateIOError(`cannot ${what} ${this.path}`, err);
    }
  }

  /**
   * Whether the path still leads to the dir held since open. Launch asks
   * before writing a new instance: a dir moved or replaced by a symlink
   * after open is refused rather than written to where no one will look.
   */
  assertInPlace(): void {
    let st: Stats;
    try {
      st = lstatSync(this.path);
    } catch (err) {
      throw new UnsafePathError(
        this.path,
        `is gone since it was opened (${errnoCode(err)}); refusing to launch into it`,
      );
    }
    if (st.isSymbolicLink())
      throw new UnsafePathError(this.path, 'was replaced by a symlink after it was opened; refusing to launch into it');
    if (st.dev !== this.dev || st.ino !== this.ino) {
      throw new UnsafePathError(
        this.path,
        'was replaced by another directory after it was opened; refusing to launch into it',
      );
    }
  }

  /** fsync of the dir itself (a new or removed entry), off the event loop. */
  fsync(): Promise<void> {
    return fsyncAsync(this.fd);
  }

  close(): void {
    closeSync(this.fd);
  }
}

const fsyncAsync = promisify(fsync);

/** The record custody 0.1 kept in `.lock`: {"pid":N,"startTicks":T}. */
function isLegacyRecord(text: string): boolean {
  try {
    const v = JSON.parse(text) as { pid?: unknown; startTicks?: unknown };
    return Number.isSafeInteger(v?.pid) && Number.isSafeInteger(v?.startTicks);
  } catch {
    return false;
  }
}

function isV1Manifest(path: string, name: string): boolean {
  try {
    const r = readPlainFile(path, 1 << 20);
    if (!('data' in r)) return false;
    const v = JSON.parse(r.data.toString('utf8')) as { version?: unknown; id?: unknown };
    return v?.version === 1 && v.id === name;
  } catch {
    return false;
  }
}
