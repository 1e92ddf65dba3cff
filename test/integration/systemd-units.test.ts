// A Firecracker agent's launch as it really is: `systemd-run --unit
// vm-<token>` with the MainPID function, under a real systemd (pid 1 of
// namespaces of its own, test/helpers/systemd-ns.ts), the agent inside
// them. systemd reports MainPID at its fork, before the exec: custody must
// record the target only after it. One boot for the suite; after it, the
// host's /tmp (a canary), hostname, fs.protected_* sysctls, mounts and
// cgroups are as they were. Skipped, saying why, where systemd or unshare
// is missing; CUSTODY_REQUIRE_DAEMONS=1 (.ci/run) makes a missing systemd a
// failure.
import { existsSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { hostname } from 'node:os';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { CGROUP_MOUNT } from '../helpers/cgroup.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { tokenCarriers } from '../helpers/procs.js';
import { boot, type SystemdNs, systemdSkip } from '../helpers/systemd-ns.js';

cleanupAfterEach();

const AGENT = new URL('../fixtures/systemd-agent.mjs', import.meta.url).pathname;
const SKIP = systemdSkip();
const SYSCTLS = ['protected_fifos', 'protected_hardlinks', 'protected_regular', 'protected_symlinks'].map(
  (n) => `/proc/sys/fs/${n}`,
);
const sysctls = () => SYSCTLS.map((f) => readFileSync(f, 'utf8'));
/** The host's mounts where the boot mounts inside (others' tests mount elsewhere meanwhile): root and mount point. */
const OURS = /^\/(proc|run|tmp|var\/tmp|var\/log|sys\/fs\/cgroup)(\/|$)/;
const mounts = () =>
  readFileSync('/proc/self/mountinfo', 'utf8')
    .split('\n')
    .map((l) => l.split(' ').slice(3, 5))
    .filter(([, point]) => point !== undefined && OURS.test(point) && !point.startsWith('/tmp/'))
    .map((m) => m.join(' '))
    .sort();

interface AgentOut {
  token?: string;
  unit?: string;
  mainPid?: number;
  mainPidExe?: string | null;
  pid?: number;
  exe?: string | null;
  cgroup?: string | null;
  decoy?: number;
  manifest?: { state: string; cgroup?: { path: string; id: string; unit?: boolean } | null } | null;
  errors: Array<{ code?: string; message: string }>;
  events: Array<{ kind: string; message: string; pid: number | null }>;
  list?: Array<{ id: string; status: string }>;
  inspect?: Array<{ id: string; pid: number; cgroup: string | null } | null>;
  report?: { adopted?: unknown[] };
  stops?: Array<{ result: string }>;
}

describe.skipIf(SKIP)('systemd-run --unit inside a real systemd', () => {
  let ns: SystemdNs;
  let canary: string;
  let before: { sysctls: string[]; hostname: string; mounts: string[]; cgroups: string[] };
  const stateDir = '/run/host/state';

  beforeAll(async () => {
    canary = join('/tmp', `custody-canary-${process.pid}`);
    writeFileSync(canary, 'host /tmp\n');
    before = { sysctls: sysctls(), hostname: hostname(), mounts: mounts(), cgroups: readdirSync(CGROUP_MOUNT!) };
    ns = await boot();
  });

  afterAll(async () => {
    await ns?.shutdown();
    // The boot touched nothing of the host's.
    expect(readFileSync(canary, 'utf8')).toBe('host /tmp\n');
    rmSync(canary);
    expect(sysctls()).toEqual(before.sysctls);
    expect(hostname()).toBe(before.hostname);
    expect(mounts()).toEqual(before.mounts);
    if (ns) expect(existsSync(ns.cgroup)).toBe(false);
    expect(readdirSync(CGROUP_MOUNT!).filter((d) => d.startsWith('custody-systemd-'))).toEqual(
      before.cgroups.filter((d) => d.startsWith('custody-systemd-')),
    );
  });

  async function agent(
    req: Record<string, unknown>,
  ): Promise<{ out: AgentOut; code: number | null; signal: string | null }> {
    const r = await ns.run([process.execPath, AGENT, JSON.stringify({ state: stateDir, ...req })]);
    const line = r.stdout.trim().split('\n').at(-1);
    if (!line) throw new Error(`the agent printed nothing (${r.code ?? r.signal}): ${r.stderr}`);
    return { out: JSON.parse(line) as AgentOut, code: r.code, signal: r.signal };
  }

  /** The unit's processes (host pids) with their argv, read from its cgroup on the host. */
  function unitProcs(unit: string): Array<{ pid: number; argv: string }> {
    let pids: number[];
    try {
      pids = readFileSync(ns.hostCgroup(`system.slice/${unit}.service/cgroup.procs`), 'latin1')
        .split('\n')
        .filter(Boolean)
        .map(Number);
    } catch {
      return [];
    }
    return pids.map((pid) => {
      let argv = '';
      try {
        argv = readFileSync(`/proc/${pid}/cmdline`, 'latin1').split('\0').join(' ').trim();
      } catch {
        // gone
      }
      return { pid, argv };
    });
  }

  /** Ends what a test left in the namespace (its units), so the next starts clean. */
  async function stopUnits(...units: string[]): Promise<void> {
    for (const u of units) await ns.run(['systemctl', 'kill', '--signal=SIGKILL', `${u}.service`]);
    for (const u of units) await ns.run(['systemctl', 'stop', `${u}.service`]);
    await ns.run(['systemctl', 'reset-failed']);
  }

  it('records the target only once it has exec’d, and stops it', async () => {
    const { out } = await agent({ op: 'launch', id: 'vm1', stop: true });
    expect(out.errors).toEqual([]);
    expect(out.mainPid).toBe(out.pid);
    // Whatever MainPID showed when first read (systemd's fork, or perl already), the target is perl.
    expect(out.exe).toBe('/usr/bin/perl');
    expect(out.manifest?.state).toBe('running');
    // The unit's cgroup, named for the token and root's, is the instance's: recorded as a unit's.
    const unitCgroup = `/sys/fs/cgroup/system.slice/${out.unit}.service`;
    expect(out.cgroup).toBe(unitCgroup);
    expect(out.manifest?.cgroup).toMatchObject({ path: unitCgroup, unit: true });
    expect(tokenCarriers(out.token!)).toEqual([]);
    await stopUnits(out.unit!);
  });

  /** The unit's helper (renamed, no token), waited for; its pid. */
  function helperOf(unit: string): number {
    const h = unitProcs(unit).find((p) => p.argv === 'unit-helper');
    if (!h) throw new Error(`${unit} has no helper: ${JSON.stringify(unitProcs(unit))}`);
    return h.pid;
  }

  const alive = (pid: number) => {
    try {
      return !/^\d+ \(.*\) [ZX]/.test(readFileSync(`/proc/${pid}/stat`, 'latin1'));
    } catch {
      return false;
    }
  };

  it('abandons a launch that failed its readiness by its unit: the helper too, never another unit', async () => {
    const { out } = await agent({ op: 'launch', id: 'vm2', failReady: true, helper: true, decoy: true });
    expect(out.errors.map((e) => e.message)).toEqual(['not ready']);
    expect(out.manifest).toBeNull();
    // The one carrier of the token left is the decoy.
    expect(tokenCarriers(out.token!)).toEqual(unitProcs('decoy-vm2').map((p) => p.pid));
    // The unit's helper (its middle fork reaped, nothing of the token) ended with it; the decoy, carrying the
    // token as perl in another unit, was never touched.
    expect(unitProcs(out.unit!)).toEqual([]);
    expect(unitProcs('decoy-vm2').map((p) => p.argv)).toEqual([`/usr/bin/perl -e sleep 100 ${out.token}`]);
    expect(out.events.filter((e) => e.message.includes('decoy'))).toEqual([]);
    await stopUnits(out.unit!, 'decoy-vm2');
  });

  it('recovers a launch whose agent was SIGKILLed mid-launch (MainPID known, not confirmed)', async () => {
    const { out, signal } = await agent({ op: 'launch', id: 'vm3', crashInPid: true, helper: true });
    expect(signal).toBe('SIGKILL');
    expect(out.mainPid).toBeGreaterThan(1);
    const r = await agent({ op: 'reopen', stop: true });
    expect(r.out.errors).toEqual([]);
    // Recovery finds the unit as launch would have.
    expect(r.out.inspect).toEqual([
      { id: 'vm3', pid: out.mainPid, cgroup: `/sys/fs/cgroup/system.slice/${out.unit}.service` },
    ]);
    expect(r.out.stops?.map((s) => s.result)).toEqual(['stopped']);
    expect(tokenCarriers(out.token!)).toEqual([]);
    expect(unitProcs(out.unit!)).toEqual([]);
    await stopUnits(out.unit!);
  });

  it('adopts after an agent SIGKILL and stops it', async () => {
    const { out, signal } = await agent({ op: 'launch', id: 'vm4', dieAfter: true, helper: true });
    expect(signal).toBe('SIGKILL');
    expect(out.exe).toBe('/usr/bin/perl');
    const helper = helperOf(out.unit!);
    // The CLI, inside, shows the unit's cgroup: ls from the manifest, inspect from the process.
    const cli = new URL('../../dist/cli/main.js', import.meta.url).pathname;
    const ls = JSON.parse(await ns.ok([process.execPath, cli, 'ls', '--state-dir', stateDir, '--json'])) as {
      instances: Array<{ id: string; cgroup: unknown }>;
    };
    expect(ls.instances).toEqual([expect.objectContaining({ id: 'vm4', cgroup: { ...out.manifest?.cgroup } })]);
    expect(out.manifest?.cgroup).toMatchObject({ path: out.cgroup, unit: true });
    expect(await ns.ok([process.execPath, cli, 'ls', '--state-dir', stateDir])).toContain(`${out.cgroup} (unit)`);
    const inspected = JSON.parse(await ns.ok([process.execPath, cli, 'inspect', String(out.pid), '--json'])) as {
      cgroup: string;
    };
    expect(inspected.cgroup).toBe(`/system.slice/${out.unit}.service`);
    const r = await agent({ op: 'reopen', stop: true });
    expect(r.out.errors).toEqual([]);
    expect(r.out.report?.adopted).toEqual([{ id: 'vm4', pid: out.pid }]);
    expect(r.out.stops?.map((s) => s.result)).toEqual(['stopped']);
    expect(r.out.inspect).toEqual([{ id: 'vm4', pid: out.pid, cgroup: out.cgroup }]);
    expect(tokenCarriers(out.token!)).toEqual([]);
    // The stop was the unit's: its helper went with it.
    expect(alive(helper)).toBe(false);
    await stopUnits(out.unit!);
  });

  it('with a cgroup root: the unit named for the token is the instance cgroup, and the launcher’s goes', async () => {
    const root = '/sys/fs/cgroup/custody-agent';
    const { out } = await agent({ op: 'launch', id: 'vm5', root, helper: true, stop: true });
    expect(out.errors).toEqual([]);
    expect(out.cgroup).toBe(`/sys/fs/cgroup/system.slice/${out.unit}.service`);
    expect(out.manifest?.cgroup).toMatchObject({ path: out.cgroup, unit: true });
    expect(tokenCarriers(out.token!)).toEqual([]);
    expect(unitProcs(out.unit!)).toEqual([]);
    // Nothing of the launch's is left under the root (the launcher's cgroup was removed once it exited).
    const own = readdirSync(ns.hostCgroup('custody-agent')).filter((d) => d.startsWith('custody-'));
    for (const d of own) {
      expect(readdirSync(join(ns.hostCgroup('custody-agent'), d)).filter((e) => e.startsWith('vm5.'))).toEqual([]);
    }
    await stopUnits(out.unit!);
  });

  it('with a cgroup root: a target in a unit not named for its token is ERR_CUSTODY_NOT_OURS naming it, never signalled', async () => {
    const { out } = await agent({ op: 'launch', id: 'vm6', root: '/sys/fs/cgroup/custody-agent', foreign: true });
    expect(out.errors).toEqual([
      expect.objectContaining({
        code: 'ERR_CUSTODY_NOT_OURS',
        message: expect.stringContaining('cgroup /system.slice/other-vm6.service'),
      }),
    ]);
    expect(out.manifest).toBeNull();
    expect(unitProcs('other-vm6').map((p) => p.argv)).toEqual([`/usr/bin/perl -e sleep 100 ${out.token}`]);
    await stopUnits('other-vm6');
  });
});
