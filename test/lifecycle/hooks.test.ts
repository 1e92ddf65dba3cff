// Hooks may be sync or async; event sinks that fail are contained and reported.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { callHook } from '../../src/lifecycle/hooks.js';
import { Supervisor } from '../../src/index.js';
import { expectNoLeaks, processesWithMarker } from '../helpers/leaks.js';
import { isGone, MARKER, tmpDir } from '../helpers/procs.js';
import { openSupervisor, PERL, PYTHON, vmArgs } from '../helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });

let ctx: Awaited<ReturnType<typeof openSupervisor>> | undefined;
afterEach(async () => {
  await ctx?.dispose();
  ctx = undefined;
});

describe('callHook', () => {
  it('turns a value, a promise, a throw and a throwing thenable into one promise', async () => {
    await expect(callHook(() => 5)).resolves.toBe(5);
    await expect(callHook(async (a: number, b: number) => a + b, 2, 3)).resolves.toBe(5);
    await expect(callHook(() => undefined)).resolves.toBeUndefined();
    await expect(
      callHook(() => {
        throw new Error('sync');
      }),
    ).rejects.toThrow('sync');
    await expect(callHook(async () => Promise.reject(new Error('async')))).rejects.toThrow('async');
    const thenable = {
      // biome-ignore lint/suspicious/noThenProperty: a hostile thenable is what this test feeds the hook runner
      then() {
        throw new Error('then');
      },
    };
    await expect(callHook(() => thenable)).rejects.toThrow('then');
  });

  it('a hook that fails with something other than an Error fails with an Error whose cause it is', async () => {
    for (const value of [null, undefined, 'no', 7]) {
      const thrown = callHook(() => {
        throw value;
      });
      await expect(thrown).rejects.toBeInstanceOf(Error);
      await expect(thrown).rejects.toMatchObject({ cause: value });
      await expect(callHook(() => Promise.reject(value))).rejects.toMatchObject({ cause: value });
    }
  });
});

describe(`a ready check that rejects with null (${backend.name})`, () => {
  it('abandons the launch as any failure does: an Error, an abandon event, nothing left', async () => {
    const events: string[] = [];
    ctx = await openSupervisor({ onEvent: (e: { type: string }) => events.push(e.type) });
    const launch = ctx.supervisor.launch({
      id: 'n',
      command: PERL,
      args: (t) => ['-e', 'sleep 30', '--', t, MARKER],
      ready: () => Promise.reject(null),
    });
    await expect(launch).rejects.toMatchObject({ message: 'a hook failed with null', cause: null });
    expect(events).toContain('abandon');
    expect(ctx.supervisor.list()).toEqual([]);
    expect(processesWithMarker(MARKER)).toEqual([]);
  });
});

