/**
 * Manifests: <stateDir>/<id>/manifest.json, one per instance, reached only
 * through the state dir held open (statedir.ts), never through a symlink.
 *
 * Writes are atomic (temp file, fsync, rename, fsync of the dir), dirs are
 * 0700 and files 0600. Files custody did not write never make a removal
 * fail: custody removes its own (the manifest, its temp files) and names
 * the rest in a warning event.
 */
import {
  closeSync,
  constants as fsc,
  fsync,
  fsyncSync,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  renameSync,
  rmdirSync,
  unlinkSync,
  writeSync,
  type Stats,
} from 'node:fs';
import { type FileHandle, open, rmdir, unlink } from 'node:fs/promises';
import { promisify } from 'node:util';
import { BadManifestError, CustodyError, InvalidArgError, StateIOError, UnsafePathError } from '../errors.js';
import type { Emit } from '../events.js';
import { StateLock } from './lock.js';
import { backend } from '../backend/index.js';
import type { FileRead } from '../backend/types.js';
import {
  fileKind,
  REPLACED_WHILE_OPENING,
  refusedOpen,
  refusedSize,
  typeKnown,
  typeOfMode,
  type FileType,
} from './files.js';
import { errnoCode, isReservedName, pathOf, readPlainFile, STATE_FORMAT, StateDir } from './statedir.js';
import type { ProcessIdentity } from '../types.js';
import { pidMax } from '../validate.js';

/**
 * 3 adds the `stopping` state, the confirmed identity of a `starting`
 * manifest and the instance's durable definition (`logs`, `launcherExits`);
 * 2 added `identity.pidNs`. Versions 1 (custody 0.1) and 2 (0.2) are read as
 * they are and rewritten as 3 once recovery proves them.
 */
export const MANIFEST_VERSION = 3;
/** The versions decodeManifest reads. */
const READABLE_VERSIONS: readonly unknown[] = [1, 2, MANIFEST_VERSION];
const MANIFEST = 'manifest.json';
const MAX_MANIFEST_BYTES = 1 << 20;
/** Temp files of a write: .manifest.<pid>.<n>.tmp (0.1 named them so too). */
const isTempName = (name: string) => name.startsWith('.manifest.') && name.endsWith('.tmp');

export type ManifestState = 'starting' | 'running' | 'stopping' | 'quarantined';

/** What every manifest carries, whatever its state. */
interface ManifestFields {
  version: number;
  id: string;
  /** 128-bit random hex; the launched argv carries it, or (tokenMode 'env') its environment as CUSTODY_TOKEN. */
  token: string;
  /** Where the token proved the process: 'argv' (the default; absent before env mode existed) or 'env'. */
  tokenMode?: 'argv' | 'env';
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
  /** The instance's cgroup (cgroup v2): its absolute path and id (the directory's inode), written before spawn. */
  cgroup?: { path: string; id: string } | null;
  /** Where the pid came from. */
  pidSource: 'child' | 'file' | 'function';
  pidFile: string | null;
  createdAt: string;
  updatedAt: string;
  /** The pid of the supervisor that wrote it. */
  supervisorPid: number;
  /**
   * That supervisor's address-space layout (parseImage), which its fork shows
   * until the exec: recovery waits for such a fork, the launch's child cut
   * off before its exec. null where addresses are not randomized; absent
   * before it was recorded.
   */
  forkImage?: string | null;
  /**
   * The instance's log caps, as the launch gave them (absent before version
   * 3: custody's defaults); null where its stdout and stderr were not
   * custody's log files.
   */
  logs?: { maxBytes: number; keep: number } | null;
  /** A pidfile launch whose launcher stays (pid: { file }, launcherExits: false). Absent before version 3. */
  launcherExits?: boolean;
}

/**
 * Written before anything is spawned (identity null), and again once exec is
 * confirmed, before readiness (identity recorded): recovery judges the second
 * as it judges a running one.
 */
export interface StartingManifest extends ManifestFields {
  state: 'starting';
  identity: ProcessIdentity | null;
  quarantine: null;
}

/** Written once exec is confirmed: the identity from the inspection that confirmed it. */
export interface RunningManifest extends ManifestFields {
  state: 'running';
  identity: ProcessIdentity;
  quarantine: null;
}

