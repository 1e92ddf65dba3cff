// afterExit, and what an end owes across an agent that dies. The hook runs
// once per end (an exit on its own, a stop, an abandon), after every process
// of the run is proven gone and before its state goes, recorded as owed
// first; a throw or a timeout never blocks the end. An agent SIGKILLed (a
// real one: test/fixtures/restart-agent.mjs) during the hook, during a
// backoff and during a restart's launch leaves state the next supervisor
// carries on: the hook run again from its spec (or, without one, the state
// waiting as exited, no-spec, until launch() or remove()), the restart due,
// the budget counted.
import { spawn } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { type AfterExitEnd, type CustodyEvent, type LaunchSpec, Supervisor } from '../../src/index.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { type Player, playerOf } from '../helpers/player.js';
import { isGone, MARKER, tmpDir, waitFor } from '../helpers/procs.js';
import { FIXTURES, openSupervisor, PERL } from '../helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });

let ctx: Awaited<ReturnType<typeof openSupervisor>> | undefined;
const cleanups: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
  await ctx?.dispose();
  ctx = undefined;
});

const player = (id: string, plan: string[], extra: Partial<LaunchSpec> = {}) => {
  const p = playerOf(id, plan, extra);
  cleanups.push(p.cleanup);
  return p;
};

const manifestOf = (stateDir: string, id: string) => {
  const path = join(stateDir, id, 'manifest.json');
  return existsSync(path) ? JSON.parse(readFileSync(path, 'utf8')) : null;
};

/** An afterExit that records each end it is given, with what it saw as it ran: the run's pids gone, the state. */
function recorder(stateDir: () => string, p: Player) {
  const calls: Array<{ end: AfterExitEnd; gone: boolean[]; manifest: unknown }> = [];
  const afterExit = (end: AfterExitEnd) => {
    calls.push({ end, gone: p.runs().map(isGone), manifest: manifestOf(stateDir(), end.id) });
  };
  return { calls, afterExit };
}

