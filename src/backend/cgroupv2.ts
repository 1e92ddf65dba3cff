/**
 * Where cgroup v2 is and what it can do here: cgroup2 mounts read from
 * /proc/self/mountinfo (never assumed: a hybrid host has it at
 * /sys/fs/cgroup/unified, a modern one at /sys/fs/cgroup, a container
 * wherever its runtime put it), and the kernel's features, probed once.
 * Facts only; what custody does with them lives in src/process/cgroup.ts.
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import * as path from 'node:path';
import type { CgroupCapabilities } from '../types.js';

/** statfs(2) f_type of cgroup v2 (linux/magic.h CGROUP2_SUPER_MAGIC). */
export const CGROUP2_SUPER_MAGIC = 0x63677270;

export interface MountEntry {
  /** Where it is mounted, unescaped. */
  mountPoint: string;
  /** The directory of the filesystem mounted there (for cgroup2: the hierarchy path, from our cgroup namespace). */
  root: string;
  fsType: string;
  readOnly: boolean;
}

/** mountinfo escapes space, tab, newline and backslash as \\ooo. */
function unescapeField(field: string): string {
  return field.replace(/\\([0-7]{3})/g, (_m, oct: string) => String.fromCharCode(Number.parseInt(oct, 8)));
}

/**
 * Parses /proc/self/mountinfo text (proc(5)): `id parent maj:min root
 * mountpoint options [optional fields...] - fstype source superoptions`.
 * The optional fields vary in number; the lone "-" ends them. Malformed
 * lines are skipped.
 */
export function parseMountinfo(text: string): MountEntry[] {
  const out: MountEntry[] = [];
  for (const line of text.split('\n')) {
    const f = line.split(' ');
    const dash = f.indexOf('-', 6);
    if (f.length < 10 || dash < 0 || dash + 1 >= f.length) continue;
    const opts = (f[5] ?? '').split(',');
    const [root, mountPoint, fsType] = [f[3], f[4], f[dash + 1]];
    if (root === undefined || mountPoint === undefined || fsType === undefined) continue;
    out.push({
      root: unescapeField(root),
      mountPoint: unescapeField(mountPoint),
      fsType,
      readOnly: opts.includes('ro'),
    });
  }
  return out;
}

/** The cgroup2 mounts, in mountinfo order. */
export function cgroup2Mounts(mountinfo: string): MountEntry[] {
  return parseMountinfo(mountinfo).filter((m) => m.fsType === 'cgroup2');
}

/** The cgroup2 mount an absolute, normalized path lies on (the longest mount point that contains it), or null. */
export function mountOf(dir: string, mounts: readonly MountEntry[]): MountEntry | null {
  let best: MountEntry | null = null;
  for (const m of mounts) {
    const inside = dir === m.mountPoint || dir.startsWith(m.mountPoint === '/' ? '/' : `${m.mountPoint}/`);
    if (inside && (!best || m.mountPoint.length > best.mountPoint.length)) best = m;
  }
  return best;
}

/** A directory's path in the hierarchy, as /proc/<pid>/cgroup shows it: the mount's root plus the rest. */
export function hierarchyPath(dir: string, mount: MountEntry): string {
  return path.posix.join(mount.root, path.posix.relative(mount.mountPoint, dir));
}

/** Controllers listed in a cgroup's cgroup.controllers (or subtree_control); [] when it cannot be read. */
export function readControllers(dir: string, file = 'cgroup.controllers'): string[] {
  try {
    return readFileSync(path.join(dir, file), 'latin1').trim().split(/\s+/).filter(Boolean);
  } catch {
    return [];
  }
}

/** cgroup.kill (Linux 5.14) and cgroup.freeze (5.2) are in every non-root cgroup of a kernel that has them, never in the root. */
export function cgroupFeatures(nonRoot: string): { kill: boolean; freeze: boolean } {
  return {
    kill: existsSync(path.join(nonRoot, 'cgroup.kill')),
    freeze: existsSync(path.join(nonRoot, 'cgroup.freeze')),
  };
}

/** A non-root cgroup under the mount to look for feature files in: our own, else any child of the mount's root. */
function someNonRootCgroup(mount: MountEntry, ownCgroup: string | null): string | null {
  if (ownCgroup && ownCgroup !== mount.root && ownCgroup.startsWith(mount.root)) {
    const dir = path.join(mount.mountPoint, path.posix.relative(mount.root, ownCgroup));
    if (existsSync(path.join(dir, 'cgroup.procs'))) return dir;
  }
  try {
    const child = readdirSync(mount.mountPoint, { withFileTypes: true }).find((d) => d.isDirectory());
    return child ? path.join(mount.mountPoint, child.name) : null;
  } catch {
    return null;
  }
}

export interface CgroupProbeInput {
  platform: NodeJS.Platform;
  mountinfo: () => string;
  ownCgroup: () => string | null;
  /** The errno name clone3(CLONE_INTO_CGROUP) answered ('' works), or null where the backend cannot ask. */
  cloneIntoCgroup: string | null;
  placement: CgroupCapabilities['placement'];
  /** The running kernel is at least major.minor: the answer where no non-root cgroup is at hand to look in. */
  kernelAtLeast: (major: number, minor: number) => boolean;
}

/** What cgroup v2 offers on this host, described at its mount's root, or why there is none. */
export function probeCgroup(
  input: CgroupProbeInput,
): { cgroup: CgroupCapabilities } | { cgroup: null; reason: string } {
  if (input.platform !== 'linux') return { cgroup: null, reason: `${input.platform} has no cgroups` };
  let mounts: MountEntry[];
  try {
    mounts = cgroup2Mounts(input.mountinfo());
  } catch (err) {
    return {
      cgroup: null,
      reason: `/proc/self/mountinfo could not be read (${(err as NodeJS.ErrnoException).code ?? err})`,
    };
  }
  // A bind mount of a subtree shows a deeper root: the whole hierarchy's is preferred.
  const mount = mounts.find((m) => m.root === '/') ?? mounts[0];
  if (!mount)
    return {
      cgroup: null,
      reason: 'no cgroup2 filesystem in /proc/self/mountinfo (a cgroup v1-only host, or none mounted)',
    };
  let own: string | null = null;
  try {
    own = input.ownCgroup();
  } catch {
    own = null;
  }
  const nonRoot = someNonRootCgroup(mount, own);
  const features = nonRoot
    ? cgroupFeatures(nonRoot)
    : { kill: input.kernelAtLeast(5, 14), freeze: input.kernelAtLeast(5, 2) };
  const controllers = readControllers(mount.mountPoint);
  return {
    cgroup: {
      mount: mount.mountPoint,
      root: mount.mountPoint,
      readOnly: mount.readOnly,
      placement: input.placement,
      cloneIntoCgroup: input.cloneIntoCgroup === '',
      kill: features.kill,
      freeze: features.freeze,
      controllers,
      enabled: readControllers(mount.mountPoint, 'cgroup.subtree_control'),
    },
  };
}
