/** src/events.ts: every event reaches the sink and its diagnostics channel; a failing sink loses nothing. */
import { subscribe, unsubscribe } from 'node:diagnostics_channel';
import { afterEach, describe, expect, it } from 'vitest';
import { emitter, type CustodyEvent } from '../src/events.js';

const warnings: Array<{ message: string; code?: string }> = [];
const onWarning = (w: Error & { code?: string }) => warnings.push({ message: w.message, code: w.code });
process.on('warning', onWarning);
afterEach(() => {
  warnings.length = 0;
});

const nextTick = () => new Promise((r) => setImmediate(r));

describe('events', () => {
  it('delivers to the sink and to custody:<type> with a time stamp', () => {
    const seen: CustodyEvent[] = [];
    const onChannel = (m: unknown) => seen.push(m as CustodyEvent);
    subscribe('custody:adopt', onChannel);
    try {
      const got: CustodyEvent[] = [];
      emitter((e) => got.push(e))('adopt', { id: 'vm', pid: 42, message: 'adopted' });
      expect(got).toEqual([expect.objectContaining({ type: 'adopt', id: 'vm', pid: 42, time: expect.any(Number) })]);
      expect(seen).toEqual(got);
    } finally {
      unsubscribe('custody:adopt', onChannel);
    }
  });

  it('without a sink, warnings become process warnings; other events do not', async () => {
    const emit = emitter(undefined);
    emit('warning', { id: 'vm', message: 'careful' });
    emit('adopt', { id: 'vm', message: 'fine' });
    await nextTick();
    expect(warnings).toEqual([expect.objectContaining({ code: 'CUSTODY_WARNING' })]);
  });

  it('a sink that throws, or returns a rejecting promise, is reported and never crashes the process', async () => {
    emitter(() => {
      throw new Error('sync boom');
    })('stop', { id: 'vm' });
    emitter((() => Promise.reject(new Error('async boom'))) as never)('stop', { id: 'vm' });
    await nextTick();
    await nextTick();
    expect(warnings.map((w) => w.code)).toEqual(['CUSTODY_EVENT_SINK', 'CUSTODY_EVENT_SINK']);
    expect(warnings.map((w) => w.message).join(' ')).toMatch(/sync boom[\s\S]*async boom/);
  });
});
