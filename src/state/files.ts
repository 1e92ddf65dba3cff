/**
 * Opening paths that something else may control (pidfiles, logs): never
 * through a symlink, never a FIFO, socket or device, never blocking. Each
 * caller turns a refusal into its own error (ERR_CUSTODY_BAD_PIDFILE,
 * ERR_CUSTODY_BAD_LOG); other errno errors (ENOENT, EACCES) pass through.
 */
import { closeSync, constants as fsc, fstatSync, lstatSync, openSync, type Stats } from 'node:fs';

// O_NOFOLLOW: a symlink at the path is ELOOP. O_NONBLOCK: a FIFO swapped in
// after the check opens (or fails, ENXIO) at once instead of waiting for a
// peer. O_NOCTTY: a terminal never becomes our controlling tty. Node opens
// every fd O_CLOEXEC, so nothing custody spawns inherits one by accident.
const GUARD = fsc.O_NOFOLLOW | fsc.O_NONBLOCK | fsc.O_NOCTTY;

/** The file-type tests Stats and a Dirent both answer. */
export type FileType = Pick<
  Stats,
  'isFile' | 'isSymbolicLink' | 'isFIFO' | 'isCharacterDevice' | 'isBlockDevice' | 'isSocket' | 'isDirectory'
>;

/** Whether a Dirent carries its type: some file systems report DT_UNKNOWN, and then every test is false. */
export function typeKnown(t: FileType): boolean {
  return (
    t.isFile() ||
    t.isDirectory() ||
    t.isSymbolicLink() ||
    t.isFIFO() ||
    t.isSocket() ||
    t.isCharacterDevice() ||
    t.isBlockDevice()
  );
}

/** The file-type tests of a stat mode (st_mode's S_IFMT bits). */
export function typeOfMode(mode: number): FileType {
  const t = mode & fsc.S_IFMT;
  return {
    isFile: () => t === fsc.S_IFREG,
    isDirectory: () => t === fsc.S_IFDIR,
    isSymbolicLink: () => t === fsc.S_IFLNK,
    isFIFO: () => t === fsc.S_IFIFO,
    isSocket: () => t === fsc.S_IFSOCK,
    isCharacterDevice: () => t === fsc.S_IFCHR,
    isBlockDevice: () => t === fsc.S_IFBLK,
  };
}

/** What a file at a path is, for refusals that say why. */
export function fileKind(st: FileType): string {
  if (st.isFile()) return 'a regular file';
  if (st.isSymbolicLink()) return 'a symlink (never followed)';
  if (st.isFIFO()) return 'a FIFO';
  if (st.isCharacterDevice()) return 'a character device';
  if (st.isBlockDevice()) return 'a block device';
  if (st.isSocket()) return 'a socket';
  if (st.isDirectory()) return 'a directory';
  return 'not a regular file';
}

export type Opened = { fd: number; st: Stats } | { refused: string; cause?: unknown };

/**
 * Why a guarded open failed, for the errno codes that mean "not a regular
 * file" (swapped in after the look): ELOOP a symlink, ENXIO a FIFO without
 * a reader or a socket, EISDIR a dir. null for any other code: a plain error.
 * The one wording for openRegular and the addon's readFilesAt alike.
 */
export function refusedOpen(code: string | undefined): string | null {
  if (code === 'ELOOP') return 'is a symlink (never followed)';
  if (code === 'ENXIO') return 'is a FIFO or a socket';
  if (code === 'EISDIR') return 'is a directory';
  return null;
}

/** The refusal of a file the open's fstat found to be another than the one looked at. */
export const REPLACED_WHILE_OPENING = 'was replaced while it was being opened';

/** The refusal of a regular file larger than a reader's cap. */
export function refusedSize(size: number, maxBytes: number): string {
  return `is ${size} bytes, more than ${maxBytes}`;
}

/**
 * Opens a regular file with `flags` (plus O_NOFOLLOW | O_NONBLOCK |
 * O_NOCTTY). Whatever is at the path is looked at first and refused unopened
 * when it is not a regular file (opening a device can have effects of its
 * own, e.g. arming a watchdog); the fd is then checked to be that very file.
 */
export function openRegular(path: string, flags: number, mode = 0o600): Opened {
  let before: Stats | null = null;
  try {
    before = lstatSync(path);
  } catch (err) {
    // Absent: only an O_CREAT open goes on, and creates a regular file.
    if ((err as NodeJS.ErrnoException).code !== 'ENOENT' || !(flags & fsc.O_CREAT)) throw err;
  }
  if (before && !before.isFile()) return { refused: `is ${fileKind(before)}` };
  let fd: number;
  try {
    fd = openSync(path, flags | GUARD, mode);
  } catch (err) {
    // Swapped since the lstat.
    const refused = refusedOpen((err as NodeJS.ErrnoException).code);
    if (refused !== null) return { refused, cause: err };
    throw err;
  }
  const st = fstatSync(fd);
  const swapped = before !== null && (st.dev !== before.dev || st.ino !== before.ino);
  if (!st.isFile() || swapped) {
    closeSync(fd);
    return { refused: swapped ? REPLACED_WHILE_OPENING : `is ${fileKind(st)}` };
  }
  return { fd, st };
}
