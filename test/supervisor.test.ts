import { spawn as cpSpawn } from 'node:child_process';
import { subscribe, unsubscribe } from 'node:diagnostics_channel';
import { existsSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { backend } from '../src/backend/index.js';
import { Supervisor, verify, type CustodyEvent } from '../src/index.js';
import { expectNoLeaks, processesWithMarker } from './helpers/leaks.js';
import { goneFrom, goneSince, isGone, killAndWait, loggedSignals, MARKER, tmpDir, waitFor } from './helpers/procs.js';
import { LAUNCHER, openSupervisor, PERL, PYTHON, vmArgs } from './helpers/supervisor.js';
import { holdThreadpool } from './helpers/threadpool.js';

expectNoLeaks({ marker: MARKER });

let ctx: Awaited<ReturnType<typeof openSupervisor>>;
afterEach(async () => {
  await ctx?.dispose();
});

const manifestOf = (id: string) => JSON.parse(readFileSync(join(ctx.stateDir, id, 'manifest.json'), 'utf8'));
const types = (events: CustodyEvent[], id?: string) => events.filter((e) => !id || e.id === id).map((e) => e.type);

describe(`Supervisor lifecycle (${backend.name})`, () => {
  it('launches, confirms, waits for the socket, records the identity, and stops', async () => {
    ctx = await openSupervisor();
    const socket = join(ctx.root, 'vm.sock');
    const inst = await ctx.supervisor.launch({
      id: 'vm-1',
      command: PYTHON,
      args: (t) => vmArgs(socket, t),
      ready: { socket },
      expect: ['--socket'],
    });
    expect(inst.identity.argv).toContain(inst.token);
    expect(inst.token).toMatch(/^[0-9a-f]{32}$/);
    const m = manifestOf('vm-1');
    expect(m).toMatchObject({ version: 3, id: 'vm-1', state: 'running', token: inst.token });
    expect(verify(m.identity)).toEqual({ verdict: 'ok' });
    expect(ctx.supervisor.list()).toEqual([{ id: 'vm-1', status: 'running', pid: inst.pid, ppid: process.pid }]);
    const r = await ctx.supervisor.stop('vm-1', { graceMs: 5000 });
    expect(r).toEqual({ outcome: 'exited', escalated: false, code: 0, signal: null, result: 'stopped' });
    expect(existsSync(join(ctx.stateDir, 'vm-1'))).toBe(false);
    expect(existsSync(socket)).toBe(false);
    expect(ctx.supervisor.list()).toEqual([]);
    expect(types(ctx.events, 'vm-1')).toEqual(['launch', 'spawn', 'confirm', 'ready', 'running', 'stop']);
  });

  it('records the final identity through a launcher that reports a pre-exec pid (random exec delays)', async () => {
    ctx = await openSupervisor();
    for (let i = 0; i < 4; i++) {
      const pidfile = join(ctx.root, `vm-${i}.pid`);
      const socket = join(ctx.root, `vm-${i}.sock`);
      const delay = (Math.random() * 0.3).toFixed(3);
      const inst = await ctx.supervisor.launch({
        id: `race-${i}`,
        command: LAUNCHER,
        args: (t) => [pidfile, delay, PYTHON, ...vmArgs(socket, t)],
        pid: { file: pidfile },
        launcherExits: false,
        // Named or not: a pid still running the launcher's program is its fork.
        ...(i % 2 ? { executable: PYTHON } : {}),
        ready: { socket },
      });
      const m = manifestOf(`race-${i}`);
      // The fork's argv carries every target argument too; only the exec'd
      // python is the target, and the manifest holds its identity.
      expect(m.identity.argv[0]).toBe(PYTHON);
      expect(m.identity.pid).toBe(inst.pid);
      expect(verify(m.identity)).toEqual({ verdict: 'ok' });
      await ctx.supervisor.stop(`race-${i}`, { graceMs: 5000 });
    }
  });

  it('abandons a launcher whose child never execs: confirm timeout, killed, reaped, state gone, next launch works', async () => {
    ctx = await openSupervisor();
    const pidfile = join(ctx.root, 'never.pid');
    const socket = join(ctx.root, 'never.sock');
    const started = Date.now();
    await expect(
      ctx.supervisor.launch({
        id: 'never',
        command: LAUNCHER,
        args: (t) => [pidfile, '600', PYTHON, ...vmArgs(socket, t)],
        pid: { file: pidfile },
        launcherExits: false,
        executable: PYTHON,
        confirmTimeoutMs: 400,
      }),
    ).rejects.toMatchObject({ code: 'ERR_CUSTODY_CONFIRM_TIMEOUT' });
    expect(Date.now() - started).toBeLessThan(5000);
    expect(processesWithMarker(MARKER)).toEqual([]);
    expect(existsSync(join(ctx.stateDir, 'never'))).toBe(false);
    expect(existsSync(pidfile)).toBe(false);
    expect(types(ctx.events, 'never')).toContain('abandon');
    const ok = await ctx.supervisor.launch({
      id: 'never',
      command: PYTHON,
      args: (t) => vmArgs(socket, t),
      ready: { socket },
    });
    expect(ok.pid).toBeGreaterThan(0);
  });

  it('fails fast with the exit status and stderr tail when the process exits during the socket wait', async () => {
    ctx = await openSupervisor();
    const socket = join(ctx.root, 'early.sock');
    const stderr = join(ctx.root, 'early.err');
    const started = Date.now();
    const err = await ctx.supervisor
      .launch({
        id: 'early',
        command: PYTHON,
        args: (t) => vmArgs(socket, t, ['--socket-delay', '0.1', '--fail-before-socket', '7']),
        ready: { socket, timeoutMs: 20_000 },
        stderr: { file: stderr },
      })
      .catch((e) => e);
    expect(err).toMatchObject({ code: 'ERR_CUSTODY_LAUNCH_EXITED', exitCode: 7, signal: null });
    expect(err.stderrTail).toContain('cannot open disk image');
    expect(err.message).toContain('cannot open disk image');
    expect(Date.now() - started).toBeLessThan(5000);
    expect(existsSync(join(ctx.stateDir, 'early'))).toBe(false);
  });

  it('retries, reaping every attempt and removing the socket between attempts', async () => {
    const socketsAtAbandon: boolean[] = [];
    let socket = '';
    ctx = await openSupervisor({ onEvent: (e) => e.type === 'abandon' && socketsAtAbandon.push(existsSync(socket)) });
    socket = join(ctx.root, 'retry.sock');
    const counter = join(ctx.root, 'fail-count');
    writeFileSync(counter, '2');
    const inst = await ctx.supervisor.launch({
      id: 'retry',
      command: PYTHON,
      args: (t) => vmArgs(socket, t, ['--fail-count-file', counter]),
      ready: { socket, timeoutMs: 5000 },
      attempts: 3,
    });
    expect(types(ctx.events, 'retry').filter((t) => t === 'abandon' || t === 'retry' || t === 'running')).toEqual([
      'abandon',
      'retry',
      'abandon',
      'retry',
      'running',
    ]);
    expect(socketsAtAbandon).toEqual([false, false]);
    // Every earlier attempt's process is gone, not a zombie.
    for (const e of ctx.events.filter((x) => x.type === 'spawn' && x.pid !== inst.pid))
      expect(goneFrom(e.pid!)).toBe(true);
    await expect(
      ctx.supervisor.launch({
        id: 'fails',
        command: PYTHON,
        args: (t) => vmArgs(`${socket}2`, t, ['--fail-before-socket', '1']),
        ready: { socket: `${socket}2` },
        attempts: 2,
      }),
    ).rejects.toMatchObject({ code: 'ERR_CUSTODY_LAUNCH_EXITED' });
  });

  it('escalates to SIGKILL within the bound for a target that ignores SIGTERM, and says so', async () => {
    ctx = await openSupervisor();
    const socket = join(ctx.root, 'stubborn.sock');
    const log = join(ctx.root, 'signals.log');
    await ctx.supervisor.launch({
      id: 'stubborn',
      command: PYTHON,
      args: (t) => vmArgs(socket, t, ['--ignore-term', '--signal-log', log]),
      ready: { socket },
    });
    const started = Date.now();
    // Long enough for python to log the SIGTERM it ignores on a loaded machine.
    const r = await ctx.supervisor.stop('stubborn', { graceMs: 1000 });
    expect(r).toEqual({ outcome: 'exited', escalated: true, code: null, signal: 'SIGKILL', result: 'stopped' });
    expect(Date.now() - started).toBeLessThan(5000);
    expect(loggedSignals(log)).toEqual(['SIGTERM']);
    expect(ctx.events.find((e) => e.type === 'escalate')).toMatchObject({ id: 'stubborn' });
    expect(existsSync(socket)).toBe(false);
  });

  it('while a stop is in flight the instance still lists as running, a second stop joins it, launch and remove are refused', async () => {
    ctx = await openSupervisor();
    const socket = join(ctx.root, 'slow.sock');
    const inst = await ctx.supervisor.launch({
      id: 'slow',
      command: PYTHON,
      args: (t) => vmArgs(socket, t, ['--ignore-term']),
      ready: { socket },
    });
    const first = ctx.supervisor.stop('slow', { graceMs: 400 });
    const second = ctx.supervisor.stop('slow', { graceMs: 5 });
    expect(ctx.supervisor.list()).toMatchObject([{ id: 'slow', status: 'running', pid: inst.pid }]);
    expect(ctx.supervisor.get('slow')).toBe(inst);
    await expect(ctx.supervisor.remove('slow')).rejects.toMatchObject({ code: 'ERR_CUSTODY_BUSY' });
    await expect(
      ctx.supervisor.launch({ id: 'slow', command: PYTHON, args: (t) => vmArgs(socket, t), ready: { socket } }),
    ).rejects.toMatchObject({ code: 'ERR_CUSTODY_BUSY', message: expect.stringMatching(/stopping/) });
    const [a, b] = await Promise.all([first, second]);
    expect(a).toEqual({ outcome: 'exited', escalated: true, code: null, signal: 'SIGKILL', result: 'stopped' });
    expect(b).toEqual(a);
    expect(ctx.supervisor.list()).toEqual([]);
    expect(ctx.supervisor.get('slow')).toBeUndefined();
    // Exactly one stop ran: one escalation, one stop event.
    expect(types(ctx.events, 'slow').filter((t) => t === 'escalate' || t === 'stop')).toEqual(['escalate', 'stop']);
  });

  it('bounds a graceful hook that hangs, warns, and terminates', async () => {
    ctx = await openSupervisor();
    const socket = join(ctx.root, 'hang.sock');
    await ctx.supervisor.launch({ id: 'hang', command: PYTHON, args: (t) => vmArgs(socket, t), ready: { socket } });
    let hookSignal: AbortSignal | undefined;
    const r = await ctx.supervisor.stop('hang', {
      graceMs: 200,
      graceful: (_inst, signal) => {
        hookSignal = signal;
        return new Promise(() => {});
      },
    });
    expect(r).toMatchObject({ outcome: 'exited', escalated: false, signal: null, code: 0 });
    expect(hookSignal?.aborted).toBe(true);
    expect(ctx.events.some((e) => e.type === 'warning' && /graceful stop/.test(String(e.message)))).toBe(true);
  });

  it('uses a graceful hook that works (powerdown over the control socket)', async () => {
    ctx = await openSupervisor();
    const socket = join(ctx.root, 'pd.sock');
    await ctx.supervisor.launch({ id: 'pd', command: PYTHON, args: (t) => vmArgs(socket, t), ready: { socket } });
    const { connect } = await import('node:net');
    const r = await ctx.supervisor.stop('pd', {
      graceMs: 5000,
      graceful: () =>
        new Promise<void>((resolve, reject) => {
          const s = connect({ path: socket }, () => s.write('powerdown\n'));
          s.on('data', () => resolve());
          s.on('error', reject);
        }),
    });
    // The hook only asks; custody waits for the exit it asked for instead of
    // sending SIGTERM mid-shutdown.
    expect(r).toEqual({ outcome: 'exited', escalated: false, code: 0, signal: null, result: 'stopped' });
  });

  it('reports a nonexistent executable clearly and leaves no state and no process', async () => {
    ctx = await openSupervisor();
    await expect(
      ctx.supervisor.launch({ id: 'ghost', command: '/nonexistent/qemu', args: (t) => [t] }),
    ).rejects.toMatchObject({ code: 'ENOENT' });
    expect(readdirSync(ctx.stateDir).filter((n) => !n.startsWith('.'))).toEqual([]);
    expect(ctx.supervisor.list()).toEqual([]);
  });

  it.each(['../x', '', 'a/b', '.', '..', 'a\0b', 'x'.repeat(200), 5])(
    'refuses the id %j and creates nothing',
    async (id) => {
      ctx = await openSupervisor();
      await expect(
        ctx.supervisor.launch({ id: id as string, command: 'true', args: (t) => [t] }),
      ).rejects.toMatchObject({ code: 'ERR_CUSTODY_INVALID_ARG' });
      expect(readdirSync(ctx.stateDir).filter((n) => !n.startsWith('.'))).toEqual([]);
      expect(existsSync(join(ctx.root, 'x'))).toBe(false);
    },
  );

  it('refuses args that do not carry the token, and other bad specs', async () => {
    ctx = await openSupervisor();
    const bad = (spec: object) =>
      expect(ctx.supervisor.launch({ id: 'b', command: 'sleep', args: ['1'], ...spec } as never)).rejects.toMatchObject(
        { code: 'ERR_CUSTODY_INVALID_ARG' },
      );
    await bad({});
    await bad({ args: (t: string) => [t], attempts: 0 });
    await bad({ args: (t: string) => [t], paths: ['relative'] });
    await bad({ args: (t: string) => [t], ready: { socket: 'rel.sock' } });
    await bad({ args: (t: string) => [t], confirmTimeoutMs: -5 });
    await bad({ args: (t: string) => [t], env: { A: Symbol('x') } });
    await bad({ args: (t: string) => [t], env: null });
    await bad({ args: (t: string) => [t], cwd: '' });
    await bad({ args: (t: string) => [t], uid: 'x' });
    await bad({ args: (t: string) => [t], detached: 'no' });
    await bad({ args: (t: string) => [t], executable: 5 });
    await bad({ args: (t: string) => [t], stdout: 'pipe' });
    expect(readdirSync(ctx.stateDir).filter((n) => !n.startsWith('.'))).toEqual([]);
  });

  it('refuses the same id twice at once, and runs different ids concurrently', async () => {
    ctx = await openSupervisor();
    const s1 = join(ctx.root, 'a.sock');
    const first = ctx.supervisor.launch({
      id: 'same',
      command: PYTHON,
      args: (t) => vmArgs(s1, t, ['--socket-delay', '0.2']),
      ready: { socket: s1 },
    });
    await expect(
      ctx.supervisor.launch({ id: 'same', command: PYTHON, args: (t) => vmArgs(s1, t) }),
    ).rejects.toMatchObject({ code: 'ERR_CUSTODY_BUSY' });
    await first;
    await expect(
      ctx.supervisor.launch({ id: 'same', command: PYTHON, args: (t) => vmArgs(s1, t) }),
    ).rejects.toMatchObject({ code: 'ERR_CUSTODY_BUSY' });
  });

  it('notices an instance that exits on its own, cleans its state and socket, and lists it as exited', async () => {
    ctx = await openSupervisor();
    const socket = join(ctx.root, 'self.sock');
    const inst = await ctx.supervisor.launch({
      id: 'self',
      command: PYTHON,
      args: (t) => vmArgs(socket, t),
      ready: { socket },
    });
    process.kill(inst.pid, 'SIGKILL');
    const st = await inst.exited;
    if (backend.name === 'native') expect(st).toEqual({ code: null, signal: 'SIGKILL' });
    const stateOf = join(ctx.stateDir, 'self');
    await waitFor(() => !existsSync(stateOf), 5000, "the exited instance's state to go");
    expect(ctx.supervisor.list()).toMatchObject([{ id: 'self', status: 'exited' }]);
    expect(existsSync(socket)).toBe(false);
    expect(await ctx.supervisor.stop('self')).toMatchObject({ outcome: 'already-gone' });
  });

  it.skipIf(backend.name !== 'native')(
    'a main process that exits on its own takes what it left in its session with it; a stranger is untouched',
    async () => {
      ctx = await openSupervisor();
      // A stranger of ours in a session of its own, and the instance's child left behind in the instance's.
      const stranger = cpSpawn(PERL, ['-e', 'sleep 30', '--', MARKER], { stdio: 'ignore', detached: true });
      try {
        const prog = `if (!fork) { exec($^X, '-e', 'sleep 60', '--', 'left', $ARGV[1]) } select(undef, undef, undef, 0.3)`;
        const inst = await ctx.supervisor.launch({ id: 'gone', command: PERL, args: (t) => ['-e', prog, t, MARKER] });
        const left = await waitFor(
          () => processesWithMarker(MARKER).find((p) => p.cmd.includes(' left ')),
          5000,
          'the leftover',
        );
        await inst.exited;
        await waitFor(() => !existsSync(join(ctx!.stateDir, 'gone')), 5000, 'the state to go');
        expect(isGone(left.pid)).toBe(true);
        expect(ctx.events.find((e) => e.type === 'warning' && Array.isArray(e.pids))).toMatchObject({
          pids: [left.pid],
        });
        expect(isGone(stranger.pid!)).toBe(false);
      } finally {
        await killAndWait(stranger);
      }
    },
  );

  it.skipIf(backend.name !== 'native')(
    'the same with every threadpool thread busy: the session is read on the main thread, the leftover still ended',
    async () => {
      ctx = await openSupervisor();
      const gate = join(ctx.root, 'go');
      // The main forks its leftover, then exits once the gate opens (at most 20 s), while the pool is held.
      const prog = `if (!fork) { exec($^X, '-e', 'sleep 60', '--', 'left', $ARGV[1]) } for (1..1000) { last if -e $ARGV[2]; select(undef, undef, undef, 0.02) }`;
      const inst = await ctx.supervisor.launch({
        id: 'busy',
        command: PERL,
        args: (t) => ['-e', prog, t, MARKER, gate],
      });
      const left = await waitFor(
        () => processesWithMarker(MARKER).find((p) => p.cmd.includes(' left ')),
        5000,
        'the leftover',
      );
      const pool = holdThreadpool(ctx.root);
      try {
        writeFileSync(gate, '');
        // Ended while the pool is still held: nothing on the way to it waited for the pool.
        await waitFor(() => isGone(left.pid), 10_000, 'the leftover to be ended');
      } finally {
        pool.release();
        await pool.drained;
      }
      // The warning comes once the end is complete: its last pass over the session may wait for the pool.
      const warned = await waitFor(
        () => ctx!.events.find((e) => e.type === 'warning' && Array.isArray(e.pids)),
        10_000,
        'the warning',
      );
      expect(warned).toMatchObject({ id: 'busy', pids: [left.pid] });
      await inst.exited;
      await waitFor(() => !existsSync(join(ctx!.stateDir, 'busy')), 5000, 'the state to go');
    },
  );

  it('takes the pid from a function and readiness from a check; lists the launch as starting meanwhile', async () => {
    ctx = await openSupervisor();
    const socket = join(ctx.root, 'fn.sock');
    const pidfile = join(ctx.root, 'fn.pid');
    let release!: () => void;
    const readyGate = new Promise<void>((r) => (release = r));
    const seen: string[] = [];
    const launching = ctx.supervisor.launch({
      id: 'fn',
      command: LAUNCHER,
      args: (t) => [pidfile, '0', PYTHON, ...vmArgs(socket, t)],
      // A transient unit's MainPID, in miniature: ask something else for the pid.
      pid: async () => {
        await waitFor(() => existsSync(pidfile) && readFileSync(pidfile, 'utf8').trim(), 5000, 'pidfile');
        return Number(readFileSync(pidfile, 'utf8'));
      },
      executable: PYTHON,
      ready: async (inst) => {
        seen.push(`ready check for pid ${inst.pid}`);
        await readyGate;
      },
    });
    await waitFor(() => seen.length > 0, 5000, 'ready check');
    expect(ctx.supervisor.list()).toEqual([{ id: 'fn', status: 'starting', pid: null, ppid: null }]);
    release();
    const inst = await launching;
    expect(seen).toEqual([`ready check for pid ${inst.pid}`]);
    expect(inst.identity.argv[0]).toBe(PYTHON);
    expect(ctx.supervisor.list()).toEqual([{ id: 'fn', status: 'running', pid: inst.pid, ppid: expect.any(Number) }]);
    // The manifest is private: dir 0700, file 0600.
    const { statSync } = await import('node:fs');
    expect(statSync(ctx.stateDir).mode & 0o777).toBe(0o700);
    expect(statSync(join(ctx.stateDir, 'fn')).mode & 0o777).toBe(0o700);
    expect(statSync(join(ctx.stateDir, 'fn', 'manifest.json')).mode & 0o777).toBe(0o600);
    await ctx.supervisor.stop('fn', { graceMs: 5000 });
  });

  it('without an event sink, an escalation still reaches the process as a warning', async () => {
    const dir = tmpDir('custody-nosink-');
    const warnings: Error[] = [];
    const onWarning = (w: Error) => warnings.push(w);
    process.on('warning', onWarning);
    const { supervisor } = await Supervisor.open({ stateDir: join(dir.path, 'state') });
    try {
      const socket = join(dir.path, 'w.sock');
      await supervisor.launch({
        id: 'w',
        command: PYTHON,
        args: (t) => vmArgs(socket, t, ['--ignore-term']),
        ready: { socket },
      });
      expect(await supervisor.stop('w', { graceMs: 100 })).toMatchObject({ escalated: true });
      await new Promise((r) => setImmediate(r));
      expect(warnings.map((w) => (w as Error & { code?: string }).code)).toContain('CUSTODY_ESCALATE');
    } finally {
      process.off('warning', onWarning);
      await supervisor.close();
      dir.cleanup();
    }
  });

  it('holds the state dir: a second supervisor gets ERR_CUSTODY_STATE_LOCKED naming the holder', async () => {
    ctx = await openSupervisor();
    await expect(Supervisor.open({ stateDir: ctx.stateDir })).rejects.toMatchObject({
      code: 'ERR_CUSTODY_STATE_LOCKED',
      holderPid: process.pid,
    });
  });

  it('publishes events on diagnostics_channel', async () => {
    const seen: string[] = [];
    const onEvent = (m: unknown) => seen.push((m as CustodyEvent).type);
    subscribe('custody:launch', onEvent);
    subscribe('custody:running', onEvent);
    try {
      ctx = await openSupervisor();
      await ctx.supervisor.launch({ id: 'dc', command: 'perl', args: (t) => ['-e', 'sleep 300', t, MARKER] });
    } finally {
      unsubscribe('custody:launch', onEvent);
      unsubscribe('custody:running', onEvent);
    }
    expect(seen).toEqual(['launch', 'running']);
  });

  it('launches and stops 200 instances concurrently with no zombie and fds back where they were', async () => {
    ctx = await openSupervisor();
    const fds = () => readdirSync('/proc/self/fd').length;
    const before = fds();
    const ids = Array.from({ length: 200 }, (_, i) => `bulk-${i}`);
    const insts = await Promise.all(
      ids.map((id) => ctx.supervisor.launch({ id, command: 'perl', args: (t) => ['-e', 'sleep 300', t, MARKER] })),
    );
    expect(new Set(insts.map((i) => i.pid)).size).toBe(200);
    expect(ctx.supervisor.list().filter((i) => i.status === 'running')).toHaveLength(200);
    const results = await Promise.all(ids.map((id) => ctx.supervisor.stop(id, { graceMs: 5000 })));
    expect(results.every((r) => r.outcome === 'exited')).toBe(true);
    expect(ctx.supervisor.list()).toEqual([]);
    expect(processesWithMarker(MARKER)).toEqual([]);
    for (const i of insts) expect(goneSince(i.pid, i.identity.startTicks)).toBe(true);
    expect(fds()).toBe(before);
    // Each launch writes its manifest three times, and each stop fsyncs its stopping manifest on this thread
    // before its first signal (so that a busy threadpool never holds a signal up): ~26 s on js, loaded.
  }, 60_000);

  it('abandons a launch still in flight when the supervisor closes, leaving nothing', async () => {
    ctx = await openSupervisor();
    const socket = join(ctx.root, 'late.sock');
    const launching = ctx.supervisor.launch({
      id: 'late',
      command: PYTHON,
      args: (t) => vmArgs(socket, t, ['--socket-delay', '0.3']),
      ready: { socket },
    });
    // In flight: its process runs (the marker is in its argv) and its socket is not there yet.
    await waitFor(() => processesWithMarker(MARKER).length > 0, 5000, 'the launch to spawn');
    await ctx.supervisor.close();
    await expect(launching).rejects.toMatchObject({ code: 'ERR_CUSTODY_CLOSED' });
    expect(processesWithMarker(MARKER)).toEqual([]);
    expect(existsSync(join(ctx.stateDir, 'late'))).toBe(false);
  });

  it('honours an AbortSignal on stop', async () => {
    ctx = await openSupervisor();
    const socket = join(ctx.root, 'ab.sock');
    await ctx.supervisor.launch({
      id: 'ab',
      command: PYTHON,
      args: (t) => vmArgs(socket, t, ['--ignore-term']),
      ready: { socket },
    });
    const ac = new AbortController();
    setTimeout(() => ac.abort(), 100);
    const inst = ctx.supervisor.get('ab')!;
    await expect(ctx.supervisor.stop('ab', { graceMs: 10_000, signal: ac.signal })).rejects.toMatchObject({
      name: 'AbortError',
    });
    // Abort means "force it now": killed, proven gone, state removed (test/lifecycle/stop.test.ts has more).
    expect(isGone(inst.pid)).toBe(true);
    expect(ctx.supervisor.list()).toEqual([]);
  });
});
