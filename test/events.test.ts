/**
 * src/events.ts: every event reaches the sink and its diagnostics channel; a
 * failing sink loses nothing; each type has its own fields, in the types
 * (the expectTypeOf and @ts-expect-error lines fail the type check) and in
 * what a real supervisor emits (on both backends).
 */
import { subscribe, unsubscribe } from 'node:diagnostics_channel';
import { rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, expectTypeOf, it } from 'vitest';
import { backend } from '../src/backend/index.js';
import { emitter, type CustodyEventOf, type CustodyEventType } from '../src/events.js';
import type { CustodyEvent, ExitStatus, StopResult } from '../src/index.js';
import { expectNoLeaks } from './helpers/leaks.js';
import { MARKER, waitFor } from './helpers/procs.js';
import { openSupervisor, PERL } from './helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });

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
    emit('adopt', { id: 'vm', pid: 42, message: 'fine' });
    await nextTick();
    expect(warnings).toEqual([expect.objectContaining({ code: 'CUSTODY_WARNING' })]);
  });

  it('a sink that throws, or returns a rejecting promise, is reported and never crashes the process', async () => {
    const stopped = {
      id: 'vm',
      pid: 42,
      outcome: 'exited',
      escalated: false,
      code: 0,
      signal: null,
      result: 'stopped',
      message: 'stopped',
    } as const;
    emitter(() => {
      throw new Error('sync boom');
    })('stop', stopped);
    emitter((() => Promise.reject(new Error('async boom'))) as never)('stop', stopped);
    await nextTick();
    await nextTick();
    expect(warnings.map((w) => w.code)).toEqual(['CUSTODY_EVENT_SINK', 'CUSTODY_EVENT_SINK']);
    expect(warnings.map((w) => w.message).join(' ')).toMatch(/sync boom[\s\S]*async boom/);
  });
});

/** The fields each event type always carries besides type, time and message. */
const REQUIRED: { [T in CustodyEventType]: Array<keyof CustodyEventOf<T>> } = {
  launch: ['id', 'attempt', 'token'],
  spawn: ['id', 'pid'],
  confirm: ['id', 'pid', 'identity'],
  ready: ['id', 'pid'],
  status: ['id', 'pid', 'status'],
  running: ['id', 'pid'],
  abandon: ['id', 'attempt', 'pids', 'error'],
  retry: ['id', 'attempt'],
  escalate: ['id', 'pid'],
  stop: ['id', 'outcome', 'escalated', 'code', 'signal', 'result'],
  exit: ['id', 'pid', 'code', 'signal', 'result'],
  restart: ['id', 'attempt', 'delayMs', 'result'],
  'gave-up': ['id', 'result', 'restarts'],
  warning: [],
  adopt: ['id', 'pid'],
  repair: ['id', 'pid', 'field'],
  clean: ['id'],
  quarantine: ['id'],
  release: ['id', 'reason'],
  sweep: ['argv', 'dryRun', 'matched', 'terminated', 'killed', 'survivors'],
  freeze: ['id'],
  thaw: ['id'],
};

function missingFields(e: CustodyEvent): string[] {
  const want: string[] = ['type', 'time', 'message', ...REQUIRED[e.type]];
  return want.filter((k) => !(k in e) || (e as unknown as Record<string, unknown>)[k] === undefined);
}

