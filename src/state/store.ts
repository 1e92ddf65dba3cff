/**
 * The state store: a supervisor's hold on its state dir (the lock, the dir
 * held open) and the manifests' writes and removals through it. The schema
 * is manifest.ts's, the reads reads.ts's. Manifests:
 * <stateDir>/<id>/manifest.json, one per instance, reached only through the
 * state dir held open (statedir.ts), never through a symlink.
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
  openSync,
  mkdirSync,
  readdirSync,
  renameSync,
  rmdirSync,
  unlinkSync,
  writeSync,
  type Stats,
} from 'node:fs';
import { type FileHandle, open, rmdir, unlink } from 'node:fs/promises';
import { promisify } from 'node:util';
import { CustodyError, StateIOError, UnsafePathError } from '../errors.js';
import type { Emit } from '../events.js';
import { StateLock } from './lock.js';
import { fileKind } from './files.js';
import { assertEntryName, assertId, MANIFEST, MANIFEST_VERSION, type Manifest } from './manifest.js';
import { O_DIR, readManifest, readManifests, scan } from './reads.js';
import { type CgroupRecord, errnoCode, pathOf, STATE_FORMAT, StateDir } from './statedir.js';

/** Temp files of a write: .manifest.<pid>.<n>.tmp (0.1 named them so too). */
const isTempName = (name: string) => name.startsWith('.manifest.') && name.endsWith('.tmp');

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

  /** The sub-cgroup this dir's supervisor made, as recorded beside the stamp (src/process/cgroup-guard.ts). */
  readCgroupRecord(): CgroupRecord | { problem: string } | null {
    return this.#held().readCgroupRecord();
  }

  writeCgroupRecord(record: CgroupRecord): void {
    this.#held().writeCgroupRecord(record);
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
    return readManifests(
      () => this.#held(),
      names,
      (work) => this.#busy(work),
    );
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
    return this.#busy(() => this.#write(m, options.sync === true ? fsyncSync : fsyncAsync));
  }

  /**
   * `durable` is fsyncSync for a write made wholly on this thread: it then holds its fds across no await, so
   * five thousand stops begun in one turn of the loop hold two fds at a time between them, not ten thousand.
   */
  async #write(m: Manifest, durable: (fd: number) => void | Promise<void>): Promise<void> {
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
        const synced = durable(fd);
        // No await for a sync one: even `await undefined` lets every other write open its fds meanwhile.
        if (synced) await synced;
      } finally {
        closeSync(fd);
      }
      renameSync(tmp, `${base}/${MANIFEST}`);
      renamed = `${base}/${MANIFEST}`;
      tmp = null;
      // A new instance dir is an entry of the state dir: make it durable too,
      // or a crash could lose the dir and the manifest with it.
      const dirs = [durable(dfd), created ? this.#sd.fsync() : undefined];
      if (dirs.some((d) => d instanceof Promise)) await Promise.all(dirs);
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

const fsyncAsync = promisify(fsync);
