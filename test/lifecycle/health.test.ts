// Liveness probes (LaunchSpec.health): after readiness a probe runs every
// intervalMs; `failures` failed or timed-out probes in a row end the
// instance through the stop path, whose result says `health`; one that
// succeeds resets the count. Real processes; the probes are the test's
// functions (a file that says healthy, a probe that hangs).
import { existsSync, readdirSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { type CustodyEvent, type LaunchSpec, type StopEvent, Supervisor } from '../../src/index.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { MARKER, tmpDir, waitFor } from '../helpers/procs.js';
import { openSupervisor, PERL } from '../helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });

let ctx: Awaited<ReturnType<typeof openSupervisor>> | undefined;
afterEach(async () => {
  await ctx?.dispose();
  ctx = undefined;
});

const idle = (t: string) => ['-e', 'sleep 30', '--', t, MARKER];

const stopEvent = (id: string) =>
  waitFor(() => ctx?.events.find((e): e is StopEvent => e.type === 'stop' && e.id === id), 20_000, `the stop of ${id}`);

const warnings = (id: string) => ctx!.events.filter((e) => e.type === 'warning' && e.id === id).map((e) => e.message);

/** Instance `vm`, idle, probed every 20 ms; `healthy()` false is a failed probe, two in a row end it. */
const probedVm = (healthy: () => boolean): LaunchSpec => ({
  id: 'vm',
  command: PERL,
  args: idle,
  health: {
    intervalMs: 20,
    failures: 2,
    probe: () => {
      if (!healthy()) throw new Error('not healthy');
    },
  },
});

describe(`health probes (${backend.name})`, () => {
  it('a healthy instance runs on; once its probe fails `failures` times in a row it is stopped, result health', async () => {
    ctx = await openSupervisor();
    const healthy = join(ctx.root, 'healthy');
    writeFileSync(healthy, '');
    let probes = 0;
    const inst = await ctx.supervisor.launch(
      probedVm(() => {
        probes++;
        return existsSync(healthy);
      }),
    );
    await waitFor(() => probes >= 5, 10_000, 'five probes');
    expect(ctx.supervisor.list()).toMatchObject([{ id: 'vm', status: 'running' }]);
    expect(warnings('vm')).toEqual([]);
    rmSync(healthy);
    const stop = await stopEvent('vm');
    expect(stop).toMatchObject({ outcome: 'exited', signal: 'SIGTERM', result: 'health' });
    expect(inst.lastExit).toEqual({ code: null, signal: 'SIGTERM', result: 'health' });
    expect(warnings('vm')).toEqual(['health probe 1/2 failed: not healthy', 'health probe 2/2 failed: not healthy']);
    expect(ctx.supervisor.list()).toEqual([]);
    expect(readdirSync(ctx.stateDir).filter((n) => !n.startsWith('.'))).toEqual([]);
  });

  it('a probe that hangs past timeoutMs fails, and its signal is aborted', async () => {
    ctx = await openSupervisor();
    const signals: AbortSignal[] = [];
    await ctx.supervisor.launch({
      id: 'hung',
      command: PERL,
      args: idle,
      health: {
        intervalMs: 10,
        timeoutMs: 50,
        failures: 1,
        probe: (_inst, signal) => {
          signals.push(signal);
          return new Promise(() => {});
        },
      },
    });
    expect(await stopEvent('hung')).toMatchObject({ result: 'health' });
    expect(warnings('hung')).toEqual(['health probe 1/1 failed: timed out after 50 ms']);
    expect(signals).toHaveLength(1);
    expect(signals[0]!.aborted).toBe(true);
  });

  it('a probe that succeeds resets the count: failures that never come `failures` in a row end nothing', async () => {
    ctx = await openSupervisor();
    let probes = 0;
    await ctx.supervisor.launch({
      id: 'flaky',
      command: PERL,
      args: idle,
      health: {
        intervalMs: 10,
        failures: 2,
        // Every other probe fails (async, a rejection): one failure at a time, never two in a row.
        probe: async () => {
          probes++;
          if (probes % 2 === 1) throw new Error(`flake ${probes}`);
        },
      },
    });
    await waitFor(() => probes >= 12, 10_000, 'twelve probes');
    expect(ctx.supervisor.list()).toMatchObject([{ id: 'flaky', status: 'running' }]);
    expect(ctx.events.some((e) => e.type === 'stop')).toBe(false);
    expect(warnings('flaky').every((m) => m.startsWith('health probe 1/2 failed: flake'))).toBe(true);
    const r = await ctx.supervisor.stop('flaky', { graceMs: 5000 });
    expect(r.result).toBe('stopped');
  });

  it('an adopted instance is probed from open({ specs }); without its spec, a warning says it is not', async () => {
    const dir = tmpDir('custody-health-adopt-');
    const stateDir = join(dir.path, 'state');
    const events: CustodyEvent[] = [];
    const onEvent = (e: CustodyEvent) => events.push(e);
    let healthy = true;
    const spec = probedVm(() => healthy);
    const sups: Supervisor[] = [];
    try {
      const first = (await Supervisor.open({ stateDir, onEvent })).supervisor;
      sups.push(first);
      const inst = await first.launch(spec);
      await first.close();
      // Reopened without its spec: adopted, not probed, and the warning says why.
      const bare = (await Supervisor.open({ stateDir, onEvent })).supervisor;
      sups.push(bare);
      expect(bare.list()).toMatchObject([{ id: 'vm', status: 'running', pid: inst.pid }]);
      expect(events.filter((e) => e.type === 'warning' && e.id === 'vm').map((e) => e.message)).toEqual([
        'vm was launched with a health probe; without its spec in open({ specs }) it is not probed',
      ]);
      await bare.close();
      // Reopened with it: probed again, and ended by its failures.
      const withSpec = (await Supervisor.open({ stateDir, onEvent, specs: { vm: spec } })).supervisor;
      sups.push(withSpec);
      healthy = false;
      const stop = await waitFor(
        () => events.find((e): e is StopEvent => e.type === 'stop' && e.id === 'vm'),
        20_000,
        'the stop',
      );
      expect(stop).toMatchObject({ pid: inst.pid, outcome: 'exited', result: 'health' });
      expect(withSpec.list()).toEqual([]);
    } finally {
      for (const s of sups) await s.close();
      dir.cleanup();
    }
  });

  it('specs in open() are checked as launch() checks a spec, each under its own id', async () => {
    const dir = tmpDir('custody-health-specs-');
    const stateDir = join(dir.path, 'state');
    try {
      const spec = { id: 'vm', command: PERL, args: idle };
      for (const specs of [
        null,
        [],
        { vm: { ...spec, id: 'other' } },
        { vm: { ...spec, health: { intervalMs: 5 } } },
      ]) {
        await expect(Supervisor.open({ stateDir, specs } as never), JSON.stringify(specs)).rejects.toMatchObject({
          code: 'ERR_CUSTODY_INVALID_ARG',
        });
      }
    } finally {
      dir.cleanup();
    }
  });

  it('a bad health spec is ERR_CUSTODY_INVALID_ARG before anything exists', async () => {
    ctx = await openSupervisor();
    const base = { id: 'bad', command: PERL, args: idle };
    for (const health of [
      null,
      { intervalMs: 10 },
      { probe: () => {}, intervalMs: 0 },
      { probe: () => {}, intervalMs: 2 ** 31 },
      { probe: () => {}, intervalMs: 10, failures: 0 },
      { probe: () => {}, intervalMs: 10, failures: 1.5 },
      { probe: () => {}, intervalMs: 10, timeoutMs: -1 },
      { probe: () => {}, intervalMs: 10, interval: 5 },
    ]) {
      await expect(ctx.supervisor.launch({ ...base, health } as never), JSON.stringify(health)).rejects.toMatchObject({
        code: 'ERR_CUSTODY_INVALID_ARG',
      });
    }
    expect(readdirSync(ctx.stateDir).filter((n) => !n.startsWith('.'))).toEqual([]);
  });
});
