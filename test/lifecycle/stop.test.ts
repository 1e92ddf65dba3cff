// Stop semantics: an abort forces, never half-stops; a non-child's stop
// returns once it is gone, not once its status is known.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { AbortError, spawn, terminate } from '../../src/index.js';
import { expectNoLeaks, processesWithMarker } from '../helpers/leaks.js';
import {
  isGone,
  loggedSignals,
  MARKER,
  procStat,
  signalLoggerArgs,
  tmpDir,
  untilReady,
  waitFor,
} from '../helpers/procs.js';
import { openSupervisor, PERL, PYTHON, vmArgs } from '../helpers/supervisor.js';
import { holdThreadpool } from '../helpers/threadpool.js';

expectNoLeaks({ marker: MARKER });

let ctx: Awaited<ReturnType<typeof openSupervisor>>;
afterEach(async () => {
  await ctx?.dispose();
});

/** A fake VM that ignores SIGTERM and logs every signal it gets, launched and ready. */
async function stubborn(id: string) {
  const socket = join(ctx.root, `${id}.sock`);
  const log = join(ctx.root, `${id}.signals`);
  const inst = await ctx.supervisor.launch({
    id,
    command: PYTHON,
    args: (t) => vmArgs(socket, t, ['--ignore-term', '--signal-log', log]),
    ready: { socket },
  });
  return { inst, socket, log };
}

const abortAfter = (ms: number) => {
  const ac = new AbortController();
  setTimeout(() => ac.abort(new Error('the caller gave up')), ms);
  return ac.signal;
};

/** Aborted once `happened` holds (polled, up to 10 s): a loaded machine may take longer than any fixed delay. */
const abortOnce = (happened: () => boolean) => {
  const ac = new AbortController();
  const give = () => ac.abort(new Error('the caller gave up'));
  void waitFor(happened, 10_000, 'the moment to abort').then(give, give);
  return ac.signal;
};

describe(`a stop on a busy threadpool (${backend.name})`, () => {
  it('signals within its bounds while other work holds every threadpool thread', async () => {
    ctx = await openSupervisor();
    const socket = join(ctx.root, 'vm.sock');
    const log = join(ctx.root, 'vm.signals');
    const inst = await ctx.supervisor.launch({
      id: 'vm',
      command: PYTHON,
      args: (t) => vmArgs(socket, t, ['--signal-log', log]),
      ready: { socket },
    });
    const pool = holdThreadpool(ctx.root);
    try {
      // A grace the VM, which exits on SIGTERM, cannot overrun on a loaded machine: escalated must be false.
      const stopped = ctx.supervisor.stop('vm', { graceMs: 5000 });
      // The tree's session scan waits for the pool; the signals must not.
      await waitFor(() => loggedSignals(log).includes('SIGTERM'), 3000, 'SIGTERM to reach the VM');
      await waitFor(() => isGone(inst.pid), 3000, 'the VM to end');
      pool.release();
      expect(await stopped).toMatchObject({ outcome: 'exited', escalated: false });
    } finally {
      pool.release();
      await pool.drained;
    }
  });
});

