/**
 * The state store: <stateDir>/<id>/manifest.json, one per instance.
 *
 * Writes are atomic (temp file, fsync, rename, fsync of the dir), dirs are
 * 0700 and files 0600, and nothing is opened through a symlink. The dir is
 * held by one supervisor at a time (<stateDir>/.lock): flock on the native
 * backend, and on both backends the holder's pid and start time in the file,
 * so a js holder and a native holder exclude each other too.
 */
import {
  closeSync,
  constants as fsc,
  fsync,
  fsyncSync,
  fstatSync,
  ftruncateSync,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readSync,
  realpathSync,
  renameSync,
  rmdirSync,
  unlinkSync,
  writeSync,
} from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { backend } from './backend/index.js';
import { BadManifestError, CustodyError, InvalidArgError, StateLockedError } from './errors.js';
import type { ProcessIdentity } from './types.js';
import { pidMax } from './validate.js';

export const MANIFEST_VERSION = 1;
const MANIFEST = 'manifest.json';
const LOCK = '.lock';
const MAX_MANIFEST_BYTES = 1 << 20;

export type ManifestState = 'starting' | 'running' | 'quarantined';

export interface Manifest {
  version: number;
  id: string;
  /** 128-bit random hex; the launched argv carries it. */
  token: string;
  state: ManifestState;
  /** Recorded once exec is confirmed; null while starting. */
  identity: ProcessIdentity | null;
  command: string;
  args: string[];
  /** argv tokens the confirmed process carries besides the token. */
  expect: string[];
  /** Declared paths (sockets, pidfiles), removed on abandon and stop. */
  paths: string[];
  /** The program the confirmed process runs, when the launch named one. */
  executable: string | null;
  /** A uid the target may run as besides the supervisor's (a launcher that drops privileges). Absent in version 1. */
  uid?: number | null;
  /** The session custody created for the instance, while the target is in it: its members are the instance's. */
  session?: number | null;
  /** Where the pid came from. */
  pidSource: 'child' | 'file' | 'function';
  pidFile: string | null;
  createdAt: string;
  updatedAt: string;
  /** The pid of the supervisor that wrote it. */
  supervisorPid: number;
  quarantine: { reason: string; field?: string; at: string } | null;
}

const ID_RE = /^[A-Za-z0-9._-]{1,128}$/;

export function assertId(id: unknown): asserts id is string {
  if (typeof id !== 'string' || !ID_RE.test(id) || id === '.' || id === '..') {
    throw new InvalidArgError(`id must be 1-128 characters of [A-Za-z0-9._-], not "." or "..", got ${JSON.stringify(String(id)).slice(0, 80)}`);
  }
}

const isObj = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
const isStrArr = (v: unknown): v is string[] => Array.isArray(v) && v.every((s) => typeof s === 'string');
const isInt = (v: unknown, min: number) => typeof v === 'number' && Number.isSafeInteger(v) && v >= min;

/** Validates a decoded identity; returns a reason when it is malformed. Missing bootId/startTicks are allowed (verify says unrecorded). */
function identityProblem(v: unknown): string | null {
  if (!isObj(v)) return 'identity is not an object';
  if (!isInt(v.pid, 1) || (v.pid as number) > pidMax()) return `identity.pid is not an integer from 1 to ${pidMax()}`;
  if (v.bootId !== undefined && v.bootId !== null && typeof v.bootId !== 'string') return 'identity.bootId is not a string';
  if (v.startTicks !== undefined && v.startTicks !== null && !isInt(v.startTicks, 0)) return 'identity.startTicks is not a non-negative integer';
  if (v.exe !== null && v.exe !== undefined && !(isObj(v.exe) && isInt(v.exe.dev, 0) && isInt(v.exe.ino, 0))) return 'identity.exe is malformed';
  if (v.pidfsId !== null && v.pidfsId !== undefined && !(typeof v.pidfsId === 'string' && /^\d{1,20}$/.test(v.pidfsId))) return 'identity.pidfsId is malformed';
  if (!isStrArr(v.argv)) return 'identity.argv is not a list of strings';
  if (v.pidNs !== undefined && v.pidNs !== null && !isInt(v.pidNs, 0)) return 'identity.pidNs is malformed';
  return null;
}

