// A program that rewrites its title before confirm first looks at it, as
// redis-server does at once ("redis-server unixsocket:<path>"): on a busy
// agent the launch failed with "did not exec into the expected argv", though
// our own child had exec'd it. Our own child running the very program spawned
// is confirmed on the argv it was exec'd with, and its title is recorded; a
// restarted agent adopts it where the kernel proves the record (a pidfs id, the
// instance cgroup) and, with start ticks alone (js, no cgroup), quarantines it
// untouched. A child that exec'd another program without the token is still no
// target.
// Staged: the agent's loop is held (in its `spawn` event) until the child's
// cmdline no longer carries the token, as a loaded host holds it.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { type CustodyEvent, type LaunchSpec, Supervisor } from '../../src/index.js';
import { CGROUP_ROOT, CGROUP_SKIP, expectNoCgroupsLeft } from '../helpers/cgroup.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { isGone, MARKER, waitFor } from '../helpers/procs.js';
import { openSupervisor, PERL } from '../helpers/supervisor.js';
import { plainEnv } from '../integration/plain-env.js';

expectNoLeaks({ marker: MARKER });
expectNoCgroupsLeft();

let ctx: Awaited<ReturnType<typeof openSupervisor>> | undefined;
afterEach(async () => {
  await ctx?.dispose();
  ctx = undefined;
});

const pause = new Int32Array(new SharedArrayBuffer(4));
const cmdline = (pid: number) => {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8');
  } catch {
    return '';
  }
};

/**
 * An onEvent that holds the loop at the spawn until the child's cmdline is laid out without `token` (at most
 * 5 s). An empty one is not that: the native spawn returns as the exec begins, before the argv is laid out.
 */
const holdUntilRetitled = (token: () => string) => (e: CustodyEvent) => {
  if (e.type !== 'spawn') return;
  const until = Date.now() + 5000;
  const laidOutWithout = () => {
    const c = cmdline(e.pid);
    return c !== '' && !c.includes(token());
  };
  while (!laidOutWithout() && Date.now() < until) Atomics.wait(pause, 0, 0, 5);
};

/** perl that takes the title `retitled MARKER` at once (the marker kept for the leak check), then sleeps. */
const retitling = (id: string, seen: { token: string }): LaunchSpec => ({
  id,
  command: PERL,
  args: (t) => {
    seen.token = t;
    return ['-e', '$0 = "retitled $ARGV[1]"; sleep 30', '--', t, MARKER];
  },
});

describe(`a title rewritten before confirm (${backend.name})`, () => {
  for (const withCgroup of [false, true]) {
    it(`our own child running the program spawned is confirmed, its title recorded${withCgroup ? ', in an instance cgroup' : ''}`, async (t) => {
      if (withCgroup) t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
      const seen = { token: '' };
      ctx = await openSupervisor({
        onEvent: holdUntilRetitled(() => seen.token),
        ...(withCgroup ? { cgroup: { root: CGROUP_ROOT } } : {}),
      });
      const inst = await ctx.supervisor.launch(retitling('vm', seen));
      expect(cmdline(inst.pid)).not.toContain(inst.token);
      expect(inst.identity.argv[0]).toMatch(/^retitled /);
      expect(inst.cgroup !== null).toBe(withCgroup);
      // An agent restart: the title recorded is what it finds.
      await ctx.supervisor.close();
      const again = await Supervisor.open({
        stateDir: ctx.stateDir,
        ...(withCgroup ? { cgroup: { root: CGROUP_ROOT } } : {}),
      });
      try {
        if (backend.name === 'js' && !withCgroup) {
          // Start ticks alone do not prove a record without the token (no pidfs id, no cgroup): quarantined, untouched.
          expect(again.report.quarantined).toEqual([{ id: 'vm', pid: inst.pid, reason: 'mismatch', field: 'token' }]);
          expect(isGone(inst.pid)).toBe(false);
          await again.supervisor.release('vm');
          process.kill(inst.pid, 'SIGKILL');
          await waitFor(() => isGone(inst.pid), 5000, 'the quarantined title to end');
        } else {
          expect(again.report.adopted).toEqual([{ id: 'vm', pid: inst.pid }]);
          await again.supervisor.stop('vm', { graceMs: 1000 });
        }
      } finally {
        await again.supervisor.close();
      }
      expect(isGone(inst.pid)).toBe(true);
    });
  }

  it('redis-server, which takes its title at once, launched by an agent whose loop is held: confirmed, stopped', async (t) => {
    const redis = '/usr/bin/redis-server';
    const why = 'redis-server is not installed (Debian: apt-get install redis-server; .ci/run installs it)';
    if (!existsSync(redis) && process.env.CUSTODY_REQUIRE_DAEMONS === '1')
      throw new Error(`CUSTODY_REQUIRE_DAEMONS=1, but ${why}`);
    t.skip(!existsSync(redis), why);
    const seen = { token: '' };
    ctx = await openSupervisor({ onEvent: holdUntilRetitled(() => seen.token) });
    const sock = join(ctx.root, 'redis.sock');
    const inst = await ctx.supervisor.launch({
      id: 'cache',
      command: redis,
      // The token is in its pidfile's name, which its title drops.
      args: (tok) => {
        seen.token = tok;
        return ['--port', '0', '--unixsocket', sock, '--pidfile', join(ctx!.root, `redis-${tok}.pid`), '--save', ''];
      },
      ready: { socket: sock },
      paths: [sock],
      env: plainEnv(),
      readyTimeoutMs: 20_000,
    });
    expect(inst.identity.argv.join(' ')).not.toContain(inst.token);
    expect(inst.identity.argv[0]).toMatch(/redis-server/);
    const r = await ctx.supervisor.stop('cache', { graceMs: 5000 });
    expect(r.outcome).toBe('exited');
    expect(existsSync(sock)).toBe(false);
  });

  it('a child that exec’d another program, its argv without the token, is no target: confirm times out, nothing is left', async () => {
    const seen = { token: '' };
    ctx = await openSupervisor({ onEvent: holdUntilRetitled(() => seen.token) });
    const spec: LaunchSpec = {
      id: 'other',
      command: PERL,
      args: (t) => {
        seen.token = t;
        return ['-e', 'exec "/bin/sh", "-c", "sleep 30", $ARGV[1]', '--', t, MARKER];
      },
      confirmTimeoutMs: 500,
    };
    const err = await ctx.supervisor.launch(spec).catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'ERR_CUSTODY_CONFIRM_TIMEOUT' });
    const spawned = ctx.events.find((e) => e.type === 'spawn');
    expect(spawned && isGone(spawned.pid)).toBe(true);
    expect(ctx.supervisor.list()).toEqual([]);
  });
});
