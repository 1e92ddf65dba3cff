// Recovery of what manifest version 3 can record mid-lifecycle, each taken
// from a real launch and rewritten as the crash would have left it: a
// `starting` manifest that carries the confirmed identity (the agent died
// while readiness was pending), judged exactly as a running one; and a
// `stopping` manifest (a stop cut off after its first signal), finished.
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { type CustodyEvent, type Instance, inspect, Supervisor, type SupervisorOptions } from '../../src/index.js';
import { CGROUP_ROOT, CGROUP_SKIP, expectNoCgroupsLeft } from '../helpers/cgroup.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { endOwn, isGone, loggedSignals, MARKER, tmpDir, waitFor } from '../helpers/procs.js';
import { PERL, PYTHON, vmArgs } from '../helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });
expectNoCgroupsLeft();

const cleanups: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  while (cleanups.length) await cleanups.pop()!();
});

/** One instance launched by a supervisor that then closed (an agent that restarts), its manifest at hand. */
async function launchedThenClosed(
  launch: (root: string) => Parameters<Supervisor['launch']>[0],
  options: Partial<SupervisorOptions> = {},
) {
  const dir = tmpDir('custody-recover-v3-');
  const stateDir = join(dir.path, 'state');
  const { supervisor } = await Supervisor.open({ stateDir, onEvent: () => {}, ...options });
  const spec = launch(dir.path);
  const inst: Instance = await supervisor.launch(spec);
  await supervisor.close();
  cleanups.push(async () => {
    await endOwn([inst.pid]);
    dir.cleanup();
  });
  const manifestPath = join(stateDir, spec.id, 'manifest.json');
  return {
    inst,
    root: dir.path,
    stateDir,
    read: () => JSON.parse(readFileSync(manifestPath, 'utf8')),
    write: (m: unknown) => writeFileSync(manifestPath, JSON.stringify(m)),
    async reopen() {
      const events: CustodyEvent[] = [];
      const r = await Supervisor.open({ stateDir, onEvent: (e) => events.push(e), ...options });
      cleanups.push(() => r.supervisor.close());
      return { ...r, events };
    },
  };
}

/** The fake VM, logging every signal it gets: "untouched" is an empty log. */
const fakeVm = (root: string) => {
  const socket = join(root, 'vm.sock');
  return {
    id: 'vm',
    command: PYTHON,
    args: (t: string) => vmArgs(socket, t, ['--signal-log', join(root, 'signals.log')]),
    ready: { socket },
    paths: [socket],
  };
};

/** The pid of the SIGTERM-ignoring child the forking instance wrote under root, ended by pid after the test. */
async function forkedChild(root: string): Promise<number> {
  const childPidFile = join(root, 'child.pid');
  const child = await waitFor(
    () => (existsSync(childPidFile) ? Number(readFileSync(childPidFile, 'utf8')) || null : null),
    5000,
    'the child',
  );
  cleanups.push(() => endOwn([child]));
  return child;
}

describe(`a starting manifest with the confirmed identity (${backend.name})`, () => {
  it('is adopted as a running one is, rewritten as running (version 3), its process alive and untouched', async () => {
    const s = await launchedThenClosed(fakeVm);
    const running = s.read();
    // What launch writes once exec is confirmed and readiness is pending.
    s.write({ ...running, state: 'starting' });
    const { supervisor, report } = await s.reopen();
    expect(report).toEqual({
      adopted: [{ id: 'vm', pid: s.inst.pid, reason: 'starting' }],
      repaired: [],
      cleaned: [],
      quarantined: [],
      deferred: [],
    });
    expect(s.read()).toMatchObject({ version: 3, state: 'running', identity: running.identity });
    expect(isGone(s.inst.pid)).toBe(false);
    expect(inspect(s.inst.pid).startTicks).toBe(running.identity.startTicks);
    expect(loggedSignals(join(s.root, 'signals.log'))).toEqual([]);
    expect(supervisor.list()).toEqual([expect.objectContaining({ id: 'vm', status: 'running', pid: s.inst.pid })]);
    await supervisor.stop('vm', { graceMs: 5000 });
    expect(loggedSignals(join(s.root, 'signals.log'))).toEqual(['SIGTERM']);
  });

  it('whose process is gone is cleaned', async () => {
    const s = await launchedThenClosed(fakeVm);
    s.write({ ...s.read(), state: 'starting' });
    process.kill(s.inst.pid, 'SIGKILL');
    await s.inst.exited;
    const { report } = await s.reopen();
    expect(report.cleaned).toEqual([{ id: 'vm', pid: s.inst.pid, reason: 'gone' }]);
    expect(report.adopted).toEqual([]);
    expect(existsSync(join(s.stateDir, 'vm'))).toBe(false);
  });

  it('whose pid names another process (other start ticks) is quarantined and never signalled', async () => {
    const s = await launchedThenClosed(fakeVm);
    const m = s.read();
    s.write({ ...m, state: 'starting', identity: { ...m.identity, startTicks: m.identity.startTicks + 1 } });
    const { supervisor, report } = await s.reopen();
    expect(report.quarantined).toEqual([{ id: 'vm', pid: s.inst.pid, reason: 'reused', field: 'startTicks' }]);
    expect(report.adopted).toEqual([]);
    expect(s.read()).toMatchObject({ state: 'quarantined', quarantine: { reason: 'reused', field: 'startTicks' } });
    expect(isGone(s.inst.pid)).toBe(false);
    expect(loggedSignals(join(s.root, 'signals.log'))).toEqual([]);
    await supervisor.release('vm');
  });

  it('whose recorded argv differs and cannot be re-proved by its declared paths is quarantined (mismatch), never signalled', async () => {
    const s = await launchedThenClosed(fakeVm);
    const m = s.read();
    // Recorded without a pidfs id (a kernel before 6.9): start ticks alone cannot prove a title it changed.
    const identity = { ...m.identity, argv: [...m.identity.argv, '--another'], pidfsId: null };
    s.write({ ...m, state: 'starting', identity, paths: [...m.paths, join(s.root, 'not-in-argv.sock')] });
    const { supervisor, report } = await s.reopen();
    expect(report.quarantined).toEqual([{ id: 'vm', pid: s.inst.pid, reason: 'mismatch', field: 'argv' }]);
    expect(isGone(s.inst.pid)).toBe(false);
    expect(loggedSignals(join(s.root, 'signals.log'))).toEqual([]);
    await supervisor.release('vm');
  });
});