describe(`afterExit (${backend.name})`, () => {
  it('runs once for an exit on its own, every process gone, before the state goes, recorded as owed', async () => {
    ctx = await openSupervisor();
    const p = player('vm', ['exit 3']);
    const r = recorder(() => ctx!.stateDir, p);
    const inst = await ctx.supervisor.launch({ ...p.spec, afterExit: r.afterExit });
    expect(manifestOf(ctx.stateDir, 'vm').keepAlive).toMatchObject({ afterExit: true });
    p.go();
    await waitFor(() => !existsSync(join(ctx!.stateDir, 'vm')), 20_000, 'the state removed');
    expect(r.calls).toHaveLength(1);
    const [call] = r.calls;
    expect(call!.end).toEqual({
      id: 'vm',
      pid: inst.pid,
      token: inst.token,
      code: 3,
      signal: null,
      result: 'exit-code',
      restarting: false,
    });
    expect(call!.gone).toEqual([true]);
    expect(call!.manifest).toMatchObject({ state: 'running', owed: call!.end });
  });

  it('runs for a stop (result stopped) and for an abandon (a launch that exited before it was confirmed)', async () => {
    ctx = await openSupervisor();
    const p = player('vm', ['run']);
    const r = recorder(() => ctx!.stateDir, p);
    const inst = await ctx.supervisor.launch({ ...p.spec, afterExit: r.afterExit });
    // Confirmed is exec'd, not yet counted: a stop before the player writes its pid would leave runs() empty.
    await waitFor(() => p.runs().length === 1, 5000, 'the run counted');
    p.go();
    await ctx.supervisor.stop('vm', { graceMs: 2000 });
    expect(r.calls.map((c) => [c.end.pid, c.end.result, c.end.restarting, c.gone])).toEqual([
      [inst.pid, 'stopped', false, [true]],
    ]);
    // An attempt whose readiness check fails: abandoned (its process ended), its hook told, its state gone after.
    const q = player('early', ['run']);
    q.go();
    const rq = recorder(() => ctx!.stateDir, q);
    // Fails once the run is counted: an abandon before perl wrote its pid would leave runs() empty.
    const notReady = async () => {
      await waitFor(() => q.runs().length === 1, 5000, 'the run counted');
      throw new Error('not ready');
    };
    await expect(ctx.supervisor.launch({ ...q.spec, afterExit: rq.afterExit, ready: notReady })).rejects.toThrow(
      /not ready/,
    );
    expect(rq.calls).toHaveLength(1);
    expect(rq.calls[0]!.end).toMatchObject({ id: 'early', restarting: false });
    expect(rq.calls[0]!.gone).toEqual([true]);
    expect(existsSync(join(ctx.stateDir, 'early'))).toBe(false);
  });

  it('says restarting where the policy restarts, and the restart begins only after the hook returned', async () => {
    ctx = await openSupervisor();
    const p = player('vm', ['exit 3', 'run']);
    const r = recorder(() => ctx!.stateDir, p);
    await ctx.supervisor.launch({ ...p.spec, afterExit: r.afterExit, restart: { when: 'on-failure', delayMs: 0 } });
    p.go();
    await waitFor(
      () => ctx!.supervisor.list().find((i) => i.status === 'running' && i.restarts === 1),
      20_000,
      'the restart',
    );
    expect(r.calls.map((c) => [c.end.result, c.end.restarting, c.gone])).toEqual([['exit-code', true, [true]]]);
    await ctx.supervisor.stop('vm', { graceMs: 2000 });
    expect(r.calls.map((c) => c.end.result)).toEqual(['exit-code', 'stopped']);
  });

  it('a hook that throws or outlives afterExitTimeoutMs is a warning; the end goes on', async () => {
    ctx = await openSupervisor();
    const a = player('throws', ['exit 3']);
    const b = player('hangs', ['exit 3']);
    await ctx.supervisor.launch({ ...a.spec, afterExit: () => Promise.reject(new Error('lease gone')) });
    await ctx.supervisor.launch({ ...b.spec, afterExit: () => new Promise(() => {}), afterExitTimeoutMs: 200 });
    a.go();
    b.go();
    await waitFor(
      () => !existsSync(join(ctx!.stateDir, 'throws')) && !existsSync(join(ctx!.stateDir, 'hangs')),
      20_000,
      'both states removed',
    );
    const warned = ctx.events.filter((e) => e.type === 'warning').map((e) => e.message);
    expect(warned).toEqual(
      expect.arrayContaining([
        expect.stringMatching(/throws: afterExit failed: lease gone/),
        expect.stringMatching(/hangs: afterExit did not return within 200 ms/),
      ]),
    );
  });
});

/** Runs the agent fixture in MODE on a fresh state dir; resolves once `ready` (a file of DIR) exists, with its pid. */
async function agent(mode: string, p: Player, stateDir: string, ready: string) {
  const child = spawn(
    process.execPath,
    [join(FIXTURES, 'restart-agent.mjs'), mode, stateDir, p.dir, PERL, p.script, MARKER],
    {
      env: { ...process.env, CUSTODY_BACKEND: backend.name },
      stdio: ['ignore', 'ignore', 'inherit'],
    },
  );
  const ended = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  cleanups.push(async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await ended;
  });
  await waitFor(
    () => existsSync(join(p.dir, ready)) || child.exitCode !== null,
    20_000,
    `the agent (${mode}) at ${ready}`,
  );
  expect(child.exitCode).toBeNull();
  return {
    kill: async () => {
      child.kill('SIGKILL');
      await ended;
    },
  };
}

/** Opens the state dir as the next agent would; closed at the test's end, what runs stopped first. */
async function reopen(stateDir: string, specs: Record<string, LaunchSpec> | undefined, events: CustodyEvent[] = []) {
  const opened = await Supervisor.open({ stateDir, specs, onEvent: (e) => events.push(e) });
  cleanups.push(async () => {
    for (const i of opened.supervisor.list())
      if (i.status === 'running') await opened.supervisor.stop(i.id, { graceMs: 1000 }).catch(() => {});
    await opened.supervisor.close();
  });
  return opened;
}

