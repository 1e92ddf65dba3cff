// Programs that rewrite their own title, across an agent restart. Debian's
// redis-server replaces its argv with "redis-server unixsocket:<path>"
// (proc-title-template) as soon as it runs: the recorded argv no longer
// matches, but the kernel says it is the very process launched: its pidfs
// id (native) or its instance cgroup. Recovery adopts it as repaired,
// reason `renamed`, and records the new title. Where only start ticks match
// (the js backend without a cgroup), the older rule stays: the token and the
// declared paths must re-prove it.
// Skipped, saying why, where the program is not installed (.ci/run installs
// them); CUSTODY_REQUIRE_DAEMONS=1 makes a missing one a failure.
import { existsSync, readFileSync, statSync } from 'node:fs';
import { createConnection } from 'node:net';
import { join } from 'node:path';
import { describe, expect, it, type TestContext } from 'vitest';
import { qmpReady } from '../../examples/qmp.js';
import { backend } from '../../src/backend/index.js';
import { inspect, type LaunchSpec, verify } from '../../src/index.js';
import { CGROUP_ROOT, CGROUP_SKIP, expectNoCgroupsLeft } from '../helpers/cgroup.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { isGone, MARKER, tmpDir, waitFor } from '../helpers/procs.js';
import { plainEnv } from './plain-env.js';
import { restartingAgent } from './programs.js';

const cleanups = cleanupAfterEach({ marker: MARKER });
expectNoCgroupsLeft();

function installed(path: string): string | null {
  try {
    return statSync(path).isFile() ? path : null;
  } catch {
    return null;
  }
}
const REDIS = installed('/usr/bin/redis-server');
const QEMU = installed('/usr/bin/qemu-system-x86_64');

function need(t: TestContext, path: string | null, pkg: string): string {
  const why = `${pkg} is not installed (Debian: apt-get install ${pkg}; .ci/run installs it)`;
  if (path === null && process.env.CUSTODY_REQUIRE_DAEMONS === '1')
    throw new Error(`CUSTODY_REQUIRE_DAEMONS=1, but ${why}`);
  t.skip(path === null, why);
  return path!;
}

/** A state dir of this test's, and a supervisor opened on it that the test reopens as a restarted agent would. */
function agent(withCgroup: boolean) {
  const dir = tmpDir('custody-renamed-');
  const options = { stateDir: join(dir.path, 'state'), ...(withCgroup ? { cgroup: { root: CGROUP_ROOT } } : {}) };
  // Cleanups run last first: the agent ends before its dir goes.
  cleanups.push(() => dir.cleanup());
  return { dir: dir.path, ...restartingAgent(options, (fn) => cleanups.push(fn)) };
}

/** redis on a unix socket only (port 0), no persistence; the token is in its pidfile's name, which its title drops. */
const redis = (dir: string): LaunchSpec => ({
  id: 'cache',
  command: REDIS!,
  args: (t) => [
    ...['--port', '0', '--unixsocket', join(dir, 'redis.sock'), '--pidfile', join(dir, `redis-${t}.pid`)],
    ...['--save', '', '--appendonly', 'no'],
  ],
  ready: { socket: join(dir, 'redis.sock') },
  paths: [join(dir, 'redis.sock')],
  env: plainEnv(),
  readyTimeoutMs: 20_000,
});

/**
 * Has redis retitle itself now (CONFIG SET proc-title-template, over its unix socket, in RESP): a title
 * changed after custody recorded the instance running, as a long-lived daemon may change it any time.
 */
async function retitle(sock: string, pid: number, mark: string): Promise<void> {
  const args = ['CONFIG', 'SET', 'proc-title-template', `{title} {listen-addr} ${mark}`];
  const request = `*${args.length}\r\n${args.map((x) => `$${Buffer.byteLength(x)}\r\n${x}\r\n`).join('')}`;
  const reply = await new Promise<string>((resolve, reject) => {
    const c = createConnection(sock, () => c.write(request));
    c.setEncoding('utf8');
    c.once('data', (d: string) => {
      c.end();
      resolve(d);
    });
    c.once('error', reject);
  });
  expect(reply).toBe('+OK\r\n');
  await waitFor(() => inspect(pid).argv[0]?.endsWith(` ${mark}`), 10_000, 'redis to take its new title');
}

const cases = [
  { name: 'without a cgroup', cgroup: false },
  { name: 'in an instance cgroup', cgroup: true },
] as const;