describe(`an aborted stop forces the stop (${backend.name})`, () => {
  it('aborted mid-grace: SIGKILL, proven gone, state and socket removed, then AbortError', async () => {
    ctx = await openSupervisor();
    const { inst, socket, log } = await stubborn('ab');
    // Aborted once the VM has logged SIGTERM, so that the log below can show it.
    const signal = abortOnce(() => loggedSignals(log).includes('SIGTERM'));
    const err = await ctx.supervisor.stop('ab', { graceMs: 60_000, signal }).catch((e: unknown) => e);
    expect(err).toBeInstanceOf(AbortError);
    expect((err as Error).cause).toMatchObject({ message: 'the caller gave up' });
    // Gone by the time the rejection arrives, not eventually.
    expect(isGone(inst.pid)).toBe(true);
    expect(loggedSignals(log)).toEqual(['SIGTERM']);
    expect(ctx.supervisor.list()).toEqual([]);
    expect(existsSync(join(ctx.stateDir, 'ab'))).toBe(false);
    expect(existsSync(socket)).toBe(false);
    expect(ctx.events.filter((e) => e.id === 'ab' && e.type === 'stop')).toMatchObject([
      { escalated: true, message: expect.stringMatching(/aborted/) },
    ]);
  });

  it('aborted during a graceful hook that hangs: the hook is told, the process is killed', async () => {
    ctx = await openSupervisor();
    const { inst } = await stubborn('hook');
    let hookSignal: AbortSignal | undefined;
    const stopping = ctx.supervisor.stop('hook', {
      graceMs: 60_000,
      signal: abortAfter(150),
      graceful: (_i, s) => {
        hookSignal = s;
        return new Promise(() => {});
      },
    });
    await expect(stopping).rejects.toBeInstanceOf(AbortError);
    expect(hookSignal?.aborted).toBe(true);
    expect(isGone(inst.pid)).toBe(true);
    expect(ctx.supervisor.list()).toEqual([]);
  });

  it('aborted during a tree stop: every member of the tree is killed', async () => {
    ctx = await openSupervisor();
    // A root and a child, both ignoring SIGTERM; the child prints its pid.
    const script =
      '$SIG{TERM} = "IGNORE"; my $k = fork; if ($k == 0) { sleep 300; exit } print "$k\\n"; $| = 1; sleep 300';
    const out = join(ctx.root, 'tree.out');
    const inst = await ctx.supervisor.launch({
      id: 'tree',
      command: PERL,
      args: (t) => ['-e', script, t, MARKER],
      stdout: { file: out },
    });
    const kid = Number(await waitFor(() => existsSync(out) && readFileSync(out, 'utf8').trim(), 5000, 'the child pid'));
    await expect(
      ctx.supervisor.stop('tree', { tree: true, graceMs: 60_000, signal: abortAfter(150) }),
    ).rejects.toBeInstanceOf(AbortError);
    expect(isGone(inst.pid)).toBe(true);
    await waitFor(() => isGone(kid), 5000, 'the child gone');
    expect(processesWithMarker(MARKER)).toEqual([]);
  });

  it('a signal aborted before stop() is an AbortError with nothing sent; the instance is still stoppable', async () => {
    ctx = await openSupervisor();
    const { inst, log } = await stubborn('pre');
    const ac = new AbortController();
    ac.abort();
    await expect(ctx.supervisor.stop('pre', { signal: ac.signal })).rejects.toBeInstanceOf(AbortError);
    expect(loggedSignals(log)).toEqual([]);
    expect(ctx.supervisor.list()).toEqual([{ id: 'pre', status: 'running', pid: inst.pid, ppid: expect.any(Number) }]);
    expect(await ctx.supervisor.stop('pre', { graceMs: 100 })).toMatchObject({ outcome: 'exited', escalated: true });
  });

  it('terminate() aborted mid-grace kills the process before it rejects', async () => {
    const dir = tmpDir();
    try {
      const h = spawn(PYTHON, signalLoggerArgs(join(dir.path, 'log'), true), { stdio: ['ignore', 'pipe', 'ignore'] });
      await untilReady(h.stdout!);
      await expect(terminate(h, { graceMs: 60_000, signal: abortAfter(100) })).rejects.toBeInstanceOf(AbortError);
      expect(h.hasExited).toBe(true);
      expect(await h.exited).toEqual({ code: null, signal: 'SIGKILL' });
    } finally {
      dir.cleanup();
    }
  });
});

describe(`stopping a process that is not our child (${backend.name})`, () => {
  it('returns once it is gone, with the status null while the kernel has none, instead of waiting for its parent to reap it', async () => {
    ctx = await openSupervisor();
    const pidfile = join(ctx.root, 'orphan.pid');
    // A launcher that stays and never reaps: its target, once dead, stays a
    // zombie, so the kernel has no exit status for it (PIDFD_INFO_EXIT comes
    // with the reaping), as under an init that reaps slowly.
    const launcher = `
import os, signal, sys, time
pid = os.fork()
if pid == 0:
    os.execv(sys.argv[1], [sys.argv[1], '-e', 'sleep 300', sys.argv[2], sys.argv[3]])
open(sys.argv[4], 'w').write(str(pid))
time.sleep(300)
`;
    const inst = await ctx.supervisor.launch({
      id: 'orphan',
      command: PYTHON,
      args: (t) => ['-c', launcher, PERL, t, MARKER, pidfile],
      pid: { file: pidfile },
      launcherExits: false,
      executable: PERL,
    });
    const launcherPid = Number(procStat(inst.pid)![1]);
    let settled = false;
    void inst.exited.then(() => (settled = true));
    try {
      // tree: false: the launcher that stays is a member of the instance, and this is about the target alone.
      const r = await ctx.supervisor.stop('orphan', { graceMs: 5000, tree: false });
      expect(r).toEqual({ outcome: 'exited', escalated: false, code: null, signal: null, result: 'stopped' });
      // Still unreaped: stop did not wait for what only the reaping gives.
      expect(procStat(inst.pid)?.[0]).toBe('Z');
      // On the native backend the exit watcher would wait up to a second for
      // that status; stop returned without it.
      if (backend.name === 'native') expect(settled).toBe(false);
    } finally {
      process.kill(launcherPid, 'SIGKILL');
    }
    await waitFor(() => isGone(launcherPid), 5000, 'the launcher reaped');
  });
});
