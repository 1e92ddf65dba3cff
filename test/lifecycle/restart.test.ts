// Restart policies (LaunchSpec.restart) with systemd's meaning: which ends
// restart under which policy (exit 0, exit 3, a successCodes code, SIGKILL
// from outside, SIGTERM, failed health probes), the delays (the first at
// least delayMs, doubling to maxDelayMs, from delayMs again after a run of
// resetAfterMs), the limit (`failed`, `gave-up`, launch() starts afresh),
// stop() during backoff, logs appended across restarts, and the budget
// carried across a supervisor that closes and one that opens with specs, or
// without (`no-spec`). Real processes: a perl program that plays one line
// of a plan file per run.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { type CustodyEvent, type Instance, type LaunchSpec, Supervisor } from '../../src/index.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { playerOf } from '../helpers/player.js';
import { isGone, MARKER, waitFor } from '../helpers/procs.js';
import { openSupervisor } from '../helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });

let ctx: Awaited<ReturnType<typeof openSupervisor>> | undefined;
const cleanups: Array<() => Promise<void> | void> = [];
const player = (id: string, plan: string[], restart: LaunchSpec['restart'], extra: Partial<LaunchSpec> = {}) => {
  const p = playerOf(id, plan, { restart, ...extra });
  cleanups.push(p.cleanup);
  return p;
};
afterEach(async () => {
  for (const c of cleanups.splice(0).reverse()) await c();
  await ctx?.dispose();
  ctx = undefined;
});

/** Opens the state dir again (after ctx's supervisor closed); closed at the test's end, what runs stopped first. */
async function reopen(specs: Record<string, LaunchSpec> | undefined, events: CustodyEvent[]) {
  const opened = await Supervisor.open({ stateDir: ctx!.stateDir, specs, onEvent: (e) => events.push(e) });
  cleanups.push(async () => {
    for (const i of opened.supervisor.list())
      if (i.status === 'running') await opened.supervisor.stop(i.id, { graceMs: 500 }).catch(() => {});
    await opened.supervisor.close();
  });
  return opened;
}

const of = <T extends CustodyEvent['type']>(events: CustodyEvent[], type: T, id: string) =>
  events.filter((e): e is Extract<CustodyEvent, { type: T }> => e.type === type && e.id === id);

/** Resolves with what happened first after the first run ended: a restart was scheduled, or the instance ended for good. */
async function firstOutcome(inst: Instance, id: string): Promise<string> {
  let settled = false;
  void inst.exited.then(() => (settled = true));
  return waitFor(
    () => {
      const r = of(ctx!.events, 'restart', id)[0];
      if (r) return `restart:${r.result}`;
      return settled ? `ended:${inst.lastExit?.result}` : undefined;
    },
    20_000,
    `the first end of ${id}`,
  );
}

