// The supervisor's own retries of deferred instances (src/recovery/retry.ts):
// the schedule alone, on vitest's clock (nothing of the kernel is involved).
// That a real deferred instance is then adopted or cleaned with nobody
// calling recover() is shown in test/reliability/preexec.test.ts and
// test/identity-truths.test.ts.
import { afterEach, beforeEach, describe, expect, it, vi } from 'vitest';
import { DeferredRetry, RETRY_FIRST_MS, RETRY_MAX_MS } from '../../src/recovery/retry.js';

beforeEach(() => {
  vi.useFakeTimers();
});
afterEach(() => {
  vi.useRealTimers();
});

/** A host whose deferred ids stay deferred until `decide()`, recording when each recover() ran. */
function host(options: { fail?: boolean } = {}) {
  let deferred = true;
  const runs: number[] = [];
  const failures: Array<{ message: string; nextMs: number }> = [];
  const start = Date.now();
  const h = {
    ref: false,
    pending: () => deferred,
    recover: async () => {
      runs.push(Date.now() - start);
      if (options.fail) throw new Error('EMFILE: too many open files');
    },
    failed: (err: Error, nextMs: number) => failures.push({ message: err.message, nextMs }),
  };
  return {
    h,
    runs,
    failures,
    now: () => Date.now() - start,
    decide: () => (deferred = false),
    defer: () => (deferred = true),
  };
}

describe('retrying deferred instances', () => {
  it('waits 1 s, then doubles up to 60 s, while an id stays deferred', async () => {
    const { h, runs } = host();
    const retry = new DeferredRetry(h);
    retry.poke();
    await vi.advanceTimersByTimeAsync(300_000);
    const gaps = runs.map((t, i) => t - (runs[i - 1] ?? 0));
    expect(gaps.slice(0, 7)).toEqual([1000, 2000, 4000, 8000, 16_000, 32_000, 60_000]);
    expect(new Set(gaps.slice(6))).toEqual(new Set([RETRY_MAX_MS]));
    retry.close();
  });

  it('stops once nothing is deferred, and starts again from 1 s at the next deferral', async () => {
    const t = host();
    const retry = new DeferredRetry(t.h);
    retry.poke();
    await vi.advanceTimersByTimeAsync(7000);
    expect(t.runs).toEqual([1000, 3000, 7000]);
    t.decide();
    await vi.advanceTimersByTimeAsync(120_000);
    expect(t.runs).toHaveLength(4);
    expect(retry.waitMs).toBe(RETRY_FIRST_MS);
    const at = t.now();
    t.defer();
    retry.poke();
    await vi.advanceTimersByTimeAsync(RETRY_FIRST_MS);
    expect(t.runs.slice(4)).toEqual([at + RETRY_FIRST_MS]);
    retry.close();
  });

  it('a poke while a timer is set or a retry runs adds no second one', async () => {
    const t = host();
    const retry = new DeferredRetry(t.h);
    for (let i = 0; i < 5; i++) retry.poke();
    await vi.advanceTimersByTimeAsync(1000);
    for (let i = 0; i < 5; i++) retry.poke();
    await vi.advanceTimersByTimeAsync(2000);
    expect(t.runs).toEqual([1000, 3000]);
    retry.close();
  });

  it('a recover() that fails is reported with the next wait, and retried', async () => {
    const t = host({ fail: true });
    const retry = new DeferredRetry(t.h);
    retry.poke();
    await vi.advanceTimersByTimeAsync(3000);
    expect(t.failures).toEqual([
      { message: 'EMFILE: too many open files', nextMs: 2000 },
      { message: 'EMFILE: too many open files', nextMs: 4000 },
    ]);
    retry.close();
  });

  it('close() cancels the next retry, and nothing is scheduled after it', async () => {
    const t = host();
    const retry = new DeferredRetry(t.h);
    retry.poke();
    await vi.advanceTimersByTimeAsync(1000);
    retry.close();
    retry.poke();
    await vi.advanceTimersByTimeAsync(600_000);
    expect(t.runs).toEqual([1000]);
    expect(vi.getTimerCount()).toBe(0);
  });
});
