// Draining a host: every instance stopped at once. Each stop succeeds, none
// escalates (every process dies at SIGTERM at once: a SIGKILL would mean a
// deadline measured on a starved loop was taken for a live process), and
// nothing is left: no process, no state, no cgroup, no fd. Launched by this
// supervisor, and adopted by a reopened one (non-child pins, and on js the
// exit poller), with a cgroup root where this host has one. `npm test`: 1 000
// launched and 500 adopted; `npm run soak`: 5 000 each. What it costs per
// stop as N grows is measured in bench/drain.js, not here.
import { readdirSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { Supervisor, type StopResult, type SupervisorOptions } from '../../src/index.js';
import { CGROUP_ROOT, CGROUP_SKIP, cgroupsBelow, expectNoCgroupsLeft } from '../helpers/cgroup.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { MARKER } from '../helpers/procs.js';

expectNoLeaks({ marker: MARKER });
expectNoCgroupsLeft();

const SOAK = process.env.CUSTODY_SOAK === '1';
const LAUNCHED = SOAK ? 5000 : 1000;
const ADOPTED = SOAK ? 5000 : 500;
const LANES = 32;

const unhandled: unknown[] = [];
const onUnhandled = (reason: unknown) => unhandled.push(reason);
beforeAll(() => process.on('unhandledRejection', onUnhandled));
afterAll(() => process.off('unhandledRejection', onUnhandled));

const fds = () => readdirSync('/proc/self/fd').length;
// A cheap idle process that takes any argument and dies at SIGTERM: tail retrying a file named by the token.
const idle = (t: string) => ['-F', '/dev/null', `${t}-${MARKER}`];

async function launchAll(supervisor: Supervisor, n: number): Promise<void> {
  let next = 0;
  await Promise.all(
    Array.from({ length: LANES }, async () => {
      while (next < n) {
        const id = `drain-${next++}`;
        await supervisor.launch({ id, command: 'tail', args: idle });
      }
    }),
  );
}

/** Stops every instance at once; returns each stop's result, or the error it failed with. */
async function drain(supervisor: Supervisor): Promise<Array<StopResult | Error>> {
  const ids = supervisor.list().map((x) => x.id);
  const settled = await Promise.allSettled(ids.map((id) => supervisor.stop(id, { graceMs: 5000 })));
  return settled.map((s) => (s.status === 'fulfilled' ? s.value : (s.reason as Error)));
}

function expectAllStopped(results: Array<StopResult | Error>, n: number, stateDir: string): void {
  const failed = results.filter((r) => r instanceof Error);
  expect(failed.slice(0, 3)).toEqual([]);
  expect(results).toHaveLength(n);
  const escalated = results.filter((r) => !(r instanceof Error) && r.escalated);
  expect(escalated).toHaveLength(0);
  expect(results.every((r) => !(r instanceof Error) && r.outcome === 'exited')).toBe(true);
  expect(readdirSync(stateDir).filter((n) => !n.startsWith('.'))).toEqual([]);
}

describe(`draining a host (${backend.name})`, () => {
  it(`stops ${LAUNCHED} launched instances at once: every stop succeeds, none escalates, nothing is left`, {
    timeout: SOAK ? 1_200_000 : 240_000,
  }, async () => {
    // tmpfs: the disk's fsync is not what this is about.
    const stateDir = join('/dev/shm', `custody-drain-${process.pid}-${backend.name}`);
    const { supervisor } = await Supervisor.open({ stateDir, onEvent: () => {} });
    try {
      const fd0 = fds();
      await launchAll(supervisor, LAUNCHED);
      expect(supervisor.list().filter((x) => x.status === 'running')).toHaveLength(LAUNCHED);
      const t0 = performance.now();
      const results = await drain(supervisor);
      console.log(`${backend.name}: ${LAUNCHED} launched stopped at once in ${Math.round(performance.now() - t0)} ms`);
      expectAllStopped(results, LAUNCHED, stateDir);
      expect(supervisor.list()).toEqual([]);
      expect(fds()).toBe(fd0);
      expect(unhandled).toEqual([]);
    } finally {
      await supervisor.close();
      rmSync(stateDir, { recursive: true, force: true });
    }
  });

  it(`stops ${ADOPTED} adopted instances at once${CGROUP_SKIP ? '' : ', each in its own cgroup'}`, {
    timeout: SOAK ? 1_200_000 : 240_000,
  }, async () => {
    const stateDir = join('/dev/shm', `custody-drain-adopted-${process.pid}-${backend.name}`);
    const options: SupervisorOptions = { stateDir, onEvent: () => {} };
    if (!CGROUP_SKIP) options.cgroup = { root: CGROUP_ROOT };
    const first = (await Supervisor.open(options)).supervisor;
    let second: Supervisor | null = null;
    try {
      await launchAll(first, ADOPTED);
      await first.close();
      const reopened = await Supervisor.open(options);
      second = reopened.supervisor;
      expect(reopened.report.adopted).toHaveLength(ADOPTED);
      const results = await drain(second);
      expectAllStopped(results, ADOPTED, stateDir);
      expect(second.list()).toEqual([]);
      expect(unhandled).toEqual([]);
    } finally {
      await first.close();
      await second?.close();
      rmSync(stateDir, { recursive: true, force: true });
    }
    // The supervisor removed every cgroup it made: its instances' and, on close, its own.
    expect(cgroupsBelow(CGROUP_ROOT)).toEqual([]);
  });
});
