/** src/timing.ts: within(), sleep(), backoff() and paced() settle once, honour AbortSignal, and leave no timer behind. */
import { describe, expect, it } from 'vitest';
import { backoff, loopSlices, paced, pacedUntil, sleep, TIMED_OUT, within } from '../src/timing.js';

const activeTimers = () =>
  (process as unknown as { getActiveResourcesInfo(): string[] }).getActiveResourcesInfo().filter((r) => r === 'Timeout')
    .length;

describe('timing', () => {
  it('within() resolves with the value, or TIMED_OUT, and removes its timer either way', async () => {
    const before = activeTimers();
    expect(await within(Promise.resolve(7), 1000)).toBe(7);
    expect(await within(new Promise(() => {}), 5)).toBe(TIMED_OUT);
    await expect(within(Promise.reject(new Error('boom')), 1000)).rejects.toThrow('boom');
    expect(activeTimers()).toBe(before);
  });

  it('an abort rejects with AbortError carrying the reason; an already-aborted signal rejects at once', async () => {
    const ac = new AbortController();
    const p = within(new Promise(() => {}), 10_000, ac.signal);
    ac.abort(new Error('stop now'));
    await expect(p).rejects.toMatchObject({ name: 'AbortError', code: 'ABORT_ERR', cause: new Error('stop now') });
    await expect(sleep(10_000, ac.signal)).rejects.toMatchObject({ name: 'AbortError' });
  });

  it('an infinite bound never times out', async () => {
    expect(await within(new Promise((r) => setTimeout(() => r('late'), 20)), Number.POSITIVE_INFINITY)).toBe('late');
  });
});

/** Every wait backoff() makes, for at most `n` attempts. */
async function waits(n: number, options: Parameters<typeof backoff>[0]): Promise<number[]> {
  const out: number[] = [];
  for await (const waited of backoff(options)) {
    out.push(waited);
    if (out.length === n) break;
  }
  return out;
}

describe('backoff', () => {
  it('tries at once, then waits firstMs, doubling up to maxMs', async () => {
    expect(await waits(7, { maxMs: 8 })).toEqual([0, 1, 2, 4, 8, 8, 8]);
    expect(await waits(5, { firstMs: 5, maxMs: 100 })).toEqual([0, 5, 10, 20, 40]);
    // A first wait of 0 (a bare yield to the loop) still grows.
    expect(await waits(4, { firstMs: 0, maxMs: 20 })).toEqual([0, 0, 1, 2]);
  });

  it('ends once an attempt finds the deadline passed, the last wait cut to it', async () => {
    const deadline = Date.now() + 40;
    const seen = await waits(1000, { maxMs: 1000, deadline });
    expect(Date.now()).toBeGreaterThanOrEqual(deadline);
    // Bounded by the deadline, not by the attempt count; no wait beyond what was left.
    expect(seen.length).toBeLessThan(1000);
    expect(seen.reduce((a, b) => a + b, 0)).toBeLessThanOrEqual(40);
    // A deadline already passed: one attempt, no wait.
    expect(await waits(10, { maxMs: 10, deadline: Date.now() - 1 })).toEqual([0]);
    // timeoutMs counts from the first attempt.
    const start = Date.now();
    await waits(1000, { maxMs: 5, timeoutMs: 20 });
    expect(Date.now() - start).toBeGreaterThanOrEqual(20);
  });

  it('an abort ends the wait with AbortError; an aborted signal before any attempt too', async () => {
    const ac = new AbortController();
    const seen: number[] = [];
    const loop = (async () => {
      for await (const waited of backoff({ firstMs: 10_000, maxMs: 10_000, signal: ac.signal })) seen.push(waited);
    })();
    await sleep(5);
    ac.abort(new Error('enough'));
    await expect(loop).rejects.toMatchObject({ name: 'AbortError', cause: new Error('enough') });
    expect(seen).toEqual([0]);
    await expect(waits(3, { maxMs: 1, signal: ac.signal })).rejects.toMatchObject({ name: 'AbortError' });
  });

  it('leaving the loop early leaves no timer behind', async () => {
    const before = activeTimers();
    for await (const waited of backoff({ maxMs: 50, timeoutMs: 10_000 })) if (waited >= 4) break;
    expect(activeTimers()).toBe(before);
  });

  it('loopSlices() lets the loop turn once a slice is spent, and not before', async () => {
    const long = loopSlices(60_000);
    expect(long()).toBeNull();
    // A spent slice: the returned turn lets an immediate queued before it run first.
    const spent = loopSlices(0);
    const order: string[] = [];
    setImmediate(() => order.push('other'));
    const turn = spent();
    expect(turn).not.toBeNull();
    await turn;
    order.push('slice');
    expect(order).toEqual(['other', 'slice']);
  });
});

/** Spins for ms: a check that costs what reading a busy /proc does. */
function spin(ms: number): void {
  const until = performance.now() + ms;
  while (performance.now() < until) {
    /* busy */
  }
}

describe('paced', () => {
  it('many checks share one timer: a tick runs what fits its budget, the rest next tick, each once a tick', async () => {
    const before = activeTimers();
    const runs = new Array<number>(200).fill(0);
    let done = 0;
    const waits = runs.map((_, i) =>
      paced(() => {
        runs[i]! += 1;
        spin(0.5);
        return runs[i]! >= 2;
      }).done.then(() => done++),
    );
    // One timer for all two hundred, not one each.
    expect(activeTimers()).toBe(before + 1);
    await sleep(30);
    // The first tick ran what fits in its budget (a few ms at 0.5 ms each), at least one, and no check twice.
    const ran = runs.filter((n) => n > 0).length;
    expect(ran).toBeGreaterThanOrEqual(1);
    expect(ran).toBeLessThan(100);
    expect(Math.max(...runs)).toBe(1);
    await Promise.all(waits);
    expect(done).toBe(200);
    expect(runs.every((n) => n === 2)).toBe(true);
    // The last one done, the timer goes (another test's timer may have gone meanwhile too).
    expect(activeTimers()).toBeLessThanOrEqual(before);
  });

  it('cancel() withdraws a check; one that throws rejects its own wait and no other', async () => {
    const before = activeTimers();
    let cancelledRuns = 0;
    const cancelled = paced(() => {
      cancelledRuns++;
      return false;
    });
    cancelled.cancel();
    const failing = paced(() => {
      throw new Error('unreadable');
    });
    let n = 0;
    const fine = paced(() => ++n >= 3);
    await expect(failing.done).rejects.toThrow('unreadable');
    await fine.done;
    expect(cancelledRuns).toBe(0);
    expect(activeTimers()).toBeLessThanOrEqual(before);
  });

  it('pacedUntil() reads once more, fresh, at its bound: what became true as the bound passed is true', async () => {
    expect(await pacedUntil(() => true, 0)).toBe(true);
    let flips = 0;
    // False on every paced tick, true when read at the bound: the verdict is the fresh read.
    const start = Date.now();
    expect(
      await pacedUntil(() => {
        flips++;
        return Date.now() - start >= 60;
      }, 60),
    ).toBe(true);
    expect(flips).toBeGreaterThan(1);
    expect(await pacedUntil(() => false, 30)).toBe(false);
    const ac = new AbortController();
    const waiting = pacedUntil(() => false, 10_000, ac.signal);
    ac.abort(new Error('enough'));
    await expect(waiting).rejects.toMatchObject({ name: 'AbortError' });
  });
});