describe(`sync hooks (${backend.name})`, () => {
  it('a sync graceful hook is waited on like an async one: the process stops its own way', async () => {
    ctx = await openSupervisor();
    const socket = join(ctx.root, 'g.sock');
    const inst = await ctx.supervisor.launch({
      id: 'g',
      command: PYTHON,
      args: (t) => vmArgs(socket, t),
      ready: { socket },
    });
    let calls = 0;
    const r = await ctx.supervisor.stop('g', {
      graceMs: 5000,
      graceful: (i) => {
        calls++;
        // Asks, synchronously; the fake VM exits 0 on SIGTERM.
        process.kill(i.pid, 'SIGTERM');
      },
    });
    expect(calls).toBe(1);
    expect(r).toMatchObject({ outcome: 'exited', escalated: false });
    expect(isGone(inst.pid)).toBe(true);
    expect(ctx.supervisor.list()).toEqual([]);
  });

  it('a sync graceful hook that throws is a warning, and the stop goes on', async () => {
    ctx = await openSupervisor();
    const socket = join(ctx.root, 't.sock');
    const inst = await ctx.supervisor.launch({
      id: 't',
      command: PYTHON,
      args: (t) => vmArgs(socket, t),
      ready: { socket },
    });
    const r = await ctx.supervisor.stop('t', {
      graceMs: 5000,
      graceful: () => {
        throw new Error('no control socket');
      },
    });
    expect(r).toMatchObject({ outcome: 'exited' });
    expect(isGone(inst.pid)).toBe(true);
    expect(ctx.events.some((e) => e.type === 'warning' && /no control socket/.test(String(e.message)))).toBe(true);
  });

  it('a sync pid function and a sync ready function work; a ready function that throws fails the launch cleanly', async () => {
    ctx = await openSupervisor();
    const pidfile = join(ctx.root, 'sync.pid');
    let readyCalls = 0;
    const inst = await ctx.supervisor.launch({
      id: 'sync',
      command: 'sh',
      // The launcher writes the pidfile before it forks anything, so a sync read finds it.
      args: (t) => ['-c', `echo $$ > "$3"; exec "$0" -e 'sleep 300' "$1" "$2"`, PERL, t, MARKER, pidfile],
      pid: () => {
        const deadline = Date.now() + 5000;
        while (!(existsSync(pidfile) && readFileSync(pidfile, 'utf8').endsWith('\n')) && Date.now() < deadline) {
          Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 2);
        }
        return Number(readFileSync(pidfile, 'utf8'));
      },
      executable: PERL,
      ready: (i) => {
        readyCalls++;
        expect(i.pid).toBeGreaterThan(1);
      },
    });
    expect(readyCalls).toBe(1);
    expect(inst.identity.argv[0]).toBe(PERL);
    await ctx.supervisor.stop('sync', { graceMs: 5000 });
    await expect(
      ctx.supervisor.launch({
        id: 'nope',
        command: PERL,
        args: (t) => ['-e', 'sleep 300', t, MARKER],
        ready: () => {
          throw new Error('health check refused');
        },
      }),
    ).rejects.toThrow('health check refused');
    expect(processesWithMarker(MARKER)).toEqual([]);
    expect(ctx.supervisor.list()).toEqual([]);
  });
});

describe(`event sinks that fail (${backend.name})`, () => {
  it.each([
    ['rejects', () => Promise.reject(new Error('sink down'))],
    [
      'throws',
      () => {
        throw new Error('sink down');
      },
    ],
  ])(
    'a sink that %s never crashes the process nor orphans the target; each failure is a CUSTODY_EVENT_SINK warning',
    async (_how, sink) => {
      const warnings: Error[] = [];
      const onWarning = (w: Error) => {
        if ((w as Error & { code?: string }).code === 'CUSTODY_EVENT_SINK') warnings.push(w);
      };
      process.on('warning', onWarning);
      const dir = tmpDir();
      // Opened directly: the test helper's own sink would hide what this one returns.
      const { supervisor } = await Supervisor.open({ stateDir: join(dir.path, 'state'), onEvent: sink });
      try {
        const socket = join(dir.path, 's.sock');
        const inst = await supervisor.launch({
          id: 's',
          command: PYTHON,
          args: (t) => vmArgs(socket, t),
          ready: { socket },
        });
        expect(await supervisor.stop('s', { graceMs: 5000 })).toMatchObject({ outcome: 'exited' });
        expect(isGone(inst.pid)).toBe(true);
        const ofS = () => warnings.filter((w) => /"id":"s"/.test(String((w as Error & { detail?: string }).detail)));
        // launch, spawn, confirm, ready, running, stop: every one reported, none lost.
        const seen = await (async () => {
          for (let i = 0; i < 100 && ofS().length < 6; i++) await new Promise((r) => setTimeout(r, 10));
          return ofS();
        })();
        expect(seen.map((w) => JSON.parse(String((w as Error & { detail?: string }).detail)).type)).toEqual([
          'launch',
          'spawn',
          'confirm',
          'ready',
          'running',
          'stop',
        ]);
        expect(seen[0]!.message).toMatch(/sink down/);
      } finally {
        process.off('warning', onWarning);
        await supervisor.close();
        dir.cleanup();
      }
    },
  );
});
