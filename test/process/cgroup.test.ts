/**
 * src/process/cgroup.ts and the cgroup v2 parts of the backends: where cgroup v2 is
 * (mountinfo, parsed from fixtures and read live), roots refused for the
 * reason they are bad, placement of a spawned child before it execs, and
 * the two ways a cgroup is emptied (cgroup.kill, and member by member
 * where the kernel has none), with `populated 0` as the proof.
 */
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { cgroup2Mounts, hierarchyPath, mountOf, parseMountinfo } from '../../src/backend/cgroupv2.js';
import { parseCgroupV2Line } from '../../src/backend/procview.js';
import { cgroupName, parseKeyed } from '../../src/process/cgroup.js';
import { capabilities, spawn, Supervisor } from '../../src/index.js';
import { terminateCgroup } from '../../src/process/tree.js';
import { packageRoot } from '../../src/backend/addon.js';
import {
  CGROUP_MOUNT,
  CGROUP_ROOT,
  CGROUP_SKIP,
  expectNoCgroupsLeft,
  nodeOf,
  openCgroupRoot,
  procsOf,
} from '../helpers/cgroup.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { processesWithMarker } from '../helpers/leaks.js';
import { counterWitness } from '../helpers/quiet.js';
import { MARKER, tmpDir, waitFor } from '../helpers/procs.js';
import { PERL } from '../helpers/supervisor.js';

const cleanups = cleanupAfterEach({ marker: MARKER });
expectNoCgroupsLeft();

const HYBRID = `31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
`;
const MODERN = `25 30 0:23 / /sys/fs/cgroup rw,nosuid,nodev,noexec,relatime shared:4 - cgroup2 cgroup2 rw,nsdelegate,memory_recursiveprot
`;
// A container's view: its own cgroup namespace, and a read-only bind of a subtree at a path with a space.
const CONTAINER = `700 650 0:30 /kubepods/pod1 /sys/fs/cgroup ro,nosuid - cgroup2 cgroup rw
701 650 0:30 /user.slice /mnt/my\\040cgroups rw - cgroup2 cgroup rw
malformed line
`;

const openRoot = () => openCgroupRoot(cleanups);

describe('cgroup v2 discovery (pure)', () => {
  it('finds cgroup2 mounts in mountinfo on a hybrid, a modern and a container host, never by a hard-coded path', () => {
    expect(cgroup2Mounts(HYBRID)).toEqual([
      { root: '/', mountPoint: '/sys/fs/cgroup/unified', fsType: 'cgroup2', readOnly: false },
    ]);
    expect(cgroup2Mounts(MODERN).map((m) => m.mountPoint)).toEqual(['/sys/fs/cgroup']);
    const c = cgroup2Mounts(CONTAINER);
    expect(c).toEqual([
      { root: '/kubepods/pod1', mountPoint: '/sys/fs/cgroup', fsType: 'cgroup2', readOnly: true },
      { root: '/user.slice', mountPoint: '/mnt/my cgroups', fsType: 'cgroup2', readOnly: false },
    ]);
    expect(parseMountinfo('').length).toBe(0);
    // The longest mount point wins; a sibling path with the same prefix is not inside.
    expect(mountOf('/mnt/my cgroups/a/b', c)?.root).toBe('/user.slice');
    expect(mountOf('/sys/fs/cgroupx', c)).toBeNull();
    expect(hierarchyPath('/mnt/my cgroups/a/b', c[1]!)).toBe('/user.slice/a/b');
    expect(hierarchyPath('/sys/fs/cgroup', c[0]!)).toBe('/kubepods/pod1');
  });

  it('reads the v2 line of /proc/<pid>/cgroup, cgroup.events and cpu.stat; names instance cgroups apart from cgroupfs files', () => {
    expect(parseCgroupV2Line('9:name=systemd:/\n4:memory:/x\n0::/a/b\n')).toBe('/a/b');
    expect(parseCgroupV2Line('4:memory:/x\n1:cpu:/\n')).toBeNull();
    expect(parseKeyed('populated 1\nfrozen 0\n')).toEqual(
      new Map([
        ['populated', 1],
        ['frozen', 0],
      ]),
    );
    expect(parseKeyed('usage_usec 1234\nuser_usec 1000\nnr_periods\n').get('usage_usec')).toBe(1234);
    // cgroupfs names its files <controller>.<word>; an instance's is <id>.<12 hex digits>, fresh per launch.
    expect(cgroupName('cpu', 'ab'.repeat(16))).toBe('cpu.abababababab');
    expect(cgroupName('vm.1', '0123456789abcdef'.repeat(2))).toBe('vm.1.0123456789ab');
  });
});