/** Decodes manifest text; throws BadManifestError naming what is wrong. Never trusts a field it has not checked. */
export function decodeManifest(text: string, path: string, expectedId?: string): Manifest {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch (err) {
    throw new BadManifestError(path, 'not valid JSON', { cause: err });
  }
  if (!isObj(v)) throw new BadManifestError(path, 'not a JSON object');
  if (v.version !== MANIFEST_VERSION) throw new BadManifestError(path, `unknown schema version ${JSON.stringify(v.version)}`);
  const bad = (why: string) => new BadManifestError(path, why);
  if (typeof v.id !== 'string' || !ID_RE.test(v.id) || v.id === '.' || v.id === '..') throw bad('id is malformed');
  if (expectedId !== undefined && v.id !== expectedId) throw bad(`id ${JSON.stringify(v.id)} does not match its directory ${JSON.stringify(expectedId)}`);
  if (typeof v.token !== 'string' || !/^[0-9a-f]{32}$/.test(v.token)) throw bad('token is not 32 hex digits');
  if (v.state !== 'starting' && v.state !== 'running' && v.state !== 'quarantined') throw bad(`unknown state ${JSON.stringify(v.state)}`);
  if (typeof v.command !== 'string' || v.command === '') throw bad('command is malformed');
  if (!isStrArr(v.args)) throw bad('args is not a list of strings');
  if (!v.args.some((a) => a.includes(v.token as string))) throw bad('args do not carry the token');
  if (!isStrArr(v.expect)) throw bad('expect is not a list of strings');
  if (!isStrArr(v.paths)) throw bad('paths is not a list of strings');
  if (v.pidSource !== 'child' && v.pidSource !== 'file' && v.pidSource !== 'function') throw bad('pidSource is malformed');
  if (v.pidFile !== null && !(typeof v.pidFile === 'string' && v.pidFile.startsWith('/'))) throw bad('pidFile is not an absolute path');
  if (v.executable !== null && !(typeof v.executable === 'string' && v.executable !== '')) throw bad('executable is malformed');
  if (!isInt(v.supervisorPid, 1)) throw bad('supervisorPid is malformed');
  if (v.uid !== undefined && v.uid !== null && !isInt(v.uid, 0)) throw bad('uid is malformed');
  if (v.session !== undefined && v.session !== null && !(isInt(v.session, 1) && (v.session as number) <= pidMax())) throw bad('session is malformed');
  if (v.identity !== null) {
    const problem = identityProblem(v.identity);
    if (problem) throw bad(problem);
  } else if (v.state === 'running') {
    throw bad('a running manifest has no identity');
  }
  if (v.quarantine !== null && !(isObj(v.quarantine) && typeof v.quarantine.reason === 'string')) throw bad('quarantine is malformed');
  return v as unknown as Manifest;
}

function errnoCode(err: unknown): string | undefined {
  return (err as NodeJS.ErrnoException)?.code;
}

/**
 * An instance dir without a manifest: a crash between creating the dir (or
 * writing the temp file) and the rename. Nothing is spawned before the
 * first manifest is renamed into place, so there is no process to find.
 */
export class IncompleteInstanceError extends BadManifestError {
  constructor(path: string) {
    super(path, 'no manifest (a write interrupted before its rename)');
  }
}

export class StateIOError extends CustodyError {
  constructor(message: string, cause: unknown) {
    super('ERR_CUSTODY_STATE_IO', `${message}: ${(cause as Error)?.message ?? cause}`, { cause });
  }
}

let tmpCounter = 0;

/** State dirs locked by this process: flock and the holder record both see one process as one holder. */
const lockedHere = new Set<string>();

export class StateStore {
  readonly dir: string;
  #lockFd: number | null = null;
  #lockKey: string | null = null;

  constructor(dir: string) {
    if (typeof dir !== 'string' || dir === '' || dir.includes('\0')) throw new InvalidArgError('stateDir must be a non-empty path');
    this.dir = dir;
  }

  /** Whether the state dir exists (recovery has nothing to do when it does not). */
  exists(): boolean {
    try {
      lstatSync(this.dir);
      return true;
    } catch (err) {
      if (errnoCode(err) === 'ENOENT') return false;
      throw err;
    }
  }

  /** Creates the dir (0700) if needed and refuses one that is a symlink, not a dir, or writable by others. */
  ensureDir(): void {
    try {
      mkdirSync(this.dir, { recursive: true, mode: 0o700 });
    } catch (err) {
      throw new StateIOError(`cannot create state dir ${this.dir}`, err);
    }
    const st = lstatSync(this.dir);
    if (st.isSymbolicLink() || !st.isDirectory()) throw new InvalidArgError(`state dir ${this.dir} is not a directory (symlinks are not followed)`);
    if (st.mode & 0o022) {
      throw new InvalidArgError(`state dir ${this.dir} is writable by group or others (mode ${(st.mode & 0o777).toString(8)}); refusing to trust it`);
    }
    const uid = process.getuid?.();
    if (uid !== undefined && st.uid !== uid) throw new InvalidArgError(`state dir ${this.dir} belongs to uid ${st.uid}, not ${uid}`);
  }

