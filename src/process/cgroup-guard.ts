/**
 * Whether custody may act through a cgroup directory: create its instances'
 * cgroups in it, or write cgroup.kill or cgroup.freeze there, or rmdir it.
 * A cgroup is a handle on every process in it, so a directory another uid
 * made or could replace would hand that uid the instances (or hand custody
 * that uid's processes to kill). One rule, used at open and before every
 * kill, freeze or removal:
 *
 * - the path is on a cgroup2 mount, and from the directory up to the mount
 *   point no dir belongs to another uid or is writable by group or others
 *   (the state dir's StrictModes walk, src/state/statedir.ts; a sticky dir
 *   above is excused as it is there, the directory itself never is);
 * - the directory is the cgroup recorded: its inode is the kernel's cgroup
 *   id, and a cgroup removed and made again under the same name has another.
 *
 * The supervisor's own sub-cgroup (`custody-<hash of the state dir>`) is
 * recorded beside the state dir's stamp when custody makes it, with the boot
 * it was made in: only a directory with that id is reused, on that boot. A
 * boot's cgroups go with it, so on a new boot custody makes the directory
 * and records it anew; one already there was made by someone else. A dir
 * without a record (custody 0.2 kept none, and may have left instances in
 * it) is taken once the walk passes, and recorded.
 */
import { createHash } from 'node:crypto';
import { type BigIntStats, lstatSync, mkdirSync, realpathSync, rmdirSync, statfsSync } from 'node:fs';
import * as path from 'node:path';
import { backend } from '../backend/index.js';
import { CGROUP2_SUPER_MAGIC, cgroup2Mounts, hierarchyPath, type MountEntry, mountOf } from '../backend/cgroupv2.js';
import { BadCgroupError, UnsafePathError } from '../errors.js';
import { type CgroupRecord, checkTrusted, errnoCode } from '../state/statedir.js';

/** Where a supervisor keeps the record of its sub-cgroup (the state store). */
export interface CgroupRecordFile {
  readCgroupRecord(): CgroupRecord | { problem: string } | null;
  writeCgroupRecord(record: CgroupRecord): void;
}

/** A cgroup custody may act through: its path, its path in the hierarchy (as /proc/<pid>/cgroup names it), its id. */
export interface CgroupPlace {
  path: string;
  node: string;
  id: string;
}

/** The name of a supervisor's sub-cgroup in a root: `custody-<16 hex digits of the state dir's real path's hash>`. */
export function ownCgroupName(stateDir: string): string {
  return `custody-${createHash('sha256').update(realpathSync(stateDir)).digest('hex').slice(0, 16)}`;
}

/** How long a reading of the cgroup2 mounts serves: a mount moved meanwhile fails closed (statfs confirms each path, and a path on no mount read is refused). */
const MOUNTS_TTL_MS = 1000;
let mounts: { at: number; list: MountEntry[] } | null = null;

/** The cgroup2 mounts, read at most once a second: recovery judges a cgroup per instance, thousands on a busy host. */
function cgroupMounts(): MountEntry[] {
  const now = performance.now();
  if (!mounts || now - mounts.at > MOUNTS_TTL_MS) mounts = { at: now, list: cgroup2Mounts(backend.mountinfo()) };
  return mounts.list;
}

/** The cgroup2 mount `dir` (absolute, normalized, existing) is on, confirmed by statfs; UnsafePathError if none. */
function mountOfCgroup(dir: string): MountEntry {
  if (!path.isAbsolute(dir) || path.resolve(dir) !== dir)
    throw new UnsafePathError(dir, 'is not an absolute, normalized path; a cgroup is recorded by its real path');
  const mount = mountOf(dir, cgroupMounts());
  if (!mount || statfsSync(dir).type !== CGROUP2_SUPER_MAGIC)
    throw new UnsafePathError(dir, 'is not on a cgroup v2 mount; custody acts through no other directory');
  return mount;
}

/** The StrictModes walk from a cgroup dir up to its mount point; the dir's own stats (bigint: the id is 64-bit). */
function trusted(dir: string, mount: MountEntry, what: string): BigIntStats {
  checkTrusted(dir, { leaf: 'root-or-own', what, top: mount.mountPoint });
  const st = lstatSync(dir, { bigint: true });
  if (!st.isDirectory()) throw new UnsafePathError(dir, 'is not a directory (a cgroup is one)');
  return st;
}