/**
 * A stop (or the end of an exited instance) began: written before the first
 * signal, so one that fails halfway or is cut off by a crash is finished by
 * the next stop() or by recovery, never taken for a process that is gone.
 */
export interface StoppingManifest extends ManifestFields {
  state: 'stopping';
  identity: ProcessIdentity;
  quarantine: null;
  /** When the stop began. */
  stoppingSince: string;
}

export interface Quarantine {
  reason: string;
  field?: string;
  at: string;
}

/** Recovery could not prove it: kept for the operator, never signalled. A launch quarantined while starting has no identity. */
export interface QuarantinedManifest extends ManifestFields {
  state: 'quarantined';
  identity: ProcessIdentity | null;
  quarantine: Quarantine;
}

/** One instance's record; narrow on `state` for the fields that state has. */
export type Manifest = StartingManifest | RunningManifest | StoppingManifest | QuarantinedManifest;

/** No leading dot: a dot-name is hidden from ls and could be `.` or `..`. */
const ID_RE = /^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$/;
const ID_RULE = '1-128 characters of [A-Za-z0-9._-], not starting with a dot';

export function isValidId(id: unknown): id is string {
  return typeof id === 'string' && ID_RE.test(id);
}

export function assertId(id: unknown): asserts id is string {
  if (!isValidId(id))
    throw new InvalidArgError(`id must be ${ID_RULE}, got ${JSON.stringify(String(id)).slice(0, 80)}`);
}

/**
 * What release() accepts: any name an entry of a state dir can have (a
 * quarantined `bad id` or `.vm` included), but never one that reaches
 * outside it.
 */
export function assertEntryName(name: unknown): asserts name is string {
  const ok =
    typeof name === 'string' &&
    name !== '' &&
    name !== '.' &&
    name !== '..' &&
    !name.includes('/') &&
    !name.includes('\0') &&
    Buffer.byteLength(name) <= 255;
  if (!ok)
    throw new InvalidArgError(
      `not a name in a state dir (no "/", NUL, "." or ".."; at most 255 bytes): ${JSON.stringify(String(name)).slice(0, 80)}`,
    );
}

const isObj = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
const isStrArr = (v: unknown): v is string[] => Array.isArray(v) && v.every((s) => typeof s === 'string');
const isInt = (v: unknown, min: number) => typeof v === 'number' && Number.isSafeInteger(v) && v >= min;

/** Validates a decoded identity; returns a reason when it is malformed. Missing bootId/startTicks are allowed (verify says unrecorded). */
function identityProblem(v: unknown): string | null {
  if (!isObj(v)) return 'identity is not an object';
  if (!isInt(v.pid, 1) || (v.pid as number) > pidMax()) return `identity.pid is not an integer from 1 to ${pidMax()}`;
  if (v.bootId !== undefined && v.bootId !== null && typeof v.bootId !== 'string')
    return 'identity.bootId is not a string';
  if (v.startTicks !== undefined && v.startTicks !== null && !isInt(v.startTicks, 0))
    return 'identity.startTicks is not a non-negative integer';
  if (v.exe !== null && v.exe !== undefined && !(isObj(v.exe) && isInt(v.exe.dev, 0) && isInt(v.exe.ino, 0)))
    return 'identity.exe is malformed';
  if (v.pidfsId !== null && v.pidfsId !== undefined && !(typeof v.pidfsId === 'string' && /^\d{1,20}$/.test(v.pidfsId)))
    return 'identity.pidfsId is malformed';
  if (!isStrArr(v.argv)) return 'identity.argv is not a list of strings';
  if (v.pidNs !== undefined && v.pidNs !== null && !isInt(v.pidNs, 0)) return 'identity.pidNs is malformed';
  if (v.processPidNs !== undefined && v.processPidNs !== null && !isInt(v.processPidNs, 0))
    return 'identity.processPidNs is malformed';
  return null;
}

