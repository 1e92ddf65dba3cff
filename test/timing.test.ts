/** src/timing.ts: within() and sleep() settle once, honour AbortSignal, and leave no timer behind. */
import { describe, expect, it } from 'vitest';
import { sleep, TIMED_OUT, within } from '../src/timing.js';

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