describe(`an agent SIGKILLed mid-end (${backend.name})`, () => {
  const stateOf = () => {
    const d = tmpDir('custody-agent-');
    cleanups.push(() => d.cleanup());
    return join(d.path, 'state');
  };

  it('during afterExit: the next open runs the hook again from its spec, once, with the end it had; without a spec the state waits (no-spec) until launch()', async () => {
    const stateDir = stateOf();
    const p = player('vm', ['exit 3', 'run']);
    const first = await agent('hook', p, stateDir, 'agent-hook');
    const told: AfterExitEnd = JSON.parse(readFileSync(join(p.dir, 'agent-hook'), 'utf8'));
    await first.kill();
    expect(told).toMatchObject({ id: 'vm', code: 3, result: 'exit-code', restarting: false });
    expect(manifestOf(stateDir, 'vm')).toMatchObject({ owed: told });
    // Without a spec: nothing runs, the state waits, shown exited (no-spec).
    const waiting = await reopen(stateDir, undefined);
    expect(waiting.report.adopted).toEqual([{ id: 'vm', pid: told.pid, reason: 'no-spec' }]);
    expect(waiting.supervisor.list()).toEqual([
      expect.objectContaining({
        id: 'vm',
        status: 'exited',
        reason: 'no-spec',
        exit: { code: 3, signal: null, result: 'exit-code' },
      }),
    ]);
    await waiting.supervisor.close();
    // With its spec: run once, from the recorded end, then the state goes.
    const calls: AfterExitEnd[] = [];
    const spec = { ...p.spec, afterExit: (end: AfterExitEnd) => void calls.push(end) };
    const again = await reopen(stateDir, { vm: spec });
    expect(again.report.cleaned).toEqual([expect.objectContaining({ id: 'vm', reason: 'gone' })]);
    expect(calls).toEqual([told]);
    expect(existsSync(join(stateDir, 'vm'))).toBe(false);
  });

  it('without a spec at open, launch() runs the owed hook from its own spec before it launches; remove() forgets it unrun', async () => {
    const stateDir = stateOf();
    const p = player('vm', ['exit 3', 'run']);
    const first = await agent('hook', p, stateDir, 'agent-hook');
    await first.kill();
    const { supervisor } = await reopen(stateDir, undefined);
    const calls: string[] = [];
    await supervisor.launch({ ...p.spec, afterExit: (end) => void calls.push(`${end.result}:${end.pid}`) });
    expect(calls).toEqual([`exit-code:${p.runs()[0]}`]);
    expect(supervisor.list()).toEqual([expect.objectContaining({ id: 'vm', status: 'running' })]);
  });

  it('during a backoff: the next open restarts it when due, its count carried on', async () => {
    const stateDir = stateOf();
    const p = player('vm', ['exit 3', 'run']);
    const first = await agent('backoff', p, stateDir, 'agent-backoff');
    await first.kill();
    expect(manifestOf(stateDir, 'vm')).toMatchObject({ state: 'backoff', restart: { restarts: 1 } });
    const events: CustodyEvent[] = [];
    const { supervisor, report } = await reopen(
      stateDir,
      { vm: { ...p.spec, restart: { when: 'on-failure', delayMs: 1500 } } },
      events,
    );
    expect(report.adopted).toEqual([{ id: 'vm', reason: 'backoff' }]);
    await waitFor(() => supervisor.list().find((i) => i.status === 'running'), 20_000, 'the restart');
    expect(supervisor.get('vm')?.restarts).toBe(1);
    await waitFor(() => p.runs().length === 2, 5000, 'the second run counted');
  });

  it("during a restart's launch: the next open adopts the restarted run, with the restart counted once", async () => {
    const stateDir = stateOf();
    const p = player('vm', ['exit 3', 'run']);
    const first = await agent('relaunch', p, stateDir, 'agent-backoff');
    // The restart is confirmed (its identity recorded) and waits for a readiness that never comes.
    await waitFor(
      () => p.runs().length === 2 && manifestOf(stateDir, 'vm')?.identity?.pid === p.runs()[1],
      20_000,
      'the restart confirmed',
    );
    await first.kill();
    const { supervisor, report } = await reopen(stateDir, {
      vm: { ...p.spec, restart: { when: 'on-failure', delayMs: 0 } },
    });
    expect(report.adopted).toEqual([expect.objectContaining({ id: 'vm', pid: p.runs()[1] })]);
    expect(supervisor.get('vm')?.restarts).toBe(1);
    expect(supervisor.list()).toEqual([expect.objectContaining({ id: 'vm', status: 'running', restarts: 1 })]);
    expect(manifestOf(stateDir, 'vm')).toMatchObject({ state: 'running', restart: { restarts: 1 } });
  });
});