  /** Takes the dir's lock or throws StateLockedError naming the holder. */
  lock(): void {
    this.ensureDir();
    const path = join(this.dir, LOCK);
    const key = realpathSync(this.dir);
    if (lockedHere.has(key)) throw new StateLockedError(this.dir, process.pid);
    let fd: number;
    try {
      fd = openSync(path, fsc.O_RDWR | fsc.O_CREAT | fsc.O_NOFOLLOW, 0o600);
    } catch (err) {
      throw new StateIOError(`cannot open ${path}`, err);
    }
    try {
      const locked = backend.tryLock(fd);
      const holder = this.#readHolder(fd);
      if (locked === false) throw new StateLockedError(this.dir, holder?.pid ?? null);
      // A js-backend holder cannot flock: its record in the file is the lock.
      if (holder && holder.pid !== process.pid && holderAlive(holder)) throw new StateLockedError(this.dir, holder.pid);
      const text = `${JSON.stringify({ pid: process.pid, startTicks: ownStartTicks() })}\n`;
      ftruncateSync(fd, 0);
      writeSync(fd, text, 0);
      fsyncSync(fd);
      this.#lockFd = fd;
      this.#lockKey = key;
      lockedHere.add(key);
    } catch (err) {
      closeSync(fd);
      throw err;
    }
  }

