/**
 * Whether a pid function's target is in a systemd unit of the launch's: a
 * target created elsewhere (the MainPID of `systemd-run --unit vm-<token>`)
 * whose own cgroup is a `.service` or `.scope` whose name carries the
 * launch's token, owned by root (only root, or systemd, makes a unit's
 * cgroup), is in the instance's cgroup. The unit's cgroup is systemd's:
 * custody never creates, chowns or removes it, and kills through it
 * (cgroup.kill, `populated 0`) only once the name and the owner prove it.
 * The path comes from /proc/<pid>/cgroup (its v2 line) resolved against the
 * mountinfo of the agent's own namespaces, and the start ticks are read
 * again after, so a pid reused meanwhile proves nothing.
 */
import { type BigIntStats, lstatSync } from 'node:fs';
import * as path from 'node:path';
import { backend } from '../backend/index.js';
import { cgroup2Mounts } from '../backend/cgroupv2.js';
import { UnsafePathError } from '../errors.js';
import type { ProcessIdentity } from '../types.js';
import { InstanceCgroup } from './cgroup.js';
import { recordedCgroup } from './cgroup-guard.js';

/** A unit's cgroup name: `<name>.service` or `<name>.scope` (slices hold units, they are none). */
const UNIT = /^[^/]+\.(service|scope)$/;

/** Where the process is (its v2 cgroup path), read with its start ticks re-checked; null when gone or no v2 line. */
function placeOf(live: ProcessIdentity): string | null {
  const where = backend.cgroupOf(live.pid);
  const st = backend.stat(live.pid);
  return st && st.startTicks === live.startTicks && st.state !== 'Z' && st.state !== 'X' ? where : null;
}

/** The directory of a hierarchy path on the cgroup2 mount that shows it (a mount's root is a prefix), or null. */
function dirOf(node: string): string | null {
  for (const m of cgroup2Mounts(backend.mountinfo())) {
    const rel = path.posix.relative(m.root, node);
    if (rel.startsWith('..') || path.posix.isAbsolute(rel)) continue;
    return path.posix.join(m.mountPoint, rel);
  }
  return null;
}

/**
 * The unit cgroup the confirmed target is in, where it is one of the
 * launch's (its name carries the token, root owns it, the StrictModes walk
 * up to the mount passes); null otherwise (the target stays under the token
 * rule). The target must be in the unit's cgroup itself: a cgroup below it
 * is named by no unit.
 */
export function unitCgroupOf(live: ProcessIdentity, token: string): InstanceCgroup | null {
  const node = placeOf(live);
  if (node === null) return null;
  const name = path.posix.basename(node);
  if (!UNIT.test(name) || !name.includes(token)) return null;
  const dir = dirOf(node);
  if (dir === null) return null;
  let st: BigIntStats;
  try {
    st = lstatSync(dir, { bigint: true });
  } catch {
    return null;
  }
  if (!st.isDirectory() || st.uid !== 0n) return null;
  let place: ReturnType<typeof recordedCgroup>;
  try {
    place = recordedCgroup({ path: dir, id: String(st.ino) });
  } catch (err) {
    // A path another uid could change, or a cgroup made again meanwhile: no proof, the token rule holds.
    if (err instanceof UnsafePathError) return null;
    throw err;
  }
  if (place === 'gone') return null;
  // Still there, and still the same process: the read above was of it.
  if (placeOf(live) !== node) return null;
  return new InstanceCgroup(place.path, place.node, place.id, true);
}