/**
 * The cgroup a manifest recorded, found by its path whatever root (or none)
 * this supervisor has: 'gone' where no directory is there; UnsafePathError
 * (thrown) where one is there that custody may not act through: an untrusted
 * path, or another cgroup than the recorded one.
 */
export function recordedCgroup(recorded: { path: string; id: string }): CgroupPlace | 'gone' {
  const dir = recorded.path;
  try {
    lstatSync(dir);
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return 'gone';
    throw err;
  }
  const mount = mountOfCgroup(dir);
  const st = trusted(dir, mount, 'cgroup');
  if (String(st.ino) !== recorded.id) {
    throw new UnsafePathError(
      dir,
      `is cgroup ${st.ino}, not cgroup ${recorded.id} that custody recorded: it was removed and made again since`,
    );
  }
  return { path: dir, node: hierarchyPath(dir, mount), id: recorded.id };
}

/**
 * The check before a cgroup.kill, a cgroup.freeze or an rmdir of a cgroup
 * custody holds: throws UnsafePathError where the path is untrusted or the
 * directory is another cgroup now. A cgroup that is gone passes: the write or
 * the rmdir then finds nothing, as it would have anyway.
 */
export function guardCgroup(cg: { path: string; id: string }): void {
  recordedCgroup(cg);
}

/**
 * The root, checked (and created where absent, once the dir it goes in is
 * checked), then the supervisor's sub-cgroup `dir` in it: made, or reused
 * where it is the one recorded this boot. Returns the sub-cgroup's id. A
 * directory custody made here and then refused is removed: nothing is left
 * half-done.
 */
export function claimOwnCgroup(options: {
  root: string;
  dir: string;
  mount: MountEntry;
  record: CgroupRecordFile | null;
  warn: (message: string) => void;
}): string {
  const { root, dir, mount, record, warn } = options;
  prepareRoot(root, mount);
  let made = false;
  try {
    mkdirSync(dir, { mode: 0o755 });
    made = true;
  } catch (err) {
    if (errnoCode(err) !== 'EEXIST')
      throw new BadCgroupError(root, `could not create ${dir} (${errnoCode(err)})`, { cause: err });
  }
  try {
    const id = String(trusted(dir, mount, 'cgroup').ino);
    const bootId = backend.bootId();
    const kept = record?.readCgroupRecord() ?? null;
    if (kept && 'problem' in kept) warn(`${kept.problem}; the cgroup ${dir} is recorded anew`);
    const recorded = kept && !('problem' in kept) && kept.path === dir ? kept : null;
    // Made now, it replaces one custody removed on close or one of another boot; found, it must be the one recorded.
    if (!made && recorded) {
      const why =
        recorded.bootId !== bootId
          ? `was made on this boot by someone other than custody (custody recorded cgroup ${recorded.id} there on another boot)`
          : recorded.id !== id
            ? `is cgroup ${id}, not cgroup ${recorded.id} that custody made for this state dir on this boot: someone removed it and made another`
            : null;
      if (why) throw new UnsafePathError(dir, `${why}; remove it (once empty) to let custody make its own`);
    }
    if (record && (recorded?.id !== id || recorded.bootId !== bootId))
      record.writeCgroupRecord({ path: dir, id, bootId });
    return id;
  } catch (err) {
    if (made) rmdirQuietly(dir);
    throw err;
  }
}

/** The root: where absent, the dir it goes in is checked and it is made; then it is checked itself. */
function prepareRoot(root: string, mount: MountEntry): void {
  let existing = root;
  while (!exists(existing) && existing !== mount.mountPoint) existing = path.dirname(existing);
  if (existing !== root) {
    checkTrusted(existing, { leaf: 'above', what: 'cgroup root', top: mount.mountPoint });
    try {
      mkdirSync(root, { recursive: true, mode: 0o755 });
    } catch (err) {
      throw new BadCgroupError(root, `could not create it (${errnoCode(err)})`, { cause: err });
    }
  }
  checkTrusted(root, { leaf: 'root-or-own', what: 'cgroup root', top: mount.mountPoint });
}

function exists(p: string): boolean {
  try {
    lstatSync(p);
    return true;
  } catch (err) {
    if (errnoCode(err) === 'ENOENT') return false;
    throw err;
  }
}

function rmdirQuietly(dir: string): void {
  try {
    rmdirSync(dir);
  } catch {
    // taken by a process meanwhile, or gone: either way not custody's to force
  }
}