/** Decodes manifest text (version 1 or 2); throws BadManifestError naming what is wrong. Never trusts a field it has not checked. */
export function decodeManifest(text: string, path: string, expectedId?: string): Manifest {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch (err) {
    throw new BadManifestError(path, 'not valid JSON', { cause: err });
  }
  if (!isObj(v)) throw new BadManifestError(path, 'not a JSON object');
  if (!READABLE_VERSIONS.includes(v.version))
    throw new BadManifestError(path, `unknown schema version ${JSON.stringify(v.version)}`);
  const bad = (why: string) => new BadManifestError(path, why);
  if (!isValidId(v.id)) throw bad('id is malformed');
  if (expectedId !== undefined && v.id !== expectedId)
    throw bad(`id ${JSON.stringify(v.id)} does not match its directory ${JSON.stringify(expectedId)}`);
  if (typeof v.token !== 'string' || !/^[0-9a-f]{32}$/.test(v.token)) throw bad('token is not 32 hex digits');
  const states =
    v.version === MANIFEST_VERSION
      ? ['starting', 'running', 'stopping', 'quarantined']
      : ['starting', 'running', 'quarantined'];
  if (!states.includes(v.state as string)) throw bad(`unknown state ${JSON.stringify(v.state)}`);
  if (typeof v.command !== 'string' || v.command === '') throw bad('command is malformed');
  if (!isStrArr(v.args)) throw bad('args is not a list of strings');
  if (v.tokenMode !== undefined && v.tokenMode !== 'argv' && v.tokenMode !== 'env') throw bad('tokenMode is malformed');
  // An env-mode launch's argv is fixed (the token is in its environment); a launcher's may assemble the token.
  if (v.tokenMode !== 'env' && v.pidSource === 'child' && !v.args.some((a) => a.includes(v.token as string))) {
    throw bad('args do not carry the token');
  }
  if (!isStrArr(v.expect)) throw bad('expect is not a list of strings');
  if (!isStrArr(v.paths)) throw bad('paths is not a list of strings');
  if (v.pidSource !== 'child' && v.pidSource !== 'file' && v.pidSource !== 'function')
    throw bad('pidSource is malformed');
  if (v.pidFile !== null && !(typeof v.pidFile === 'string' && v.pidFile.startsWith('/')))
    throw bad('pidFile is not an absolute path');
  if (v.executable !== null && !(typeof v.executable === 'string' && v.executable !== ''))
    throw bad('executable is malformed');
  if (!isInt(v.supervisorPid, 1)) throw bad('supervisorPid is malformed');
  if (v.uid !== undefined && v.uid !== null && !isInt(v.uid, 0)) throw bad('uid is malformed');
  if (
    v.forkImage !== undefined &&
    v.forkImage !== null &&
    !(typeof v.forkImage === 'string' && /^[1-9]\d{0,19}(:[1-9]\d{0,19}){2}$/.test(v.forkImage))
  )
    throw bad('forkImage is malformed');
  if (v.session !== undefined && v.session !== null && !(isInt(v.session, 1) && (v.session as number) <= pidMax()))
    throw bad('session is malformed');
  if (v.cgroup !== undefined && v.cgroup !== null) {
    const c = v.cgroup;
    const ok = isObj(c) && typeof c.path === 'string' && c.path.startsWith('/') && !c.path.includes('\0');
    if (!ok || typeof c.id !== 'string' || !/^\d{1,20}$/.test(c.id)) throw bad('cgroup is malformed');
  }
  if (v.identity !== null) {
    const problem = identityProblem(v.identity);
    if (problem) throw bad(problem);
  }
  if (v.quarantine !== null && !(isObj(v.quarantine) && typeof v.quarantine.reason === 'string'))
    throw bad('quarantine is malformed');
  // Each state has the fields custody writes in it, and only those: a mix is no state custody was ever in.
  if (v.logs !== undefined && v.logs !== null) {
    const l = v.logs;
    if (!(isObj(l) && isInt(l.maxBytes, 0) && isInt(l.keep, 0))) throw bad('logs is malformed');
  }
  if (v.launcherExits !== undefined && typeof v.launcherExits !== 'boolean') throw bad('launcherExits is malformed');
  if ((v.state === 'running' || v.state === 'stopping') && v.identity === null)
    throw bad(`a ${v.state} manifest has no identity`);
  if (v.state === 'stopping' && !(typeof v.stoppingSince === 'string')) throw bad('stoppingSince is malformed');
  // Before version 3 a starting manifest never held the confirmed identity.
  if (v.state === 'starting' && v.identity !== null && v.version !== MANIFEST_VERSION)
    throw bad('a starting manifest has an identity');
  if (v.state === 'quarantined' && v.quarantine === null) throw bad('a quarantined manifest has no quarantine');
  if (v.state !== 'quarantined' && v.quarantine !== null) throw bad(`a ${v.state} manifest has a quarantine`);
  return v as unknown as Manifest;
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

const O_DIR = fsc.O_RDONLY | fsc.O_DIRECTORY | fsc.O_NOFOLLOW;

/** Reads and decodes one entry's manifest; a bad name, a symlinked dir or file, or a bad document throws BadManifestError. */
function readManifest(sd: StateDir, name: string): Manifest {
  const path = sd.show(name, MANIFEST);
  if (!isValidId(name)) throw new BadManifestError(path, `${JSON.stringify(name)} is not an instance id (${ID_RULE})`);
  let dfd: number;
  try {
    dfd = openSync(sd.at(name), O_DIR);
  } catch (err) {
    throw instanceDirError(path, err);
  }
  try {
    let r: ReturnType<typeof readPlainFile>;
    try {
      r = readPlainFile(`${pathOf(dfd, sd.at(name))}/${MANIFEST}`, MAX_MANIFEST_BYTES);
    } catch (err) {
      if (errnoCode(err) === 'ENOENT') throw new IncompleteInstanceError(path);
      throw new BadManifestError(path, `unreadable (${errnoCode(err)})`, { cause: err });
    }
    if ('problem' in r) throw new BadManifestError(path, `manifest ${r.problem}`);
    return decodeManifest(r.data.toString('utf8'), path, name);
  } finally {
    closeSync(dfd);
  }
}

/** An instance dir that O_DIRECTORY | O_NOFOLLOW could not open, as readManifest and manifestFromRead both say it. */
function instanceDirError(path: string, err: unknown): BadManifestError {
  const code = errnoCode(err);
  if (code === 'ENOTDIR' || code === 'ELOOP')
    return new BadManifestError(path, 'instance dir is a symlink or not a directory', { cause: err });
  return new BadManifestError(path, `instance dir unreadable (${code})`, { cause: err });
}

/**
 * readManifest's answer from what the backend's readFilesAt found at
 * <name>/manifest.json: the same manifest, or the same BadManifestError,
 * for the same cases (a symlinked dir, no manifest, a FIFO, too large...).
 */
function manifestFromRead(sd: StateDir, name: string, r: FileRead): Manifest {
  const path = sd.show(name, MANIFEST);
  if (Buffer.isBuffer(r)) return decodeManifest(r.toString('utf8'), path, name);
  if (!(r instanceof Error)) {
    const problem = r.swapped
      ? REPLACED_WHILE_OPENING
      : !typeOfMode(r.mode).isFile()
        ? `is ${fileKind(typeOfMode(r.mode))}`
        : refusedSize(r.size, MAX_MANIFEST_BYTES);
    throw new BadManifestError(path, `manifest ${problem}`);
  }
  const code = errnoCode(r);
  const { syscall } = r as NodeJS.ErrnoException;
  if (syscall === 'opendir') throw instanceDirError(path, r);
  // Gone by the lstat, or between it and the open: readManifest says the same of either.
  if ((syscall === 'lstat' || syscall === 'open') && code === 'ENOENT') throw new IncompleteInstanceError(path);
  // Swapped between the lstat and the open.
  const refused = syscall === 'open' ? refusedOpen(code) : null;
  if (refused !== null) throw new BadManifestError(path, `manifest ${refused}`);
  throw new BadManifestError(path, `unreadable (${code})`, { cause: r });
}

/** Manifests a readMany() batch reads on the threadpool: a batch per thread of libuv's pool, for the few thousand of a busy host. */
const READ_BATCH = 1024;

/** The entries of a state dir that may be instances (dirs and symlinks), and the files custody did not write. */
function scan(sd: StateDir): { names: string[]; foreign: Array<{ name: string; kind: string }> } {
  const names: string[] = [];
  const foreign: Array<{ name: string; kind: string }> = [];
  for (const entry of sd.entries()) {
    const { name } = entry;
    if (isReservedName(name)) continue;
    // The type readdir gave (one getdents for the whole dir, no lstat per entry), else lstat's.
    let st: FileType = entry;
    if (!typeKnown(entry)) {
      try {
        st = lstatSync(sd.at(name));
      } catch {
        continue;
      }
    }
    if (st.isDirectory() || st.isSymbolicLink()) names.push(name);
    else foreign.push({ name, kind: fileKind(st) });
  }
  return { names, foreign };
}

let tmpCounter = 0;

export interface StateStoreOptions {
  /** Where warnings go: files custody left because it did not write them. */
  emit: Emit;
  /** Create the state dir when missing (default true); false: ERR_CUSTODY_NO_STATE_DIR and nothing created. */
  create?: boolean;
}

export class StateStore {
  /** The state dir's path, made absolute. */
  readonly dir: string;
  /** The format the dir had before this open stamped it (1: custody 0.1's; null: it was new). */
  readonly upgradedFrom: number | null;
  #sd: StateDir;
  #lock: StateLock;
  #emit: Emit;
  #closed = false;
  /** Top-level files already warned about: ids() runs at every recovery and log prune, the warning once. */
  #warned = new Set<string>();

  private constructor(sd: StateDir, lock: StateLock, emit: Emit, upgradedFrom: number | null) {
    this.dir = sd.path;
    this.#sd = sd;
    this.#lock = lock;
    this.#emit = emit;
    this.upgradedFrom = upgradedFrom;
  }

  /**
   * Opens a state dir for a supervisor: checks it (statedir.ts), takes its
   * lock, and stamps it if it was new or custody 0.1's. Refuses, writing
   * nothing, a dir that is not custody's.
   */
  static async open(path: string, options: StateStoreOptions): Promise<StateStore> {
    const sd = StateDir.open(path, { create: options.create !== false });
    let lock: StateLock | undefined;
    try {
      lock = await StateLock.acquire(sd);
      // Judged again under the lock: another opener may have stamped it meanwhile.
      const before = sd.classify();
      if (before !== STATE_FORMAT) sd.stamp();
      return new StateStore(sd, lock, options.emit, before === STATE_FORMAT ? null : before);
    } catch (err) {
      lock?.release();
      sd.close();
      throw err;
    }
  }

  /** Entries to recover, sorted: dirs and symlinks. A file at the top is not custody's: a warning (once), left alone. */
  ids(): string[] {
    const { names, foreign } = scan(this.#held());
    for (const f of foreign) {
      if (this.#warned.has(f.name)) continue;
      this.#warned.add(f.name);
      this.#emit('warning', {
        path: this.#sd.show(f.name),
        message: `${this.#sd.show(f.name)} is ${f.kind} custody did not write; left alone`,
      });
    }
    return names;
  }

  read(name: string): Manifest {
    return readManifest(this.#held(), name);
  }

  /**
   * read() of each name, in order: its manifest, or the error read() would
   * have thrown. Where the backend reads files off the event loop (native),
   * in batches on the threadpool; elsewhere here, one by one.
   */
  async readMany(names: readonly string[]): Promise<Array<Manifest | Error>> {
    const sd = this.#held();
    const one = (read: () => Manifest): Manifest | Error => {
      try {
        return read();
      } catch (err) {
        return err as Error;
      }
    };
    const readFilesAt = backend.readFilesAt?.bind(backend);
    if (!readFilesAt) return names.map((name) => one(() => readManifest(sd, name)));
    // Only ids reach the disk: readManifest refuses any other name unread.
    const ids = names.filter(isValidId);
    const batches: Array<Promise<Array<FileRead | null> | null>> = [];
    for (let at = 0; at < ids.length; at += READ_BATCH) {
      const batch = ids.slice(at, at + READ_BATCH);
      // A batch that fails whole (ENOMEM) is read here instead, so each name still gets its own answer.
      batches.push(this.#busy(() => readFilesAt(sd.fd, batch, MANIFEST, MAX_MANIFEST_BYTES)).catch(() => null));
    }
    const reads = new Map<string, FileRead>();
    let k = 0;
    for (const batch of await Promise.all(batches)) {
      if (!batch) {
        k += READ_BATCH;
        continue;
      }
      for (const r of batch) {
        const name = ids[k++] as string;
        // null: left unread by a batch that had read its fill; read below.
        if (r !== null) reads.set(name, r);
      }
    }
    return names.map((name) => {
      const r = reads.get(name);
      // Held again: the store may have been closed while the batches ran.
      return one(() => (r === undefined ? readManifest(this.#held(), name) : manifestFromRead(sd, name, r)));
    });
  }

  /**
   * Writes, removals and fsyncs under way: they reach the dir through its fd
   * from the threadpool, so close() leaves the fd (and the lock) to the last
   * of them. Freed under them, the fd's number could be reused, and an unlink
   * aimed at another directory.
   */
  #working = 0;

  async #busy<T>(work: () => Promise<T>): Promise<T> {
    this.#held();
    this.#working++;
    try {
      return await work();
    } finally {
      if (--this.#working === 0 && this.#closed) this.#release();
    }
  }

  /** The held dir; after close() its fd number may name something else, so nothing reaches it. */
  #held(): StateDir {
    if (this.#closed) throw new CustodyError('ERR_CUSTODY_CLOSED', `the state store of ${this.dir} is closed`);
    return this.#sd;
  }

  /** Refuses (ERR_CUSTODY_UNSAFE_PATH) when the state dir's path no longer leads to the dir held since open. */
  assertInPlace(): void {
    this.#held().assertInPlace();
  }

  /**
   * Writes a manifest atomically, as version MANIFEST_VERSION whatever it
   * was read as: temp file, fsync, rename, fsync of the dir (and of the
   * state dir when the instance dir is new). Creates the instance dir
   * (0700) if needed; a write that fails leaves no dir it created. The
   * fsyncs run off the event loop: on a disk each costs a millisecond that
   * concurrent launches need not wait for. `sync: true` makes them on this
   * thread, for a write that a signal waits for (a stop's), which a busy
   * threadpool must not hold up.
   */
  async write(m: Manifest, options: { sync?: boolean } = {}): Promise<void> {
    assertId(m.id);
    return this.#busy(() => this.#write(m, options.sync === true ? fsyncNow : fsyncAsync));
  }

  async #write(m: Manifest, fsyncAsync: (fd: number) => Promise<void>): Promise<void> {
    const at = this.#held().at(m.id);
    let created = false;
    let dfd = -1;
    let tmp: string | null = null;
    let renamed: string | null = null;
    try {
      try {
        mkdirSync(at, { mode: 0o700 });
        created = true;
      } catch (err) {
        if (errnoCode(err) !== 'EEXIST') throw err;
      }
      try {
        dfd = openSync(at, O_DIR);
      } catch (err) {
        const code = errnoCode(err);
        if (code === 'ENOTDIR' || code === 'ELOOP')
          throw new UnsafePathError(
            this.#sd.show(m.id),
            'is a symlink or not a directory; an instance dir is never followed',
          );
        throw err;
      }
      const base = pathOf(dfd, at);
      // The lock makes this process the only writer: pid and a counter are unique enough.
      tmp = `${base}/.manifest.${process.pid}.${++tmpCounter}.tmp`;
      // Open and write land in the page cache at once; only the fsync, the
      // part that waits for the device, leaves the event loop.
      const fd = openSync(tmp, fsc.O_WRONLY | fsc.O_CREAT | fsc.O_EXCL | fsc.O_NOFOLLOW, 0o600);
      try {
        const data = Buffer.from(`${JSON.stringify({ ...m, version: MANIFEST_VERSION }, null, 2)}\n`);
        let off = 0;
        while (off < data.length) off += writeSync(fd, data, off, data.length - off);
        await fsyncAsync(fd);
      } finally {
        closeSync(fd);
      }
      renameSync(tmp, `${base}/${MANIFEST}`);
      renamed = `${base}/${MANIFEST}`;
      tmp = null;
      // A new instance dir is an entry of the state dir: make it durable too,
      // or a crash could lose the dir and the manifest with it.
      await Promise.all([fsyncAsync(dfd), created ? this.#sd.fsync() : undefined]);
    } catch (err) {
      // Undo only what this write made: its temp file, and a dir it created (with the manifest in it).
      const [madeTmp, madeManifest] = [tmp, renamed];
      if (madeTmp) this.#undo(m.id, () => unlinkSync(madeTmp));
      if (created) {
        if (madeManifest) this.#undo(m.id, () => unlinkSync(madeManifest));
        this.#undo(m.id, () => rmdirSync(at));
      }
      if (err instanceof CustodyError) throw err;
      throw new StateIOError(`cannot write the manifest of ${m.id}`, err);
    } finally {
      if (dfd >= 0) closeSync(dfd);
    }
  }

  #undo(id: string, step: () => void): void {
    try {
      step();
    } catch (err) {
      const code = errnoCode(err);
      if (code !== 'ENOENT' && code !== 'ENOTEMPTY') {
        this.#emit('warning', {
          id,
          message: `could not undo a failed write of ${this.#sd.show(id)}: ${(err as Error).message}`,
        });
      }
    }
  }

  /**
   * Removes an entry's state: the manifest, custody's temp files, the dir;
   * a symlink is unlinked, never followed. Files custody did not write are
   * left with a warning naming them, and the instance counts as removed.
   * `removed`: whether anything custody wrote was there to remove.
   */
  /**
   * `sync: false` leaves the state dir's fsync to a later syncDir(): recovery
   * cleans many gone instances with one fsync (a crash before it only brings
   * back manifests of processes proven gone, which the next recovery cleans).
   * Such a batch's lstat, unlink and rmdir also run on the threadpool
   * (removeOnPool): on a journaling file system they cost ~0.5 ms an
   * instance, which recovery overlaps with judging the next manifests. A lone
   * removal (a stop, an exit) makes them at once, on this thread: its state is
   * gone by the time its status says so.
   */
  async remove(name: string, options: { sync?: boolean } = {}): Promise<{ removed: boolean; left: string[] }> {
    assertEntryName(name);
    return this.#busy(() => this.#remove(name, options.sync !== false));
  }

  async #remove(name: string, sync: boolean): Promise<{ removed: boolean; left: string[] }> {
    const at = this.#held().at(name);
    const show = this.#sd.show(name);
    // A batch's common case first, on the threadpool; what it leaves, the careful way below.
    const pooled = sync ? 'none' : await removeOnPool(at);
    if (pooled === 'all') return { removed: true, left: [] };
    try {
      // The dir is opened first, never followed: the files go through this
      // fd, so a symlink renamed to <name> meanwhile is never followed out of
      // the state dir; only the last rmdir is by name (it removes nothing but
      // an empty dir). What is not a dir is looked at only then.
      let dfd: number;
      try {
        dfd = openSync(at, O_DIR);
      } catch (err) {
        const code = errnoCode(err);
        if (code === 'ENOENT') return { removed: false, left: [] };
        if (code !== 'ENOTDIR' && code !== 'ELOOP') throw err;
        return await this.#removeNonDir(name, at, sync, pooled === 'manifest');
      }
      let removed = pooled === 'manifest';
      let left: string[] = [];
      try {
        const base = pathOf(dfd, at);
        try {
          unlinkSync(`${base}/${MANIFEST}`);
          removed = true;
        } catch (err) {
          if (errnoCode(err) !== 'ENOENT') throw err;
        }
        try {
          rmdirSync(at);
          removed = true;
        } catch (err) {
          const code = errnoCode(err);
          if (code !== 'ENOTEMPTY' && code !== 'EEXIST') throw err;
          const temps = removeTemps(base);
          left = temps.left;
          removed ||= temps.removed;
          if (left.length === 0) {
            rmdirSync(at);
            removed = true;
          } else {
            this.#emit('warning', {
              id: name,
              path: show,
              left,
              message: `${show}: left ${left.map((n) => JSON.stringify(n)).join(', ')}, which custody did not write; the instance's own state is removed`,
            });
          }
        }
      } finally {
        closeSync(dfd);
      }
      if (sync) await this.#sd.fsync();
      return { removed, left };
    } catch (err) {
      if (err instanceof CustodyError) throw err;
      throw new StateIOError(`cannot remove the state of ${name}`, err);
    }
  }

  /** <name> is not a dir: a symlink custody may unlink (never followed), or something it did not write, left. */
  async #removeNonDir(
    name: string,
    at: string,
    sync: boolean,
    removedSoFar: boolean,
  ): Promise<{ removed: boolean; left: string[] }> {
    const show = this.#sd.show(name);
    let st: Stats;
    try {
      st = lstatSync(at);
    } catch (err) {
      if (errnoCode(err) === 'ENOENT') return { removed: removedSoFar, left: [] };
      throw err;
    }
    if (st.isSymbolicLink()) {
      unlinkSync(at);
      if (sync) await this.#sd.fsync();
      return { removed: true, left: [] };
    }
    const message = st.isDirectory()
      ? `${show} changed while it was removed; left alone`
      : `${show} is ${fileKind(st)} custody did not write; left alone`;
    this.#emit('warning', { id: name, path: show, message });
    return { removed: removedSoFar, left: [name] };
  }

  /** Makes earlier removals durable: one fsync of the state dir. */
  async syncDir(): Promise<void> {
    return this.#busy(async () => {
      try {
        await this.#sd.fsync();
      } catch (err) {
        throw new StateIOError('cannot sync the state dir', err);
      }
    });
  }

  /** Releases the lock and the dir. Supervised processes are not affected. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    if (this.#working === 0) this.#release();
  }

  #release(): void {
    try {
      this.#lock.release();
    } finally {
      this.#sd.close();
    }
  }
}

/**
 * A batched removal's common case, on libuv's threadpool: an instance dir
 * holding only its manifest. 'all': removed; 'manifest': its manifest only
 * (the dir holds more); 'none': nothing (not a plain dir, or an error), all
 * left to the careful path, which reports what it finds.
 */
