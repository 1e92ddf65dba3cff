// The instance state machine as a table: every legal move is taken, every other one throws, and a stop that
// has begun (its `stopping` manifest written) never goes back. Pure: no process, no state dir.
import { describe, expect, it } from 'vitest';
import {
  IllegalMoveError,
  InstanceTable,
  isLegalMove,
  MOVES,
  shownStatus,
  type Exited,
  type Running,
  type Stopping,
  type Tracked,
  type TrackedStatus,
  type Life,
} from '../../src/lifecycle/instances.js';
import type { ProcessHandle } from '../../src/process/handle.js';

const handle = { pid: 4242 } as ProcessHandle;
const instance = {
  id: 'vm',
  pid: 4242,
  token: 't',
  identity: { pid: 4242 } as Running['instance']['identity'],
  exited: new Promise<never>(() => {}),
  cgroup: null,
  lastExit: null,
  restarts: 0,
};
const pinned = { instance, handle, cgroup: null, session: null, paths: [] };
const running: Running = { status: 'running', ...pinned, logFiles: null };
const exited: Exited = { status: 'exited', ...pinned, exit: { code: 0, signal: null }, cleanup: Promise.resolve() };
const stopping = (from: Running | Exited, persisted: boolean): Stopping => ({
  status: 'stopping',
  from,
  persisted,
  done: null,
  failed: null,
  members: [],
});

/** One record of each status (a stopping one whose stop has begun). */
const sample: Record<TrackedStatus, Tracked> = {
  starting: { status: 'starting' },
  running,
  exited,
  stopping: stopping(running, true),
  quarantined: { status: 'quarantined', manifest: null, reason: 'reused' },
  deferred: { status: 'deferred', error: new Error('EMFILE') },
  backoff: { status: 'backoff', life: {} as Life, dueAt: null, timer: null },
  failed: { status: 'failed', life: {} as Life },
  owed: {
    status: 'owed',
    end: { id: 'vm', pid: 4242, token: 't', code: 0, signal: null, result: 'success', restarting: false },
  },
};
const states = [undefined, ...Object.values(sample)];
/** The legal path from untracked to each sample. */
const pathTo: Record<TrackedStatus, Tracked[]> = {
  starting: [sample.starting],
  running: [running],
  exited: [running, exited],
  stopping: [running, sample.stopping],
  quarantined: [sample.quarantined],
  deferred: [sample.deferred],
  backoff: [running, exited, sample.backoff],
  failed: [running, exited, sample.failed],
  owed: [sample.owed],
};
const name = (t: Tracked | undefined) => t?.status ?? 'untracked';

/** The moves this table must allow, written out apart from MOVES so that an edit to either shows. */
const expected = new Set([
  'untracked>starting',
  'untracked>running',
  'untracked>quarantined',
  'untracked>deferred',
  'starting>running',
  'starting>deferred',
  'starting>quarantined',
  'starting>untracked',
  'running>exited',
  'running>stopping',
  'exited>stopping',
  'exited>untracked',
  'exited>backoff',
  'exited>failed',
  'stopping>stopping',
  'stopping>untracked',
  'stopping>backoff',
  'stopping>failed',
  'untracked>backoff',
  'untracked>failed',
  'untracked>owed',
  'deferred>backoff',
  'deferred>failed',
  'deferred>owed',
  'owed>untracked',
  'backoff>untracked',
  'failed>untracked',
  'quarantined>untracked',
  'deferred>running',
  'deferred>quarantined',
  'deferred>deferred',
  'deferred>untracked',
]);

describe('the instance state machine', () => {
  it('allows exactly the listed moves, and throws on every other one', () => {
    const allowed: string[] = [];
    for (const from of states) {
      for (const to of states) {
        const move = `${name(from)}>${name(to)}`;
        const table = new InstanceTable();
        for (const step of from ? pathTo[from.status] : []) table.move('vm', step);
        const legal = isLegalMove(from, to);
        if (legal) allowed.push(move);
        expect(legal, move).toBe(expected.has(move));
        if (legal) {
          table.move('vm', to);
          expect(table.get('vm'), move).toBe(to);
        } else {
          expect(() => table.move('vm', to), move).toThrow(IllegalMoveError);
          // Refused moves change nothing.
          expect(table.get('vm'), move).toBe(from);
        }
      }
    }
    expect(allowed.sort()).toEqual([...expected].sort());
  });

  it('lets a stop that wrote nothing go back to what it stopped, and never one that began', () => {
    for (const from of [running, exited]) {
      expect(isLegalMove(stopping(from, false), from)).toBe(true);
      expect(isLegalMove(stopping(from, true), from)).toBe(false);
      // Only to the very record it stopped: a new one would be another instance's.
      expect(isLegalMove(stopping(from, false), { ...from })).toBe(false);
    }
    expect(MOVES.stopping).toContain('running');
  });

  it('moves only from the record a caller held, so an overtaken watcher changes nothing', () => {
    const table = new InstanceTable();
    table.move('vm', running);
    const stop = stopping(running, true);
    table.move('vm', stop);
    // The exit watcher held `running`: the stop owns the instance now.
    expect(table.moveFrom('vm', running, exited)).toBe(false);
    expect(table.get('vm')).toBe(stop);
    expect(table.moveFrom('vm', stop, undefined)).toBe(true);
    expect(table.has('vm')).toBe(false);
  });

  it('lists a first stop in flight as what it stops, and one that failed halfway as stopping', () => {
    const inFlight = stopping(running, true);
    expect(shownStatus(inFlight)).toBe('running');
    expect(shownStatus({ ...inFlight, failed: new Error('EMFILE') })).toBe('stopping');
    expect(shownStatus(stopping(exited, false))).toBe('exited');
  });
});