describe(`programs that rewrite their title, across an agent restart (${backend.name})`, () => {
  for (const c of cases) {
    it(`redis ${c.name}: repaired as renamed where the kernel proves it (pidfs id, cgroup), its new title recorded`, async (t) => {
      need(t, REDIS, 'redis-server');
      if (c.cgroup) t.skip(CGROUP_SKIP !== null, CGROUP_SKIP ?? '');
      const a = agent(c.cgroup);
      const { supervisor } = await a.open();
      const inst = await supervisor.launch(redis(a.dir));
      const sock = join(a.dir, 'redis.sock');
      const launched = inst.identity;
      // Its title is its own from the start, and it changes it again while it runs.
      await retitle(sock, inst.pid, 'retitled');
      const title = inspect(inst.pid).argv;
      expect(title).not.toEqual(launched.argv);
      expect(verify(launched)).toEqual({ verdict: 'mismatch', field: 'argv' });
      // The agent restarts; redis does not.
      const { report, supervisor: reopened } = await a.open();
      if (backend.name === 'js' && !c.cgroup) {
        // Start ticks alone, and a title without the token: not proven, never signalled (the older rule).
        expect(report.quarantined).toEqual([{ id: 'cache', pid: inst.pid, reason: 'mismatch', field: 'argv' }]);
        await reopened.release('cache');
        process.kill(inst.pid, 'SIGTERM');
        await waitFor(() => isGone(inst.pid), 10_000, 'redis to end');
        return;
      }
      expect(report.repaired).toEqual([{ id: 'cache', pid: inst.pid, reason: 'renamed', field: 'argv' }]);
      expect(report.quarantined).toEqual([]);
      expect(a.events.filter((e) => e.type === 'repair')).toEqual([
        expect.objectContaining({ id: 'cache', reason: 'renamed', field: 'argv' }),
      ]);
      const m = JSON.parse(readFileSync(join(a.dir, 'state', 'cache', 'manifest.json'), 'utf8'));
      expect(m.identity.argv).toEqual(title);
      expect(m.identity.startTicks).toBe(launched.startTicks);
      // Rewritten once: the next restart adopts it as verified.
      const again = await a.open();
      expect(again.report.adopted).toEqual([{ id: 'cache', pid: inst.pid }]);
      expect(again.report.repaired).toEqual([]);
      const r = await again.supervisor.stop('cache', { graceMs: 5000 });
      expect(r.outcome).toBe('exited');
      expect(isGone(inst.pid)).toBe(true);
      expect(existsSync(sock)).toBe(false);
    }, 60_000);
  }

  it('QEMU -runas nobody (pid: child, no uid): its drop is recorded at running, and a restart adopts it', async (t) => {
    const qemu = need(t, QEMU, 'qemu-system-x86');
    const a = agent(false);
    const { supervisor } = await a.open();
    const qmp = join(a.dir, 'qmp.sock');
    const inst = await supervisor.launch({
      id: 'vm',
      command: qemu,
      args: (tk) => [
        ...['-name', `${MARKER}-${tk}`, '-machine', 'none', '-nodefaults', '-display', 'none'],
        ...['-qmp', `unix:${qmp},server=on,wait=off`, '-runas', 'nobody'],
      ],
      // QEMU drops to nobody once it is set up, after the exec confirm saw as uid 0; QMP answers after that.
      ready: { socket: qmp, probe: qmpReady },
      paths: [qmp],
      env: plainEnv(),
      confirmTimeoutMs: 30_000,
      readyTimeoutMs: 30_000,
    });
    const confirmed = a.events.find((e) => e.type === 'confirm' && e.id === 'vm') as { identity: { uid: number } };
    expect(confirmed.identity.uid).toBe(0);
    expect(inst.identity.uid).toBe(65534);
    expect(inspect(inst.pid).uid).toBe(65534);
    const recorded = JSON.parse(readFileSync(join(a.dir, 'state', 'vm', 'manifest.json'), 'utf8'));
    expect(recorded.identity.uid).toBe(65534);
    expect(a.events.find((e) => e.type === 'warning' && e.id === 'vm')?.message).toMatch(
      /changed its uid since its exec/,
    );
    // The uid it dropped to is recorded as the instance's, as if the launch had declared it.
    expect(recorded.uid).toBe(65534);
    const { report, supervisor: reopened } = await a.open();
    expect(report.adopted).toEqual([{ id: 'vm', pid: inst.pid }]);
    expect((await reopened.stop('vm', { graceMs: 5000 })).outcome).toBe('exited');
    expect(existsSync(qmp)).toBe(false);
  }, 60_000);
});