async function removeOnPool(at: string): Promise<'all' | 'manifest' | 'none'> {
  // Each step waits its turn in the pool's queue, and anything may run
  // meanwhile: the unlink goes through the dir the open pinned, never
  // through a symlink renamed to the instance's name in between.
  let dir: FileHandle;
  try {
    dir = await open(at, O_DIR);
  } catch {
    return 'none';
  }
  try {
    await unlink(`${pathOf(dir.fd, at)}/${MANIFEST}`);
  } catch {
    return 'none';
  } finally {
    await dir.close();
  }
  try {
    await rmdir(at);
    return 'all';
  } catch {
    return 'manifest';
  }
}

/** Unlinks custody's temp files in an instance dir; returns the names of what else it holds. */
function removeTemps(at: string): { removed: boolean; left: string[] } {
  let names: string[];
  try {
    names = readdirSync(at);
  } catch (err) {
    return { removed: false, left: [`(not listed: ${errnoCode(err)})`] };
  }
  let removed = false;
  const left: string[] = [];
  for (const n of names) {
    if (!isTempName(n)) {
      left.push(n);
      continue;
    }
    try {
      unlinkSync(`${at}/${n}`);
      removed = true;
    } catch (err) {
      if (errnoCode(err) !== 'ENOENT') throw err;
    }
  }
  return { removed, left };
}

