/**
 * Reading manifests: one, a batch of many on the threadpool (recovery of a
 * busy host), and the read-only listing of a state dir (custody ls). Apart
 * from the store's writes and removals so that each stays under the size a
 * reader can hold; it needs no lock, which is why readStateDir lives here.
 */
import { closeSync, constants as fsc, lstatSync, openSync } from 'node:fs';
import { BadManifestError } from '../errors.js';
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
import {
  decodeManifest,
  ID_RULE,
  IncompleteInstanceError,
  isValidId,
  MANIFEST,
  MAX_MANIFEST_BYTES,
  type Manifest,
} from './manifest.js';
import { errnoCode, isReservedName, pathOf, readPlainFile, StateDir } from './statedir.js';

export const O_DIR = fsc.O_RDONLY | fsc.O_DIRECTORY | fsc.O_NOFOLLOW;

/** Reads and decodes one entry's manifest; a bad name, a symlinked dir or file, or a bad document throws BadManifestError. */
export function readManifest(sd: StateDir, name: string): Manifest {
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
export function scan(sd: StateDir): { names: string[]; foreign: Array<{ name: string; kind: string }> } {
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

/**
 * StateStore.readMany's work: read() of each name, in order, its manifest or
 * the error read() would have thrown. `held` gives the dir while the store is
 * open; `busy` keeps it open while a batch runs on the threadpool.
 */
export async function readManifests(
  held: () => StateDir,
  names: readonly string[],
  busy: <T>(work: () => Promise<T>) => Promise<T>,
): Promise<Array<Manifest | Error>> {
  const sd = held();
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
    batches.push(busy(() => readFilesAt(sd.fd, batch, MANIFEST, MAX_MANIFEST_BYTES)).catch(() => null));
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
    return one(() => (r === undefined ? readManifest(held(), name) : manifestFromRead(sd, name, r)));
  });
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
