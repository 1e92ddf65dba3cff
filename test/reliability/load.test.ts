// Load: many supervised processes alive at once, then many launch/stop
// cycles. Open fds come back to where they were, memory stays flat, no
// promise rejection goes unhandled; event-loop delay is reported.
// `npm test` runs a bounded form; `npm run soak` the full one
// (2 000 alive, 10 000 cycles).
import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { monitorEventLoopDelay } from 'node:perf_hooks';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { Supervisor } from '../../src/index.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { MARKER, tmpDir } from '../helpers/procs.js';

expectNoLeaks({ marker: MARKER });

const SOAK = process.env.CUSTODY_SOAK === '1';
const ALIVE = SOAK ? 2000 : 300;
const CYCLES = SOAK ? 10_000 : 1500;
const CONCURRENCY = 16;

setFlagsFromString('--expose-gc');
const gc = runInNewContext('gc') as () => void;

const unhandled: unknown[] = [];
const onUnhandled = (reason: unknown) => unhandled.push(reason);
beforeAll(() => process.on('unhandledRejection', onUnhandled));
afterAll(() => process.off('unhandledRejection', onUnhandled));

const fds = () => readdirSync('/proc/self/fd').length;
const mib = (n: number) => Math.round((n / 2 ** 20) * 10) / 10;
// A cheap idle process that takes any argument: tail retrying a file named by the token.
const idle = (t: string) => ['-F', '/dev/null', `${t}-${MARKER}`];

async function pool<T>(n: number, jobs: Array<() => Promise<T>>): Promise<T[]> {
  const out: T[] = [];
  let next = 0;
  await Promise.all(
    Array.from({ length: n }, async () => {
      while (next < jobs.length) {
        const i = next++;
        out[i] = await jobs[i]!();
      }
    }),
  );
  return out;
}

describe(`load (${backend.name})`, () => {
  it(`${ALIVE} supervised processes alive at once, then ${CYCLES} launch/stop cycles: flat fds and memory`, {
    timeout: SOAK ? 1_800_000 : 180_000,
  }, async () => {
    const dir = tmpDir('custody-load-');
    // tmpfs: this measures custody, not the disk's fsync.
    const stateDir = join('/dev/shm', `custody-load-${process.pid}-${backend.name}`);
    const { supervisor } = await Supervisor.open({ stateDir, onEvent: () => {} });
    const delay = monitorEventLoopDelay({ resolution: 10 });
    try {
      gc();
      const fd0 = fds();
      const mem0 = process.memoryUsage();
      delay.enable();
      const ids = Array.from({ length: ALIVE }, (_, i) => `alive-${i}`);
      await pool(
        CONCURRENCY,
        ids.map((id) => () => supervisor.launch({ id, command: 'tail', args: idle })),
      );
      expect(supervisor.list().filter((x) => x.status === 'running')).toHaveLength(ALIVE);
      gc();
      const memAlive = process.memoryUsage();
      await pool(
        CONCURRENCY,
        ids.map((id) => () => supervisor.stop(id, { graceMs: 5000 })),
      );
      expect(fds()).toBe(fd0);

      const samples: Array<{ cycle: number; heap: number; rss: number; fds: number }> = [];
      const per = CYCLES / 5;
      for (let round = 0; round < 5; round++) {
        await pool(
          CONCURRENCY,
          Array.from({ length: per }, (_, i) => async () => {
            const id = `cycle-${i % CONCURRENCY}-${i}`;
            await supervisor.launch({ id, command: 'tail', args: idle });
            await supervisor.stop(id, { graceMs: 5000 });
          }),
        );
        gc();
        const m = process.memoryUsage();
        samples.push({ cycle: (round + 1) * per, heap: mib(m.heapUsed), rss: mib(m.rss), fds: fds() });
      }
      delay.disable();
      const heapPerAlive = (memAlive.heapUsed - mem0.heapUsed) / ALIVE;
      console.log(
        `${backend.name}: ${ALIVE} alive: +${mib(memAlive.rss - mem0.rss)} MiB RSS, ${Math.round(heapPerAlive)} B heap each; ` +
          `cycles ${JSON.stringify(samples)}; event-loop delay p50 ${(delay.percentile(50) / 1e6).toFixed(1)} ms, p99 ${(delay.percentile(99) / 1e6).toFixed(1)} ms, max ${(delay.max / 1e6).toFixed(1)} ms`,
      );
      expect(unhandled).toEqual([]);
      expect(samples.every((s) => s.fds === fd0)).toBe(true);
      // Flat: the heap after the last round is within a few MiB of the first round's.
      expect(samples.at(-1)!.heap - samples[0]!.heap).toBeLessThan(8);
      expect(supervisor.list()).toEqual([]);
      expect(readdirSync(stateDir).filter((n) => !n.startsWith('.'))).toEqual([]);
    } finally {
      await supervisor.close();
      const { rmSync } = await import('node:fs');
      rmSync(stateDir, { recursive: true, force: true });
      dir.cleanup();
    }
  });
});