describe(`cgroup roots and placement (${backend.name})`, () => {
  it('capabilities().cgroup says where cgroup v2 is mounted and how this backend places children', (ctx) => {
    const caps = capabilities();
    if (!caps.cgroup) {
      expect(caps.cgroupReason).toMatch(/cgroup/);
      ctx.skip(true, `no cgroup v2: ${caps.cgroupReason}`);
      return;
    }
    const mounts = execFileSync('findmnt', ['-n', '-l', '-t', 'cgroup2', '-o', 'TARGET'], { encoding: 'utf8' })
      .trim()
      .split('\n');
    expect(mounts).toContain(caps.cgroup.mount);
    expect(caps.cgroup.placement).toBe(backend.name === 'native' ? 'child-write' : 'exec-wrapper');
    expect(caps.cgroup.controllers).toEqual(
      readFileSync(join(caps.cgroup.mount, 'cgroup.controllers'), 'utf8').trim().split(/\s+/).filter(Boolean),
    );
    if (backend.name === 'js') expect(caps.cgroup.cloneIntoCgroup).toBe(false);
  });

  it('refuses a relative root, a cgroup v1 directory, a file, a path off cgroupfs, and leaves nothing behind', async (ctx) => {
    ctx.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const dir = tmpDir('custody-cgroot-');
    cleanups.push(dir.cleanup);
    const stateDir = join(dir.path, 'state');
    const open = (root: unknown) =>
      Supervisor.open({ stateDir, cgroup: { root } as { root: string }, onEvent: () => {} }).then(
        () => null,
        (e: unknown) => e as { code: string; message: string },
      );
    expect(await open('custody-relative')).toMatchObject({
      code: 'ERR_CUSTODY_BAD_CGROUP',
      message: expect.stringContaining('absolute'),
    });
    expect(await open(42)).toMatchObject({ code: 'ERR_CUSTODY_INVALID_ARG' });
    expect(await open(join(CGROUP_MOUNT!, 'cgroup.procs'))).toMatchObject({
      code: 'ERR_CUSTODY_BAD_CGROUP',
      message: expect.stringContaining('not a directory'),
    });
    expect(await open(join(dir.path, 'not-cgroupfs'))).toMatchObject({
      code: 'ERR_CUSTODY_BAD_CGROUP',
      message: expect.stringContaining('not on a cgroup v2 mount'),
    });
    const v1 = parseMountinfo(readFileSync('/proc/self/mountinfo', 'utf8')).find((m) => m.fsType === 'cgroup');
    if (v1) {
      const inV1 = join(v1.mountPoint, `custody-test-${process.pid}`);
      expect(await open(inV1)).toMatchObject({
        code: 'ERR_CUSTODY_BAD_CGROUP',
        message: expect.stringContaining('not on a cgroup v2 mount'),
      });
      expect(existsSync(inV1)).toBe(false);
    }
    // Refused before the state dir was touched.
    expect(existsSync(stateDir)).toBe(false);
    expect(existsSync(CGROUP_ROOT)).toBe(false);
  });

  it("refuses a root this process may not write to (another uid's view of root's cgroup)", async (ctx) => {
    ctx.skip(!!CGROUP_SKIP || process.getuid?.() !== 0, CGROUP_SKIP ?? 'needs root to run a check as another uid');
    const dir = tmpDir('custody-cgroot-');
    cleanups.push(dir.cleanup);
    mkdirSync(CGROUP_ROOT);
    cleanups.push(() => rmdirSync(CGROUP_ROOT));
    const script = `import(${JSON.stringify(join(packageRoot, 'dist', 'index.js'))}).then((c) => c.Supervisor.open({ stateDir: ${JSON.stringify(join(dir.path, 'state'))}, cgroup: { root: ${JSON.stringify(join(CGROUP_ROOT, 'sub'))} } })).then(() => console.log('opened'), (e) => console.log(JSON.stringify({ code: e.code, message: e.message })))`;
    const out = execFileSync(
      'setpriv',
      ['--reuid=65534', '--regid=65534', '--clear-groups', process.execPath, '--input-type=module', '-e', script],
      {
        encoding: 'utf8',
        // The other uid loads the package's own addon: a sanitizer build's private path and preload are not for it.
        env: { ...withoutSanitizer(process.env), CUSTODY_BACKEND: backend.name },
      },
    );
    expect(JSON.parse(out)).toMatchObject({
      code: 'ERR_CUSTODY_BAD_CGROUP',
      message: expect.stringContaining('not writable'),
    });
    expect(existsSync(join(CGROUP_ROOT, 'sub'))).toBe(false);
  });

  it('spawn({ cgroup }) starts the child inside before it execs; a cgroup that is gone is ERR_CUSTODY_BAD_CGROUP with nothing run', async (ctx) => {
    ctx.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    mkdirSync(CGROUP_ROOT);
    const leaf = join(CGROUP_ROOT, 'leaf');
    mkdirSync(leaf);
    cleanups.push(() => {
      rmdirSync(leaf);
      rmdirSync(CGROUP_ROOT);
    });
    const h = spawn('/bin/cat', ['/proc/self/cgroup'], { cgroup: leaf, stdio: ['ignore', 'pipe', 'ignore'] });
    let out = '';
    h.stdout!.on('data', (d: Buffer) => (out += d.toString()));
    const closed = new Promise((r) => h.stdout!.once('close', r));
    await h.exited;
    await closed;
    expect(parseCgroupV2Line(out)).toBe(nodeOf(leaf));
    const gone = join(CGROUP_ROOT, 'gone');
    const err = (() => {
      try {
        spawn('/bin/true', [], { cgroup: gone });
        return null;
      } catch (e) {
        return e;
      }
    })();
    expect(err).toMatchObject({ code: 'ERR_CUSTODY_BAD_CGROUP' });
    expect(() => spawn('/bin/true', [], { cgroup: 'relative/dir' })).toThrow(
      expect.objectContaining({ code: 'ERR_CUSTODY_INVALID_ARG' }),
    );
  });

  it('a TERM-ignoring forker is emptied by cgroup.kill and, as on a kernel without it, member by member; populated 0 is the proof', async (ctx) => {
    ctx.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const { root } = openRoot();
    const forker = `$SIG{TERM} = 'IGNORE'; my $end = time + 10; while (time < $end) { if (!fork) { $SIG{TERM} = 'IGNORE'; sleep 10; exit } select(undef, undef, undef, 0.01) }`;
    for (const killEach of [false, true]) {
      const cg = root.create(`forker${killEach ? '-each' : ''}`, 'f'.repeat(32));
      const h = spawn(PERL, ['-e', forker, '--', MARKER], { cgroup: cg.path, detached: true });
      await waitFor(() => procsOf(cg.path).length >= 10, 10_000, 'a brood in the cgroup');
      const r = await terminateCgroup(cg, [h], { graceMs: 100, killEach });
      expect(r.escalated).toBe(true);
      expect(cg.populated()).toBe(false);
      expect(h.hasExited).toBe(true);
      await cg.remove();
      expect(existsSync(cg.path)).toBe(false);
      expect(processesWithMarker(MARKER).filter((p) => p.state !== 'Z')).toEqual([]);
    }
  });

  it('freeze() stops every process where it is, thaw() lets it go on; usage() counts CPU time and processes', async (ctx) => {
    ctx.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const { root, dir } = openRoot();
    const cg = root.create('counter', 'c'.repeat(32));
    const file = join(dir.path, 'count');
    writeFileSync(file, '0');
    // Spends 0.3 s of CPU time (times: its own user time), then counts into a file every 10 ms.
    const prog = `1 while (times)[0] < 0.3; my $n = 0; while (1) { open(my $f, '>', $ARGV[0]); print $f ++$n; close $f; select(undef, undef, undef, 0.01) }`;
    const h = spawn(PERL, ['-e', prog, file, MARKER], { cgroup: cg.path });
    cleanups.push(async () => {
      h.signal('SIGKILL');
      await h.exited;
      await cg.remove();
    });
    const count = () => Number(readFileSync(file, 'utf8') || '0');
    await waitFor(() => count() > 2, 10_000, 'counting');
    await cg.freeze();
    expect(cg.frozen()).toBe(true);
    const witness = await counterWitness(join(dir.path, 'witness'));
    cleanups.push(witness.stop);
    const at = count();
    // Ten of the witness's counts outside the cgroup: an unfrozen counter would have counted too.
    await witness.advance(10);
    expect(count()).toBe(at);
    await cg.thaw();
    expect(cg.frozen()).toBe(false);
    await waitFor(() => count() > at, 10_000, 'counting again');
    const u = cg.usage();
    expect(u.pids).toBe(1);
    expect(u.cpuUsec).toBeGreaterThanOrEqual(300_000);
    expect(u.memoryBytes === null || u.memoryBytes > 0).toBe(true);
  });
});

function withoutSanitizer(env: NodeJS.ProcessEnv): NodeJS.ProcessEnv {
  const {
    CUSTODY_ADDON_PATH: _a,
    LD_PRELOAD: _p,
    ASAN_OPTIONS: _o,
    UBSAN_OPTIONS: _u,
    LSAN_OPTIONS: _l,
    ...rest
  } = env;
  return rest;
}
