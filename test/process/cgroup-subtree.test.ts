/**
 * An instance cgroup is a tree, and holds against its own members: a member
 * that makes a cgroup inside the instance's and moves there is still the
 * instance's (listed, killed, its cgroup removed children first, so stop,
 * relaunch and the next open all work); a cgroup chain past the removal's
 * bound is a warning naming it, never a failed stop or open; and a main
 * process that moved itself out of its cgroup and ignores SIGTERM is killed
 * through its pin, while a bystander in the cgroup it moved to is never
 * signalled.
 */
import { spawn as cpSpawn, type ChildProcess } from 'node:child_process';
import { existsSync, rmdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { inSubtree } from '../../src/process/cgroup-tree.js';
import { terminateCgroup } from '../../src/process/tree.js';
import { type CustodyEvent, spawn, Supervisor } from '../../src/index.js';
import {
  CGROUP_MOUNT,
  CGROUP_ROOT,
  CGROUP_SKIP,
  cgroupsBelow,
  expectNoCgroupsLeft,
  launchNester,
  LEAVER,
  NESTER,
  openCgroupRoot,
  outsideCgroup,
  procsOf,
} from '../helpers/cgroup.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { processesWithMarker } from '../helpers/leaks.js';
import {
  isGone,
  killAndWait,
  loggedSignals,
  MARKER,
  signalLoggerArgs,
  tmpDir,
  untilReady,
  waitFor,
} from '../helpers/procs.js';
import { PERL, PYTHON } from '../helpers/supervisor.js';

const cleanups = cleanupAfterEach({ marker: MARKER });
expectNoCgroupsLeft();

const strangers: ChildProcess[] = [];

/** A supervisor with this worker's cgroup root on a state dir of its own; closed, and the dir removed, after the test. */
async function openOn(stateDir: string) {
  const events: CustodyEvent[] = [];
  const { supervisor, report } = await Supervisor.open({
    stateDir,
    cgroup: { root: CGROUP_ROOT },
    onEvent: (e) => events.push(e),
  });
  cleanups.push(async () => {
    for (const i of supervisor.list())
      if (i.status === 'running') await supervisor.stop(i.id, { graceMs: 200 }).catch(() => {});
    await supervisor.close();
  });
  return { supervisor, report, events };
}

function stateDir(): string {
  const dir = tmpDir('custody-cgtree-');
  cleanups.push(dir.cleanup);
  cleanups.push(async () => {
    await Promise.all(strangers.splice(0).map(killAndWait));
  });
  return join(dir.path, 'state');
}

const warnings = (events: CustodyEvent[]) => events.filter((e) => e.type === 'warning');

describe('cgroup subtree membership (pure)', () => {
  it('inside is the cgroup itself or a cgroup below it; a sibling whose name starts the same is outside', () => {
    expect(inSubtree('/a/vm.0123', '/a/vm.0123')).toBe(true);
    expect(inSubtree('/a/vm.0123/sub/sub', '/a/vm.0123')).toBe(true);
    expect(inSubtree('/a/vm.01234', '/a/vm.0123')).toBe(false);
    expect(inSubtree('/a', '/a/vm.0123')).toBe(false);
    expect(inSubtree(null, '/a/vm.0123')).toBe(false);
  });
});

describe(`instance cgroups hold against their members (${backend.name})`, () => {
  it('a member in a nested cgroup is listed, killed member by member, and the subtree removed children first', async (ctx) => {
    ctx.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const { root } = openCgroupRoot(cleanups);
    const cg = root.create('nest', 'e'.repeat(32));
    const h = spawn(PERL, ['-e', NESTER, '--', CGROUP_MOUNT!, '2', 'child', MARKER], { cgroup: cg.path });
    const deepest = join(cg.path, 'sub', 'sub');
    const member = await waitFor(
      () => existsSync(deepest) && procsOf(deepest)[0],
      10_000,
      'the member in its nested cgroup',
    );
    expect(cg.procs().sort()).toEqual([h.pid, member].sort());
    // As on a kernel without cgroup.kill: each member pinned, proven inside the subtree, killed.
    const r = await terminateCgroup(cg, [h], { graceMs: 200, killEach: true });
    expect(r.leftovers).toEqual([member]);
    expect(isGone(member)).toBe(true);
    expect(await cg.remove()).toEqual([]);
    expect(existsSync(cg.path)).toBe(false);
    await h.exited;
  });

  it('stop() ends a member that moved into a nested cgroup, removes the subtree; the id relaunches', async (ctx) => {
    ctx.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const { supervisor, events } = await openOn(stateDir());
    for (const round of [1, 2]) {
      const { inst, mover: member } = await launchNester(supervisor, 'nest', 1, 'child');
      expect(supervisor.usage('nest').pids).toBe(2);
      const r = await supervisor.stop('nest', { graceMs: 300 });
      expect(r).toMatchObject({ outcome: 'exited', escalated: false });
      expect(isGone(member)).toBe(true);
      expect(existsSync(inst.cgroup!), `round ${round}`).toBe(false);
      expect(supervisor.list()).toEqual([]);
    }
    expect(warnings(events)).toEqual([]);
  });

  it('an abandoned launch whose member moved into a nested cgroup: the member ended, the subtree removed, the id free', async (ctx) => {
    ctx.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const { supervisor, events } = await openOn(stateDir());
    let member = 0;
    let cgroup = '';
    const err = await supervisor
      .launch({
        id: 'abandoned',
        command: PERL,
        args: (tok) => ['-e', NESTER, '--', CGROUP_MOUNT!, '2', 'child', tok, MARKER],
        // Fails once the member is in sub/sub: the launch is abandoned with it there.
        ready: async (inst) => {
          cgroup = inst.cgroup!;
          const deepest = join(cgroup, 'sub', 'sub');
          member = await waitFor(() => existsSync(deepest) && procsOf(deepest)[0], 10_000, 'the member in sub/sub');
          throw new Error('not ready: a test says so');
        },
      })
      .catch((e: unknown) => e);
    expect(err).toMatchObject({ message: expect.stringContaining('not ready: a test says so') });
    expect(isGone(member)).toBe(true);
    expect(existsSync(cgroup)).toBe(false);
    expect(supervisor.list()).toEqual([]);
    expect(warnings(events)).toEqual([]);
  });

  it('a main process in a nested cgroup of its own is confirmed, counted and stopped as the instance', async (ctx) => {
    ctx.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const { supervisor } = await openOn(stateDir());
    const { inst, mover } = await launchNester(supervisor, 'deep', 3, 'main');
    expect(mover).toBe(inst.pid);
    expect(supervisor.usage('deep').pids).toBe(1);
    await supervisor.stop('deep', { graceMs: 2000 });
    expect(isGone(inst.pid)).toBe(true);
    expect(existsSync(inst.cgroup!)).toBe(false);
  });

  it('a cgroup chain deeper than the removal walks is a warning naming it, never a failed stop or open', async (ctx) => {
    ctx.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const state = stateDir();
    const first = await openOn(state);
    const { inst } = await launchNester(first.supervisor, 'chain', 40, 'child');
    await first.supervisor.stop('chain', { graceMs: 300 });
    expect(first.supervisor.list()).toEqual([]);
    const left = warnings(first.events).find((e) => e.type === 'warning' && e.cgroup === inst.cgroup);
    expect(left?.message).toMatch(/not removed: .*more than 1024 cgroups or 32 levels/);
    await first.supervisor.close();
    // The next open: recovery meets the chain as a cgroup no manifest names, and says so.
    const second = await openOn(state);
    expect(second.report.quarantined).toEqual([]);
    expect(warnings(second.events).some((e) => e.type === 'warning' && e.cgroup === inst.cgroup)).toBe(true);
    for (const d of cgroupsBelow(inst.cgroup!)) rmdirSync(d);
    rmdirSync(inst.cgroup!);
  });

  it('a main process that moved out of its cgroup and ignores SIGTERM is killed through its pin; a bystander there is not signalled', async (ctx) => {
    ctx.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const state = stateDir();
    const out = outsideCgroup(cleanups, strangers);
    const { supervisor, events } = await openOn(state);
    const log = join(state, '..', 'bystander.log');
    const b = cpSpawn(PYTHON, signalLoggerArgs(log, false), { stdio: ['ignore', 'pipe', 'ignore'] });
    strangers.push(b);
    await untilReady(b.stdout!);
    writeFileSync(join(out, 'cgroup.procs'), String(b.pid));
    const gate = join(state, '..', 'go');
    const inst = await supervisor.launch({
      id: 'leaver',
      command: PERL,
      args: (tok) => ['-e', LEAVER, '--', out, gate, tok, MARKER],
    });
    writeFileSync(gate, '');
    await waitFor(() => procsOf(out).includes(inst.pid), 10_000, 'the main to leave its cgroup');
    expect(procsOf(inst.cgroup!)).toEqual([]);
    const started = performance.now();
    const r = await supervisor.stop('leaver', { graceMs: 500 });
    const took = performance.now() - started;
    expect(r).toMatchObject({ outcome: 'exited', escalated: true, signal: 'SIGKILL' });
    expect(isGone(inst.pid)).toBe(true);
    expect(took).toBeLessThan(3000);
    expect(events.some((e) => e.type === 'escalate' && e.pid === inst.pid)).toBe(true);
    expect(existsSync(inst.cgroup!)).toBe(false);
    expect(isGone(b.pid!)).toBe(false);
    expect(loggedSignals(log)).toEqual([]);
    if (process.env.CUSTODY_MEASURE) console.log(`stop of a main outside its cgroup: ${took.toFixed(0)} ms`);
    await killAndWait(b);
    expect(processesWithMarker(MARKER).filter((p) => p.state !== 'Z' && p.pid !== b.pid)).toEqual([]);
  });
});
