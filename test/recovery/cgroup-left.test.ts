/**
 * Recovery with instance cgroups whose members rearranged them while no
 * supervisor ran: a main process in a nested cgroup of its own instance's
 * is adopted (inside the subtree is inside); an instance whose main died
 * with a member in a nested cgroup is cleaned, the member ended and the
 * whole subtree removed (the open does not fail); a main process that moved
 * itself out of its cgroup is adopted where its pidfs id proves it is the
 * recorded process (a warning says it left; its stop kills it through its
 * pin), and quarantined, nothing signalled, where there is no pidfs id.
 */
import { spawn as cpSpawn, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { capabilities, type CustodyEvent, Supervisor } from '../../src/index.js';
import {
  CGROUP_ROOT,
  CGROUP_SKIP,
  cgroupsBelow,
  expectNoCgroupsLeft,
  LEAVER,
  launchNester,
  outsideCgroup,
  procsOf,
} from '../helpers/cgroup.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { isGone, loggedSignals, MARKER, signalLoggerArgs, tmpDir, untilReady, waitFor } from '../helpers/procs.js';
import { PERL, PYTHON } from '../helpers/supervisor.js';

// Registered before the cleanups, so it runs after them: each test's undo removes what it made.
afterEach(() => {
  expect(cgroupsBelow(CGROUP_ROOT)).toEqual([]);
});
const cleanups = cleanupAfterEach({ marker: MARKER });
expectNoCgroupsLeft();

const strangers: ChildProcess[] = [];

/** A state dir, and supervisors opened on it with this worker's cgroup root (each closed after the test). */
function stateDir() {
  const dir = tmpDir('custody-cgleft-');
  cleanups.push(dir.cleanup);
  const state = join(dir.path, 'state');
  return {
    root: dir.path,
    state,
    async open() {
      const events: CustodyEvent[] = [];
      const r = await Supervisor.open({
        stateDir: state,
        cgroup: { root: CGROUP_ROOT },
        onEvent: (e) => events.push(e),
      });
      cleanups.push(async () => {
        for (const i of r.supervisor.list())
          if (i.status === 'running') await r.supervisor.stop(i.id, { graceMs: 200 }).catch(() => {});
        await r.supervisor.close();
      });
      return { ...r, events };
    },
  };
}

/**
 * A supervisor launches LEAVER and closes once its main has moved itself into a cgroup of the test's outside
 * the root, beside a signal-logging bystander the test started there.
 */
async function leftThenClosed() {
  const s = stateDir();
  const out = outsideCgroup(cleanups, strangers);
  const bystanderLog = join(s.root, 'bystander.log');
  const bystander = cpSpawn(PYTHON, signalLoggerArgs(bystanderLog, false), { stdio: ['ignore', 'pipe', 'ignore'] });
  strangers.push(bystander);
  await untilReady(bystander.stdout!);
  writeFileSync(join(out, 'cgroup.procs'), String(bystander.pid));
  const first = await s.open();
  const gate = join(s.root, 'go');
  const inst = await first.supervisor.launch({
    id: 'leaver',
    command: PERL,
    args: (tok) => ['-e', LEAVER, '--', out, gate, tok, MARKER],
  });
  writeFileSync(gate, '');
  await waitFor(() => procsOf(out).includes(inst.pid), 10_000, 'the main to leave its cgroup');
  await first.supervisor.close();
  // Which rule applies is the backend's to say: the native one on Linux >= 6.9 records pidfs ids.
  expect(!!inst.identity.pidfsId).toBe(capabilities().pidfsId);
  return { s, inst, bystanderLog, bystander };
}

describe(`recovery of instance cgroups their members rearranged (${backend.name})`, () => {
  it('a main process in a nested cgroup of its own instance cgroup is adopted, and its stop removes the subtree', async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const s = stateDir();
    const first = await s.open();
    const { inst, mover } = await launchNester(first.supervisor, 'nested', 1, 'main');
    expect(mover).toBe(inst.pid);
    await first.supervisor.close();
    const { supervisor, report } = await s.open();
    expect(report.quarantined).toEqual([]);
    expect(report.adopted).toEqual([{ id: 'nested', pid: inst.pid }]);
    expect(supervisor.get('nested')!.cgroup).toBe(inst.cgroup);
    await supervisor.stop('nested', { graceMs: 2000 });
    expect(isGone(inst.pid)).toBe(true);
    expect(existsSync(inst.cgroup!)).toBe(false);
  });

  it('an instance whose main died, a member left in a nested cgroup: cleaned, the member ended, the subtree removed', async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const s = stateDir();
    const first = await s.open();
    const { inst, mover: member } = await launchNester(first.supervisor, 'orphaned', 2, 'child');
    await first.supervisor.close();
    process.kill(inst.pid, 'SIGKILL');
    await waitFor(() => isGone(inst.pid), 5000, 'the main process to die');
    const { report } = await s.open();
    expect(report.cleaned).toEqual([{ id: 'orphaned', pid: inst.pid, reason: 'gone' }]);
    expect(isGone(member)).toBe(true);
    expect(existsSync(inst.cgroup!)).toBe(false);
  });

  it('a main process that left its cgroup: adopted by its pidfs id and killed through its pin by stop, else quarantined untouched', async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const { s, inst, bystanderLog: log, bystander: b } = await leftThenClosed();
    const { supervisor, report, events } = await s.open();
    if (capabilities().pidfsId) {
      expect(report.adopted).toEqual([{ id: 'leaver', pid: inst.pid, reason: 'left-cgroup' }]);
      expect(events).toContainEqual(
        expect.objectContaining({
          type: 'warning',
          id: 'leaver',
          cgroup: inst.cgroup,
          message: expect.stringMatching(/left its cgroup/),
        }),
      );
      const r = await supervisor.stop('leaver', { graceMs: 300 });
      expect(r).toMatchObject({ outcome: 'exited', escalated: true, signal: 'SIGKILL' });
      expect(isGone(inst.pid)).toBe(true);
      expect(existsSync(inst.cgroup!)).toBe(false);
    } else {
      expect(report.quarantined).toEqual([
        expect.objectContaining({ id: 'leaver', pid: inst.pid, reason: 'mismatch', field: 'cgroup' }),
      ]);
      expect(isGone(inst.pid)).toBe(false);
      process.kill(inst.pid, 'SIGKILL');
      await waitFor(() => isGone(inst.pid), 5000, 'the quarantined main to die');
      await supervisor.release('leaver');
      expect(existsSync(inst.cgroup!)).toBe(false);
    }
    expect(isGone(b.pid!)).toBe(false);
    expect(loggedSignals(log)).toEqual([]);
  });

  it('a stop cut off while its main was outside its cgroup: the main, proven by its pidfs id, is ended through its pin', async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const { s, inst, bystanderLog: log, bystander: b } = await leftThenClosed();
    // As a crashed stop leaves it: stopping written, the main still running (it ignores SIGTERM).
    const manifest = join(s.state, 'leaver', 'manifest.json');
    const m = JSON.parse(readFileSync(manifest, 'utf8'));
    writeFileSync(manifest, JSON.stringify({ ...m, state: 'stopping', stoppingSince: new Date().toISOString() }));
    const { report, events } = await s.open();
    expect(report.cleaned).toEqual([{ id: 'leaver', pid: inst.pid, reason: 'stopped' }]);
    expect(existsSync(inst.cgroup!)).toBe(false);
    if (capabilities().pidfsId) {
      expect(isGone(inst.pid)).toBe(true);
      expect(events).toContainEqual(expect.objectContaining({ type: 'escalate', id: 'leaver', pid: inst.pid }));
    } else {
      // No proof it is the recorded process: outside the cgroup it is not signalled. The test ends it.
      expect(isGone(inst.pid)).toBe(false);
      process.kill(inst.pid, 'SIGKILL');
      await waitFor(() => isGone(inst.pid), 5000, 'the unproven main to die');
    }
    expect(isGone(b.pid!)).toBe(false);
    expect(loggedSignals(log)).toEqual([]);
  });
});