describe('event types', () => {
  it('narrowing on type gives each event its own fields', () => {
    const seen: string[] = [];
    const look = (e: CustodyEvent) => {
      // Every event may be filtered by instance without narrowing first.
      expectTypeOf(e.id).toEqualTypeOf<string | undefined>();
      expectTypeOf(e.message).toEqualTypeOf<string>();
      if (e.type === 'stop') {
        expectTypeOf(e.outcome).toEqualTypeOf<StopResult['outcome']>();
        expectTypeOf(e.escalated).toEqualTypeOf<boolean>();
        expectTypeOf(e.pid).toEqualTypeOf<number | undefined>();
        seen.push(`stop ${e.outcome} ${e.escalated}`);
      } else if (e.type === 'exit') {
        expectTypeOf(e.code).toEqualTypeOf<ExitStatus['code']>();
        expectTypeOf(e.signal).toEqualTypeOf<NodeJS.Signals | null>();
        seen.push(`exit ${e.code}`);
      } else if (e.type === 'sweep') {
        expectTypeOf(e.matched).toEqualTypeOf<number[]>();
        expectTypeOf(e.id).toEqualTypeOf<undefined>();
        seen.push(`sweep ${e.matched.length}`);
      } else if (e.type === 'launch') {
        expectTypeOf(e.attempt).toEqualTypeOf<number>();
        expectTypeOf(e.token).toEqualTypeOf<string>();
        seen.push(`launch ${e.attempt}`);
      } else if (e.type === 'warning') {
        expectTypeOf(e.pids).toEqualTypeOf<number[] | undefined>();
        seen.push('warning');
      } else {
        // @ts-expect-error only a stop has an outcome
        void e.outcome;
        // @ts-expect-error only a sweep has matches
        void e.matched;
      }
    };
    const emit = emitter(look);
    emit('stop', {
      id: 'a',
      pid: 2,
      outcome: 'already-gone',
      escalated: false,
      code: null,
      signal: null,
      result: 'unknown',
      message: '',
    });
    emit('exit', { id: 'a', pid: 2, code: 3, signal: null, result: 'exit-code', message: '' });
    emit('sweep', { argv: ['x'], dryRun: true, matched: [7], terminated: [], killed: [], survivors: [], message: '' });
    emit('launch', { id: 'a', attempt: 1, token: 'ab', message: '' });
    emit('warning', { message: 'careful' });
    expect(seen).toEqual(['stop already-gone false', 'exit 3', 'sweep 1', 'launch 1', 'warning']);
  });

  it("an emitter takes only a known type, with that type's fields", () => {
    const got: CustodyEvent[] = [];
    const emit = emitter((e) => got.push(e));
    // @ts-expect-error a stop carries how it ended
    emit('stop', { id: 'a', pid: 2, message: '' });
    // @ts-expect-error no such event
    emit('stopped', { id: 'a', message: '' });
    // @ts-expect-error a freeze is of the instance, not of one pid
    emit('freeze', { id: 'a', pid: 2, message: '' });
    // What the types refuse is still delivered as given: the emitter checks nothing at run time.
    expect(got.map((e) => e.type)).toEqual(['stop', 'stopped', 'freeze']);
  });

  it(`what a supervisor emits carries its type's fields (${backend.name})`, async () => {
    const ctx = await openSupervisor();
    let cleanupGate = () => {};
    try {
      const args = (t: string) => ['-e', 'sleep 30', '--', t, MARKER];
      await ctx.supervisor.launch({ id: 'kept', command: PERL, args, ready: () => true });
      await ctx.supervisor.stop('kept', { graceMs: 2000 });
      // It exits once launched (the gate file appears), not after a sleep a loaded machine outruns before confirm.
      const gate = join(tmpdir(), `custody-events-gate-${process.pid}-${Date.now()}`);
      const brief = (t: string) => ['-e', 'select(undef, undef, undef, 0.02) until -e $ARGV[2]', '--', t, MARKER, gate];
      await ctx.supervisor.launch({ id: 'brief', command: PERL, args: brief });
      writeFileSync(gate, '');
      cleanupGate = () => rmSync(gate, { force: true });
      await waitFor(() => ctx.events.some((e) => e.type === 'exit' && e.id === 'brief'), 10_000, 'the exit event');
      const types = new Set(ctx.events.map((e) => e.type));
      expect([...types].sort()).toEqual(
        expect.arrayContaining(['confirm', 'exit', 'launch', 'ready', 'running', 'spawn', 'stop']),
      );
      expect(ctx.events.filter((e) => missingFields(e).length > 0).map((e) => [e.type, missingFields(e)])).toEqual([]);
      const stop = ctx.events.find((e): e is CustodyEventOf<'stop'> => e.type === 'stop');
      expect(stop).toMatchObject({ id: 'kept', outcome: 'exited', escalated: false, signal: 'SIGTERM' });
    } finally {
      cleanupGate();
      await ctx.dispose();
    }
  });
});