/**
 * A main process whose fork ignores SIGTERM: the fork keeps the launched argv (token included), and stays in
 * the main's session and cgroup. It prints the fork's pid.
 */
const forking = (root: string) => ({
  id: 'vm',
  command: PERL,
  args: (t: string) => [
    '-e',
    'my $k = fork; if (!$k) { $SIG{TERM} = "IGNORE"; sleep 300; exit } open(my $f, ">", $ARGV[0]); print $f $k; close $f; sleep 300',
    join(root, 'child.pid'),
    t,
    MARKER,
  ],
});

describe(`a stopping manifest: the stop a crash cut off is finished (${backend.name})`, () => {
  for (const withCgroup of [false, true]) {
    it(`${withCgroup ? 'with' : 'without'} an instance cgroup: the SIGTERM-ignoring child is ended, reported cleaned (stopped), nothing left`, async (t) => {
      t.skip(withCgroup && !!CGROUP_SKIP, CGROUP_SKIP ?? '');
      const s = await launchedThenClosed(forking, withCgroup ? { cgroup: { root: CGROUP_ROOT } } : {});
      const child = await forkedChild(s.root);
      const m = s.read();
      // As a crashed stop leaves it: stopping written, then the main SIGKILLed, then the crash.
      s.write({ ...m, state: 'stopping', stoppingSince: new Date().toISOString() });
      process.kill(s.inst.pid, 'SIGKILL');
      await s.inst.exited;
      expect(isGone(child)).toBe(false);
      const { supervisor, report, events } = await s.reopen();
      expect(report).toEqual({
        adopted: [],
        repaired: [],
        cleaned: [{ id: 'vm', pid: s.inst.pid, reason: 'stopped' }],
        quarantined: [],
        deferred: [],
      });
      await waitFor(() => isGone(child), 5000, 'the child to be ended');
      expect(existsSync(join(s.stateDir, 'vm'))).toBe(false);
      if (withCgroup) expect(existsSync(m.cgroup.path)).toBe(false);
      // It ignored SIGTERM: the bound passed and SIGKILL (or cgroup.kill) ended it.
      expect(events.filter((e) => e.type === 'escalate')).toHaveLength(1);
      expect(supervisor.list()).toEqual([]);
    });
  }

  it('whose main process is alive and proven: it is ended with its child', async () => {
    const s = await launchedThenClosed(forking);
    const child = await forkedChild(s.root);
    s.write({ ...s.read(), state: 'stopping', stoppingSince: new Date().toISOString() });
    const { report } = await s.reopen();
    expect(report.cleaned).toEqual([{ id: 'vm', pid: s.inst.pid, reason: 'stopped' }]);
    await waitFor(() => isGone(child) && isGone(s.inst.pid), 5000, 'both to be ended');
  });

  it('whose recorded pid names another process is quarantined, and nothing is signalled', async () => {
    const s = await launchedThenClosed(fakeVm);
    const m = s.read();
    s.write({
      ...m,
      state: 'stopping',
      stoppingSince: new Date().toISOString(),
      identity: { ...m.identity, startTicks: m.identity.startTicks + 1 },
    });
    const { supervisor, report } = await s.reopen();
    expect(report.quarantined).toEqual([{ id: 'vm', pid: s.inst.pid, reason: 'reused', field: 'startTicks' }]);
    expect(report.cleaned).toEqual([]);
    expect(isGone(s.inst.pid)).toBe(false);
    expect(loggedSignals(join(s.root, 'signals.log'))).toEqual([]);
    await supervisor.release('vm');
  });
});