describe(`restart policies (${backend.name})`, () => {
  it("each policy restarts after the ends systemd's Restart= names, and after no other", async () => {
    ctx = await openSupervisor();
    // [end, how it is made, result]: SIGKILL is sent from outside, to a run that idles.
    const ends: Array<[string, string]> = [
      ['exit 0', 'success'],
      ['exit 3', 'exit-code'],
      ['exit 7', 'exit-code'],
      ['outside KILL', 'signal'],
      ['sig TERM', 'signal'],
    ];
    const restartsAfter: Record<string, boolean[]> = {
      // exit 0, exit 3, exit 7 (a success code), SIGKILL, SIGTERM
      no: [false, false, false, false, false],
      'on-failure': [false, true, false, true, false],
      'on-abnormal': [false, false, false, true, false],
      always: [true, true, true, true, true],
    };
    const cases = Object.entries(restartsAfter).flatMap(([when, expected]) =>
      ends.map(([end, result], k) => ({ when, end, result, restarts: expected[k], id: `${when}-${k}` })),
    );
    const outcomes = await Promise.all(
      cases.map(async (c) => {
        const plan = c.end.startsWith('outside') ? ['run', 'run'] : [c.end, 'run'];
        const restart = { when: c.when as 'no', delayMs: 0, successCodes: [7] };
        const p = player(c.id, plan, restart);
        const inst = await ctx!.supervisor.launch(p.spec);
        p.go();
        if (c.end.startsWith('outside')) process.kill(inst.pid, 'SIGKILL');
        return firstOutcome(inst, c.id);
      }),
    );
    const want = cases.map((c) => `${c.restarts ? 'restart' : 'ended'}:${c.result}`);
    expect(outcomes.map((o, k) => `${cases[k]!.id} ${o}`)).toEqual(cases.map((c, k) => `${c.id} ${want[k]}`));
    // Each restarted one runs again, as the same Instance with one restart.
    for (const c of cases.filter((x) => x.restarts)) {
      await waitFor(
        () => ctx!.supervisor.list().find((i) => i.id === c.id && i.status === 'running' && i.restarts === 1),
        20_000,
        `${c.id} running again`,
      );
      expect(ctx.supervisor.get(c.id)?.restarts).toBe(1);
    }
    // Without a policy ('no') nothing is counted.
    for (const c of cases.filter((x) => !x.restarts)) {
      const row = ctx.supervisor.list().find((i) => i.id === c.id);
      expect([row?.status, row?.restarts], c.id).toEqual(['exited', c.when === 'no' ? undefined : 0]);
    }
  });

  it('restarts one whose health probes fail, until its limit: then failed, gave-up, and launch() starts afresh', async () => {
    ctx = await openSupervisor();
    const p = player(
      'sick',
      [],
      { when: 'on-abnormal', delayMs: 0, limit: { count: 1, withinMs: 60_000 } },
      {
        health: {
          intervalMs: 20,
          failures: 2,
          graceMs: 200,
          probe: () => {
            throw new Error('never healthy');
          },
        },
      },
    );
    const inst = await ctx.supervisor.launch(p.spec);
    p.go();
    const end = await inst.exited;
    expect(end).toMatchObject({ code: null, signal: 'SIGTERM' });
    expect(inst.lastExit).toMatchObject({ result: 'health' });
    expect(of(ctx.events, 'restart', 'sick').map((e) => [e.attempt, e.result])).toEqual([[1, 'health']]);
    expect(of(ctx.events, 'gave-up', 'sick')).toEqual([expect.objectContaining({ result: 'health', restarts: 1 })]);
    expect(ctx.supervisor.list()).toEqual([
      expect.objectContaining({
        id: 'sick',
        status: 'failed',
        pid: null,
        restarts: 1,
        exit: expect.objectContaining({ result: 'health' }),
      }),
    ]);
    expect(p.runs().map(isGone)).toEqual([true, true]);
    const manifest = JSON.parse(readFileSync(join(ctx.stateDir, 'sick', 'manifest.json'), 'utf8'));
    expect(manifest).toMatchObject({ state: 'failed', identity: null, restart: { restarts: 1 } });
    // launch() of a failed id starts afresh: a new Instance, no restarts counted.
    const again = await ctx.supervisor.launch({ ...p.spec, health: undefined });
    expect(again).not.toBe(inst);
    expect(again.restarts).toBe(0);
    await ctx.supervisor.stop('sick', { graceMs: 500 });
  });

  it('waits delayMs, doubling to maxDelayMs, and from delayMs again after a run of resetAfterMs', async () => {
    ctx = await openSupervisor();
    const plan = ['exit 3', 'exit 3', 'exit 3', 'exit 3', 'late 0.8 3', 'exit 3', 'run'];
    const restart = {
      when: 'on-failure' as const,
      delayMs: 100,
      maxDelayMs: 400,
      resetAfterMs: 600,
      limit: { count: 10, withinMs: 60_000 },
    };
    const p = player('loop', plan, restart);
    await ctx.supervisor.launch(p.spec);
    // Every later run acts at once, and may end before it is confirmed: a failed restart, counted the same.
    p.go();
    await waitFor(
      () => ctx!.supervisor.list().find((i) => i.status === 'running' && i.restarts === 6),
      30_000,
      'the seventh run',
    );
    const restarts = of(ctx.events, 'restart', 'loop');
    expect(restarts.map((e) => e.delayMs)).toEqual([100, 200, 400, 400, 100, 200]);
    // Each launch began no sooner than its delay after the end that scheduled it.
    const launches = of(ctx.events, 'launch', 'loop').slice(1);
    expect(launches).toHaveLength(6);
    for (const [k, l] of launches.entries())
      expect(l.time - restarts[k]!.time).toBeGreaterThanOrEqual(restarts[k]!.delayMs - 1);
    await ctx.supervisor.stop('loop', { graceMs: 500 });
  });

  it('stop() during backoff cancels the restart: nothing relaunched, state gone, exited settles as stopped', async () => {
    ctx = await openSupervisor();
    const p = player('slow', ['exit 3'], { when: 'always', delayMs: 60_000 });
    const inst = await ctx.supervisor.launch(p.spec);
    p.go();
    await waitFor(() => ctx!.supervisor.list().find((i) => i.status === 'backoff'), 20_000, 'backoff');
    expect(ctx.supervisor.get('slow')).toBe(inst);
    expect(JSON.parse(readFileSync(join(ctx.stateDir, 'slow', 'manifest.json'), 'utf8'))).toMatchObject({
      state: 'backoff',
      identity: null,
      restart: { restarts: 1, lastExit: { code: 3, result: 'exit-code' } },
    });
    const result = await ctx.supervisor.stop('slow');
    expect(result).toEqual({ outcome: 'already-gone', escalated: false, code: null, signal: null, result: 'stopped' });
    expect(await inst.exited).toEqual({ code: 3, signal: null });
    expect(inst.lastExit?.result).toBe('stopped');
    expect(ctx.supervisor.list()).toEqual([]);
    expect(existsSync(join(ctx.stateDir, 'slow'))).toBe(false);
    expect(p.runs()).toHaveLength(1);
  });

  it('a restart appends to the logs: every run of a crash loop keeps its output', async () => {
    ctx = await openSupervisor();
    const p = player('chatty', ['exit 3', 'exit 3', 'run'], { when: 'on-failure', delayMs: 0 });
    await ctx.supervisor.launch(p.spec);
    p.go();
    await waitFor(
      () => ctx!.supervisor.list().find((i) => i.status === 'running' && i.restarts === 2),
      20_000,
      'the third run',
    );
    const log = join(ctx.stateDir, '.logs', 'chatty', 'stdout.log');
    await waitFor(() => readFileSync(log, 'utf8').includes('run 3'), 20_000, 'the third run in the log');
    expect(readFileSync(log, 'utf8')).toBe('run 1\nrun 2\nrun 3\n');
    await ctx.supervisor.stop('chatty', { graceMs: 500 });
  });

  it('Instance.restarts counts a restart from the moment it is scheduled, and one whose own launch failed', async () => {
    ctx = await openSupervisor();
    // Run 2 is never ready: the restart's launch is abandoned, an end of its own, past the limit: failed.
    const p = player('vm', ['exit 3', 'run'], {
      when: 'on-failure',
      delayMs: 1000,
      limit: { count: 1, withinMs: 60_000 },
    });
    // Counted by calls, not by runs(): run 2 may be checked before perl wrote its pid. It fails
    // once counted, so the abandon cannot come before the run it ends is on record.
    let checks = 0;
    const readyOnlyFirst = async () => {
      if (++checks === 1) return;
      await waitFor(() => p.runs().length === 2, 5000, 'run 2 counted');
      throw new Error('run 2 is never ready');
    };
    const inst = await ctx.supervisor.launch({ ...p.spec, ready: readyOnlyFirst });
    p.go();
    await waitFor(() => ctx!.supervisor.list().find((i) => i.status === 'backoff'), 20_000, 'backoff');
    expect([inst.restarts, ctx.supervisor.list()[0]?.restarts]).toEqual([1, 1]);
    // Its last end is the abandoned launch's: custody ended that process itself, so no status of its own.
    expect(await inst.exited).toEqual({ code: null, signal: null });
    await waitFor(() => ctx!.supervisor.list().find((i) => i.status === 'failed'), 20_000, 'failed');
    expect(p.runs()).toHaveLength(2);
    expect([inst.restarts, ctx.supervisor.list()[0]?.restarts]).toEqual([1, 1]);
    await ctx.supervisor.remove('vm');
  });

  it('the budget is durable: a backoff left by a closed supervisor restarts at the next open with its spec, its count carried on', async () => {
    ctx = await openSupervisor();
    const p = player('vm', ['exit 3', 'run'], {
      when: 'on-failure',
      delayMs: 300,
      limit: { count: 5, withinMs: 60_000 },
    });
    await ctx.supervisor.launch(p.spec);
    p.go();
    await waitFor(() => ctx!.supervisor.list().find((i) => i.status === 'backoff'), 20_000, 'backoff');
    await ctx.supervisor.close();
    // Closed in backoff: nothing restarted it.
    expect(p.runs()).toHaveLength(1);
    const events: CustodyEvent[] = [];
    const { supervisor, report } = await reopen({ vm: p.spec }, events);
    expect(report.adopted).toEqual([{ id: 'vm', reason: 'backoff' }]);
    await waitFor(() => supervisor.list().find((i) => i.status === 'running'), 20_000, 'the restart after open');
    const inst = supervisor.get('vm')!;
    expect(inst.restarts).toBe(1);
    await waitFor(() => p.runs().length === 2, 5000, 'the second run under way');
    expect(inst.pid).toBe(p.runs()[1]);
    await supervisor.stop('vm', { graceMs: 500 });
  });

  it('a run that ended while no supervisor ran is an end like any other: cleaned, then restarted from specs; without a spec it waits as no-spec for launch()', async () => {
    ctx = await openSupervisor();
    const p = player('vm', ['run', 'run', 'run'], { when: 'always', delayMs: 0 });
    const first = await ctx.supervisor.launch(p.spec);
    p.go();
    await waitFor(() => p.runs().length === 1, 5000, 'the first run under way');
    await ctx.supervisor.close();
    process.kill(first.pid, 'SIGKILL');
    await waitFor(() => isGone(first.pid), 5000, 'the run killed while no supervisor ran');
    // Without a spec: cleaned as gone, and it waits, its count carried on.
    const events: CustodyEvent[] = [];
    const opened = await reopen(undefined, events);
    expect(opened.report.cleaned).toEqual([{ id: 'vm', pid: first.pid, reason: 'gone' }]);
    expect(of(events, 'restart', 'vm')).toEqual([expect.objectContaining({ attempt: 1, result: 'unknown' })]);
    expect(opened.supervisor.list()).toEqual([
      expect.objectContaining({ id: 'vm', status: 'backoff', reason: 'no-spec', restarts: 1 }),
    ]);
    expect(p.runs()).toHaveLength(1);
    await opened.supervisor.close();
    // Opened again, now with its spec: the backoff it recorded is due, and it runs.
    const again = await reopen({ vm: p.spec }, events);
    expect(again.report.adopted).toEqual([{ id: 'vm', reason: 'backoff' }]);
    await waitFor(() => again.supervisor.list().find((i) => i.status === 'running'), 20_000, 'the restart');
    expect(again.supervisor.get('vm')?.restarts).toBe(1);
    // launch() of a waiting id carries the count on too.
    await again.supervisor.stop('vm', { graceMs: 500 });
  });

  it('refuses a malformed policy before anything exists', async () => {
    ctx = await openSupervisor();
    const base = player('bad', [], undefined).spec;
    const bad: unknown[] = [
      { when: 'sometimes' },
      { when: 'always', delayMs: -1 },
      { when: 'always', delayMs: 200, maxDelayMs: 100 },
      { when: 'always', limit: { count: 1.5, withinMs: 10 } },
      { when: 'always', successCodes: [256] },
      { when: 'always', delay: 5 },
      'always',
    ];
    for (const restart of bad)
      await expect(ctx.supervisor.launch({ ...base, restart: restart as never })).rejects.toMatchObject({
        code: 'ERR_CUSTODY_INVALID_ARG',
      });
    expect(ctx.supervisor.list()).toEqual([]);
    expect(existsSync(join(ctx.stateDir, 'bad'))).toBe(false);
  });
});
