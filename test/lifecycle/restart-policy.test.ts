// The restart arithmetic as tables (pure: no process): systemd's clean, each
// policy against each kind of end, the delay's doubling and reset, the
// limit's window, and what a manifest's restart record may hold.
import { describe, expect, it } from 'vitest';
import {
  FRESH_BUDGET,
  isClean,
  nextStep,
  type RestartBudget,
  restartPolicy,
  restartRecordProblem,
  restartsAfter,
} from '../../src/lifecycle/restart-policy.js';
import type { ExitResult, LastExit } from '../../src/types.js';

const end = (code: number | null, signal: NodeJS.Signals | null, result: ExitResult): LastExit => ({
  code,
  signal,
  result,
});

const ENDS: Array<[string, LastExit]> = [
  ['exit 0', end(0, null, 'success')],
  ['exit 3', end(3, null, 'exit-code')],
  ['exit 7 (a success code)', end(7, null, 'exit-code')],
  ['SIGTERM', end(null, 'SIGTERM', 'signal')],
  ['SIGHUP', end(null, 'SIGHUP', 'signal')],
  ['SIGKILL', end(null, 'SIGKILL', 'signal')],
  ['SIGABRT, core', end(null, 'SIGABRT', 'core-dump')],
  ['OOM kill', end(null, 'SIGKILL', 'oom-kill')],
  ['watchdog (SIGABRT)', end(null, 'SIGABRT', 'watchdog')],
  ['health (SIGTERM)', end(null, 'SIGTERM', 'health')],
  ['unknown', end(null, null, 'unknown')],
  ['stopped', end(null, 'SIGTERM', 'stopped')],
];

describe('restart policies', () => {
  it("clean is systemd's: exit 0 or a success code, or SIGHUP, SIGINT, SIGTERM, SIGPIPE; never an end custody caused", () => {
    expect(ENDS.map(([name, e]) => [name, isClean(e, [7])])).toEqual([
      ['exit 0', true],
      ['exit 3', false],
      ['exit 7 (a success code)', true],
      ['SIGTERM', true],
      ['SIGHUP', true],
      ['SIGKILL', false],
      ['SIGABRT, core', false],
      ['OOM kill', false],
      ['watchdog (SIGABRT)', false],
      ['health (SIGTERM)', false],
      ['unknown', false],
      ['stopped', true],
    ]);
  });

  it('each policy restarts after exactly the ends its table names', () => {
    const row = (when: 'on-failure' | 'on-abnormal' | 'always') => {
      const p = restartPolicy({ when, successCodes: [7] })!;
      return ENDS.filter(([, e]) => restartsAfter(p, e)).map(([name]) => name);
    };
    expect(row('on-failure')).toEqual([
      'exit 3',
      'SIGKILL',
      'SIGABRT, core',
      'OOM kill',
      'watchdog (SIGABRT)',
      'health (SIGTERM)',
      'unknown',
    ]);
    expect(row('on-abnormal')).toEqual([
      'SIGKILL',
      'SIGABRT, core',
      'OOM kill',
      'watchdog (SIGABRT)',
      'health (SIGTERM)',
      'unknown',
    ]);
    expect(row('always')).toEqual(ENDS.map(([name]) => name).filter((n) => n !== 'stopped'));
    expect(restartPolicy({ when: 'no' })).toBeNull();
    expect(restartPolicy(undefined)).toBeNull();
  });

  it('the delay doubles with each restart in a row up to maxDelayMs, and starts again after a run of resetAfterMs', () => {
    const p = restartPolicy({
      when: 'always',
      delayMs: 100,
      maxDelayMs: 700,
      resetAfterMs: 1000,
      limit: { count: 100, withinMs: 60_000 },
    })!;
    let b: RestartBudget = FRESH_BUDGET;
    const delays: number[] = [];
    const runs = [10, 10, 10, 10, 10, 5000, 10, 10];
    for (const [k, ran] of runs.entries()) {
      const step = nextStep(p, b, 1_000_000 + k * 1000, ran);
      if (step.giveUp) throw new Error('gave up');
      delays.push(step.delayMs);
      b = step.budget;
    }
    expect(delays).toEqual([100, 200, 400, 700, 700, 100, 200, 400]);
    expect(b.restarts).toBe(8);
  });

  it('more than limit.count ends within limit.withinMs gives up; older ends leave the window; withinMs 0 is no limit', () => {
    const p = restartPolicy({ when: 'always', delayMs: 0, limit: { count: 2, withinMs: 1000 } })!;
    const at = (times: number[]) => {
      let b: RestartBudget = FRESH_BUDGET;
      return times.map((t) => {
        const step = nextStep(p, b, t, 0);
        b = step.budget;
        return step.giveUp;
      });
    };
    expect(at([0, 100, 200])).toEqual([false, false, true]);
    // The first end has left the window by the third.
    expect(at([0, 100, 1001])).toEqual([false, false, false]);
    const unlimited = restartPolicy({ when: 'always', limit: { count: 0, withinMs: 0 } })!;
    let b: RestartBudget = FRESH_BUDGET;
    for (let t = 0; t < 50; t++) {
      const step = nextStep(unlimited, b, t, 0);
      expect(step.giveUp).toBe(false);
      b = step.budget;
    }
    expect(b.ends).toEqual([]);
  });

  it('a restart record from a manifest is checked field by field', () => {
    const policy = restartPolicy({ when: 'on-failure' });
    expect(restartRecordProblem({ policy, restarts: 1, streak: 1, ends: [5], lastExit: null })).toBeNull();
    expect(restartRecordProblem({ policy: { when: 'no' }, restarts: 0, streak: 0, ends: [] })).toMatch(/not settled/);
    expect(restartRecordProblem({ policy, restarts: -1, streak: 0, ends: [] })).toMatch(/counts/);
    expect(restartRecordProblem({ policy, restarts: 0, streak: 0, ends: new Array(7).fill(1) })).toMatch(/ends/);
    expect(restartRecordProblem({ policy: { ...policy, delayMs: -5 }, restarts: 0, streak: 0, ends: [] })).toMatch(
      /delayMs/,
    );
    expect(restartRecordProblem('x')).toMatch(/not an object/);
  });
});
