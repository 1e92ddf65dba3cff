/**
 * Real cgroups for tests: a root of this worker's own under the cgroup v2
 * mount (found from /proc/self/mountinfo, never assumed), removed at the end;
 * the reason to skip where cgroup v2 is not writable here.
 */
import type { ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, expect } from 'vitest';
import { cgroup2Mounts, hierarchyPath, mountOf } from '../../src/backend/cgroupv2.js';
import { capabilities, type Supervisor } from '../../src/index.js';
import { CgroupRoot } from '../../src/process/cgroup.js';
import type { Cleanup } from './cleanups.js';
import { killAndWait, MARKER, tmpDir, waitFor } from './procs.js';
import { PERL } from './supervisor.js';

const caps = capabilities();

/** The cgroup v2 mount point, or null. */
export const CGROUP_MOUNT = caps.cgroup?.mount ?? null;

/** Why cgroup tests cannot run here, or null when they can: probed by making a cgroup. */
export const CGROUP_SKIP: string | null = (() => {
  if (!CGROUP_MOUNT) return `no cgroup v2 here: ${caps.cgroupReason}`;
  const probe = join(CGROUP_MOUNT, `custody-probe-${process.pid}`);
  try {
    mkdirSync(probe);
    rmdirSync(probe);
    return null;
  } catch (err) {
    return `cgroup v2 at ${CGROUP_MOUNT} is not writable here (${(err as NodeJS.ErrnoException).code}): run as root or in a delegated subtree`;
  }
})();

/**
 * This worker's cgroup root: `<mount>/custody-test-<pid>-<random>` (not created: Supervisor.open creates it).
 * Random too: a run killed mid-test leaves its root behind, and a later worker may get the same pid.
 */
export const CGROUP_ROOT = CGROUP_MOUNT
  ? join(CGROUP_MOUNT, `custody-test-${process.pid}-${randomBytes(4).toString('hex')}`)
  : '/nonexistent';

/** A CgroupRoot at this worker's root for a state dir of its own; both go after the test (`cleanups`). */
export function openCgroupRoot(cleanups: Cleanup[]): { root: CgroupRoot; dir: { path: string; cleanup: () => void } } {
  const dir = tmpDir('custody-cgroot-');
  cleanups.push(dir.cleanup);
  const root = CgroupRoot.open({ root: CGROUP_ROOT }, dir.path, () => {});
  cleanups.push(() => {
    root.close();
    rmdirSync(CGROUP_ROOT);
  });
  return { root, dir };
}

/**
 * perl, argv after `--`: the cgroup2 mount, a depth, who moves ('main' or 'child'), then the token and the
 * marker. The mover makes `depth` nested cgroups `sub` below its own cgroup (mkdir), writes its pid into the
 * deepest one's cgroup.procs, and sleeps; the main ignores SIGTERM when the child moves (so only the kill
 * of the whole subtree ends the child).
 */
export const NESTER = `my ($mount, $depth, $who) = @ARGV;
open(my $c, '<', '/proc/self/cgroup') or die; my ($p) = map { /^0::(.*)$/ ? $1 : () } <$c>; close $c;
my $move = sub { my $d = "$mount$p"; for (1 .. $depth) { $d .= '/sub'; mkdir($d) or die "mkdir $d: $!" }
  open(my $w, '>', "$d/cgroup.procs") or die "open $d: $!"; print $w "$$\\n"; close($w) or die "move: $!" };
if ($who eq 'main') { $move->(); sleep 60; exit }
if (!fork) { $SIG{TERM} = 'IGNORE'; $move->(); sleep 60; exit }
sleep 60`;

/**
 * perl, argv after `--`: a cgroup outside the instance, a gate file, the token, the marker. Ignores SIGTERM;
 * once the gate exists (within 20 s) moves itself into that cgroup, as root can, and sleeps.
 */
export const LEAVER = `my ($out, $gate) = @ARGV; $SIG{TERM} = 'IGNORE';
for (1 .. 1000) { last if -e $gate; select(undef, undef, undef, 0.02) }
open(my $w, '>', "$out/cgroup.procs") or die "open: $!"; print $w "$$\\n"; close($w) or die "move: $!";
sleep 60`;

/**
 * A cgroup of the test's own outside every supervisor's root; removed after the test (`cleanups`), once
 * what was pushed after it (a supervisor that stops its instances) has run and `strangers` are ended.
 */
export function outsideCgroup(cleanups: Cleanup[], strangers: ChildProcess[]): string {
  const dir = join(CGROUP_MOUNT ?? '/nonexistent', `custody-outside-${process.pid}-${Date.now()}`);
  mkdirSync(dir);
  cleanups.push(async () => {
    await Promise.all(strangers.splice(0).map(killAndWait));
    rmdirSync(dir);
  });
  return dir;
}

/**
 * Launches NESTER as `id` and waits until its mover (the main, or its child) is in the deepest of `depth`
 * nested cgroups: the instance, the mover's pid, and that cgroup's directory.
 */
export async function launchNester(supervisor: Supervisor, id: string, depth: number, who: 'main' | 'child') {
  const inst = await supervisor.launch({
    id,
    command: PERL,
    args: (tok) => ['-e', NESTER, '--', CGROUP_MOUNT ?? '', String(depth), who, tok, MARKER],
  });
  const deepest = join(inst.cgroup ?? '/nonexistent', ...Array<string>(depth).fill('sub'));
  const mover = await waitFor(
    () => existsSync(deepest) && procsOf(deepest)[0],
    10_000,
    `the ${who} ${depth} cgroup(s) below its instance's`,
  );
  return { inst, mover, deepest };
}

/** Every cgroup (directory) below dir, deepest first. */
export function cgroupsBelow(dir: string): string[] {
  if (!existsSync(dir)) return [];
  const out: string[] = [];
  for (const d of readdirSync(dir, { withFileTypes: true })) {
    if (!d.isDirectory()) continue;
    out.push(...cgroupsBelow(join(dir, d.name)), join(dir, d.name));
  }
  return out;
}

/** A cgroup directory's path in the hierarchy, as /proc/<pid>/cgroup names it. */
export function nodeOf(dir: string): string {
  const mount = mountOf(dir, cgroup2Mounts(readFileSync('/proc/self/mountinfo', 'utf8')));
  if (!mount) throw new Error(`${dir} is on no cgroup2 mount`);
  return hierarchyPath(dir, mount);
}

/** The pids in a cgroup now. */
export function procsOf(dir: string): number[] {
  return readFileSync(join(dir, 'cgroup.procs'), 'utf8').split('\n').filter(Boolean).map(Number);
}

/**
 * Registers the end-of-file check: no cgroup left below the root (every
 * test's supervisor removed what it made), then the root goes. Should a
 * test have failed with processes left in a cgroup, they are killed there
 * (they are this worker's: nothing else runs in its root) so the host is
 * left clean, after the check has failed.
 */
export function expectNoCgroupsLeft(): void {
  afterAll(() => {
    if (CGROUP_SKIP || !existsSync(CGROUP_ROOT)) return;
    const left = cgroupsBelow(CGROUP_ROOT);
    for (const dir of left) {
      if (procsOf(dir).length) writeFileSync(join(dir, 'cgroup.kill'), '1');
    }
    for (const dir of left) {
      for (let i = 0; i < 100 && existsSync(dir); i++) {
        try {
          rmdirSync(dir);
        } catch {
          Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 20);
        }
      }
    }
    rmdirSync(CGROUP_ROOT);
    expect(left, 'cgroups left behind').toEqual([]);
  });
}