  /** Releases the lock (closing the fd drops the flock); clears our record. */
  unlock(): void {
    if (this.#lockFd === null) return;
    try {
      ftruncateSync(this.#lockFd, 0);
    } catch {
      // the record is only a hint once the flock is gone
    }
    closeSync(this.#lockFd);
    this.#lockFd = null;
    if (this.#lockKey) lockedHere.delete(this.#lockKey);
    this.#lockKey = null;
  }

  #readHolder(fd: number): { pid: number; startTicks: number } | null {
    const buf = Buffer.alloc(256);
    const n = readSync(fd, buf, 0, buf.length, 0);
    try {
      const v = JSON.parse(buf.subarray(0, n).toString('utf8'));
      return isInt(v?.pid, 1) && isInt(v?.startTicks, -1) ? v : null;
    } catch {
      return null;
    }
  }

  /** Ids with an instance dir (dot-entries such as .lock are not instances). */
  ids(): string[] {
    return readdirSync(this.dir).filter((name) => !name.startsWith('.'));
  }

  instanceDir(id: string): string {
    return join(this.dir, id);
  }

  /** Reads and decodes a manifest. A symlinked dir or file, or a bad document, throws BadManifestError. */
  read(id: string): Manifest {
    const dir = this.instanceDir(id);
    const path = join(dir, MANIFEST);
    let st;
    try {
      st = lstatSync(dir);
    } catch (err) {
      throw new BadManifestError(path, `instance dir unreadable (${errnoCode(err)})`, { cause: err });
    }
    if (st.isSymbolicLink() || !st.isDirectory()) throw new BadManifestError(path, 'instance dir is a symlink or not a directory');
    let fd: number;
    try {
      fd = openSync(path, fsc.O_RDONLY | fsc.O_NOFOLLOW | fsc.O_NONBLOCK);
    } catch (err) {
      const code = errnoCode(err);
      if (code === 'ENOENT') throw new IncompleteInstanceError(path);
      throw new BadManifestError(path, code === 'ELOOP' ? 'manifest is a symlink' : `unreadable (${code})`, { cause: err });
    }
    try {
      const fst = fstatSync(fd);
      if (!fst.isFile()) throw new BadManifestError(path, 'manifest is not a regular file');
      if (fst.size > MAX_MANIFEST_BYTES) throw new BadManifestError(path, `manifest is ${fst.size} bytes, more than ${MAX_MANIFEST_BYTES}`);
      const buf = Buffer.alloc(fst.size);
      let off = 0;
      while (off < buf.length) {
        const n = readSync(fd, buf, off, buf.length - off, off);
        if (n === 0) break;
        off += n;
      }
      return decodeManifest(buf.subarray(0, off).toString('utf8'), path, id);
    } finally {
      closeSync(fd);
    }
  }

  /**
   * Writes a manifest atomically: temp file, fsync, rename, fsync of the
   * dir (and of the state dir when the instance dir is new). Creates the
   * instance dir (0700) first if needed. The fsyncs run off the event loop:
   * on a disk each costs a millisecond that concurrent launches need not
   * wait for.
   */
  async write(m: Manifest): Promise<void> {
    const dir = this.instanceDir(m.id);
    try {
      let created = false;
      if (m.state === 'starting') {
        try {
          mkdirSync(dir, { mode: 0o700 });
          created = true;
        } catch (err) {
          if (errnoCode(err) !== 'EEXIST') throw err;
        }
      }
      if (!created) {
        let st;
        try {
          st = lstatSync(dir);
        } catch (err) {
          if (errnoCode(err) !== 'ENOENT') throw err;
          mkdirSync(dir, { mode: 0o700 });
          created = true;
        }
        if (st && (st.isSymbolicLink() || !st.isDirectory())) throw new InvalidArgError(`instance dir ${dir} is a symlink or not a directory`);
      }
      // The lock makes this process the only writer: pid and a counter are unique enough.
      const tmp = join(dir, `.manifest.${process.pid}.${++tmpCounter}.tmp`);
      // Open and write land in the page cache at once; only the fsync, the
      // part that waits for the device, leaves the event loop.
      const fd = openSync(tmp, fsc.O_WRONLY | fsc.O_CREAT | fsc.O_EXCL | fsc.O_NOFOLLOW, 0o600);
      try {
        const data = Buffer.from(`${JSON.stringify(m, null, 2)}\n`);
        let off = 0;
        while (off < data.length) off += writeSync(fd, data, off, data.length - off);
        await fsyncAsync(fd);
      } catch (err) {
        closeSync(fd);
        unlinkQuiet(tmp);
        throw err;
      }
      closeSync(fd);
      try {
        renameSync(tmp, join(dir, MANIFEST));
      } catch (err) {
        unlinkQuiet(tmp);
        throw err;
      }
      // A new instance dir is an entry of the state dir: make it durable too,
      // or a crash could lose the dir and the manifest with it.
      await Promise.all([fsyncDirAsync(dir), created ? fsyncDirAsync(this.dir) : undefined]);
    } catch (err) {
      if (err instanceof CustodyError) throw err;
      throw new StateIOError(`cannot write the manifest of ${m.id}`, err);
    }
  }

  /** Removes an instance's state: its manifest, leftover temp files, its dir. */
  async remove(id: string): Promise<void> {
    const dir = this.instanceDir(id);
    try {
      const st = lstatSync(dir);
      if (st.isSymbolicLink()) {
        unlinkSync(dir);
      } else {
        unlinkQuiet(join(dir, MANIFEST));
        try {
          rmdirSync(dir);
        } catch (err) {
          if (errnoCode(err) !== 'ENOTEMPTY') throw err;
          // Temp files of an interrupted write: ours to remove; anything else stays, and so does the dir.
          for (const name of readdirSync(dir)) {
            if (name.startsWith('.manifest.') && name.endsWith('.tmp')) unlinkQuiet(join(dir, name));
          }
          rmdirSync(dir);
        }
      }
      await fsyncDirAsync(this.dir);
    } catch (err) {
      if (errnoCode(err) === 'ENOENT') return;
      throw new StateIOError(`cannot remove the state of ${id}`, err);
    }
  }
}

/** Our start ticks, or -1 where /proc cannot say (then liveness is all a record proves). */
function ownStartTicks(): number {
  try {
    return backend.inspect(process.pid).startTicks;
  } catch {
    return -1;
  }
}

function holderAlive(holder: { pid: number; startTicks: number }): boolean {
  if (holder.startTicks < 0) {
    try {
      process.kill(holder.pid, 0);
      return true;
    } catch (err) {
      return (err as NodeJS.ErrnoException).code === 'EPERM';
    }
  }
  try {
    return backend.inspect(holder.pid).startTicks === holder.startTicks;
  } catch {
    return false;
  }
}

function unlinkQuiet(path: string): void {
  try {
    unlinkSync(path);
  } catch {
    // already gone
  }
}

const fsyncAsync = promisify(fsync);

async function fsyncDirAsync(dir: string): Promise<void> {
  const fd = openSync(dir, fsc.O_RDONLY | fsc.O_DIRECTORY);
  try {
    await fsyncAsync(fd);
  } finally {
    closeSync(fd);
  }
}