export interface StateListing {
  /** The state dir's path, made absolute. */
  stateDir: string;
  /** STATE_FORMAT: stamped; 1: left by custody 0.1 (stamped by the next open); null: empty. */
  format: number | null;
  /** Every entry that may be an instance, sorted by name, with its manifest or why it has none. */
  entries: Array<
    | { name: string; manifest: Manifest; error?: undefined }
    | { name: string; manifest?: undefined; error: BadManifestError }
  >;
  /** Files at the top that custody did not write. */
  foreign: string[];
}

/**
 * A read-only look at a state dir (custody ls): the same checks as open,
 * no lock, nothing created or written. A dir that does not exist is
 * ERR_CUSTODY_NO_STATE_DIR; one that is not custody's, ERR_CUSTODY_NOT_CUSTODY_DIR.
 */
export function readStateDir(path: string): StateListing {
  const sd = StateDir.open(path, { create: false });
  try {
    const { names, foreign } = scan(sd);
    const entries: StateListing['entries'] = names.map((name) => {
      try {
        return { name, manifest: readManifest(sd, name) };
      } catch (err) {
        if (err instanceof BadManifestError) return { name, error: err };
        throw err;
      }
    });
    return { stateDir: sd.path, format: sd.format, entries, foreign: foreign.map((f) => f.name) };
  } finally {
    sd.close();
  }
}

const fsyncAsync = promisify(fsync);
const fsyncNow = async (fd: number): Promise<void> => fsyncSync(fd);
