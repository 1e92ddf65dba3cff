// What cgroup v2 offers here (src/backend/cgroupv2.ts), from real mounts and
// real cgroups: the feature files are looked for in a non-root cgroup (the
// root has neither cgroup.kill nor cgroup.freeze), the kernel version is the
// answer only where no such cgroup is at hand, and every way of having no
// cgroup v2 is a reason, never a throw.
import { mkdirSync, readFileSync, rmdirSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { cgroupFeatures, type CgroupProbeInput, probeCgroup } from '../../src/backend/cgroupv2.js';
import { CGROUP_MOUNT, CGROUP_ROOT, CGROUP_SKIP, expectNoCgroupsLeft } from '../helpers/cgroup.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { MARKER, tmpDir } from '../helpers/procs.js';

const cleanups = cleanupAfterEach({ marker: MARKER });
expectNoCgroupsLeft();

const mountinfo = () => readFileSync('/proc/self/mountinfo', 'utf8');

function input(extra: Partial<CgroupProbeInput> = {}): CgroupProbeInput {
  return {
    platform: 'linux',
    mountinfo,
    ownCgroup: () => backend.cgroupOf(process.pid),
    cloneIntoCgroup: '',
    placement: backend.cgroupPlacement,
    kernelAtLeast: () => {
      throw new Error('the kernel version was asked though a cgroup was at hand');
    },
    ...extra,
  };
}

/** A mountinfo line mounting cgroup2 (root `root`) at `at`. */
const cgroup2Line = (id: number, root: string, at: string, opts = 'rw') =>
  `${id} 1 0:99 ${root} ${at} ${opts},nosuid - cgroup2 cgroup2 rw`;

describe(`cgroup v2 probe (${backend.name})`, () => {
  it('finds cgroup.kill and cgroup.freeze in a cgroup made here, and in no root', (ctx) => {
    ctx.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    mkdirSync(CGROUP_ROOT, { recursive: true });
    const leaf = join(CGROUP_ROOT, 'probe');
    mkdirSync(leaf);
    cleanups.push(() => rmdirSync(leaf));
    expect(cgroupFeatures(leaf)).toEqual({ kill: true, freeze: true });
    expect(cgroupFeatures(CGROUP_MOUNT!)).toEqual({ kill: false, freeze: false });
    const r = probeCgroup(input());
    expect(r.cgroup).toMatchObject({ mount: CGROUP_MOUNT, root: CGROUP_MOUNT, kill: true, freeze: true });
    expect(r.cgroup?.controllers).toEqual(
      readFileSync(join(CGROUP_MOUNT!, 'cgroup.controllers'), 'utf8').trim().split(/\s+/).filter(Boolean),
    );
  });

  it('prefers the whole hierarchy to a bind mount of a subtree, and asks the kernel version only with no cgroup at hand', () => {
    const empty = tmpDir('custody-cg2-');
    cleanups.push(empty.cleanup);
    // Two cgroup2 mounts on empty dirs: the subtree's listed first, the whole hierarchy's second.
    const lines = [cgroup2Line(900, '/sub/tree', join(empty.path, 'sub')), cgroup2Line(901, '/', empty.path, 'ro')];
    mkdirSync(join(empty.path, 'sub'));
    const asked: string[] = [];
    const r = probeCgroup(
      input({
        mountinfo: () => `${lines.join('\n')}\n`,
        ownCgroup: () => null,
        cloneIntoCgroup: 'ENOSYS',
        kernelAtLeast: (major, minor) => (asked.push(`${major}.${minor}`), major < 5 || (major === 5 && minor < 10)),
      }),
    );
    // The empty dir's one subdirectory (sub) is taken for a non-root cgroup, and has no feature files.
    expect(r.cgroup).toMatchObject({
      mount: empty.path,
      readOnly: true,
      cloneIntoCgroup: false,
      kill: false,
      freeze: false,
    });
    expect(asked).toEqual([]);
    rmdirSync(join(empty.path, 'sub'));
    const bare = probeCgroup(
      input({
        mountinfo: () => `${cgroup2Line(901, '/', empty.path)}\n`,
        ownCgroup: () => null,
        kernelAtLeast: (major, minor) => (asked.push(`${major}.${minor}`), major < 5 || (major === 5 && minor < 10)),
      }),
    );
    expect(asked).toEqual(['5.14', '5.2']);
    expect(bare.cgroup).toMatchObject({ kill: false, freeze: true, controllers: [], enabled: [] });
  });

  it('every way of having no cgroup v2 is a reason', () => {
    expect(probeCgroup(input({ platform: 'darwin' }))).toEqual({ cgroup: null, reason: 'darwin has no cgroups' });
    const unreadable = probeCgroup(
      input({
        mountinfo: () => readFileSync('/nonexistent/mountinfo', 'utf8'),
      }),
    );
    expect(unreadable).toEqual({ cgroup: null, reason: '/proc/self/mountinfo could not be read (ENOENT)' });
    const v1Only = mountinfo()
      .split('\n')
      .filter((l) => !l.includes(' - cgroup2 '))
      .join('\n');
    expect(probeCgroup(input({ mountinfo: () => v1Only }))).toEqual({
      cgroup: null,
      reason: expect.stringMatching(/^no cgroup2 filesystem/),
    });
  });
});
