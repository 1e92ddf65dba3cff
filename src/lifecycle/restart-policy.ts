/**
 * Restart policies with systemd's meaning (`Restart=`, `RestartSec=`,
 * `RestartSteps=`/`RestartMaxDelaySec=`, `StartLimitBurst=` and
 * `StartLimitIntervalSec=`, `SuccessExitStatus=`): which ends are clean, which
 * policy restarts after which end, and the budget (how many ends within a
 * window, the delay that doubles with each restart in a row). Pure
 * arithmetic over plain records, so that the budget can be written to a
 * manifest and carried on by the next supervisor as it was.
 */
import { InvalidArgError } from '../errors.js';
import type { LastExit } from '../types.js';
import { assertDuration, assertKnownKeys } from '../validate.js';

/** When a restart policy restarts, as systemd's Restart=. */
export type RestartWhen = 'no' | 'on-failure' | 'on-abnormal' | 'always';

/** `LaunchSpec.restart`: every field but `when` has a default. */
export interface RestartOptions {
  /** `no` (the default), `on-failure`, `on-abnormal` or `always`, as systemd's Restart=. */
  when: RestartWhen;
  /** The wait before the first restart in a row. Default 100. */
  delayMs?: number;
  /** The delay doubles with each restart in a row, up to this. Default delayMs (no doubling). */
  maxDelayMs?: number;
  /** More than `count` ends within `withinMs` → `failed`. Default { count: 5, withinMs: 10 000 }; withinMs 0: no limit. */
  limit?: {
    /** Ends allowed within the window. */
    count: number;
    /** The window, in ms; 0: no limit. */
    withinMs: number;
  };
  /** A run this long resets the delay to delayMs. Default limit.withinMs. */
  resetAfterMs?: number;
  /** Exit codes that are clean besides 0 (systemd's SuccessExitStatus=). */
  successCodes?: number[];
}

/** A policy with every default settled: what a manifest records. */
export interface RestartPolicy {
  when: Exclude<RestartWhen, 'no'>;
  delayMs: number;
  maxDelayMs: number;
  limit: { count: number; withinMs: number };
  resetAfterMs: number;
  successCodes: number[];
}

/**
 * What the instance has used of its budget, durable: every restart since
 * launch(), the restarts in a row (the delay's exponent), and the times
 * (epoch ms) of the ends inside the limit's window.
 */
export interface RestartBudget {
  restarts: number;
  streak: number;
  ends: number[];
}

export const FRESH_BUDGET: RestartBudget = Object.freeze({ restarts: 0, streak: 0, ends: Object.freeze([]) as never });

const OPTION_KEYS: Record<keyof RestartOptions, true> = {
  when: true,
  delayMs: true,
  maxDelayMs: true,
  limit: true,
  resetAfterMs: true,
  successCodes: true,
};
const LIMIT_KEYS: Record<'count' | 'withinMs', true> = { count: true, withinMs: true };
const WHEN: readonly RestartWhen[] = ['no', 'on-failure', 'on-abnormal', 'always'];
/** At most this many ends are counted in a window: the budget stays a small record. */
const MAX_LIMIT_COUNT = 10_000;

export function validateRestart(r: unknown): void {
  if (r === undefined) return;
  if (!r || typeof r !== 'object' || Array.isArray(r)) throw new InvalidArgError('restart must be an object');
  assertKnownKeys(r as RestartOptions, OPTION_KEYS, 'LaunchSpec.restart');
  const o = r as RestartOptions;
  if (!WHEN.includes(o.when)) throw new InvalidArgError(`restart.when must be one of ${WHEN.join(', ')}`);
  if (o.delayMs !== undefined) assertDuration(o.delayMs, 'restart.delayMs');
  if (o.maxDelayMs !== undefined) assertDuration(o.maxDelayMs, 'restart.maxDelayMs');
  if (o.maxDelayMs !== undefined && o.maxDelayMs < (o.delayMs ?? 100))
    throw new InvalidArgError('restart.maxDelayMs must be at least restart.delayMs');
  if (o.resetAfterMs !== undefined) assertDuration(o.resetAfterMs, 'restart.resetAfterMs');
  if (o.limit !== undefined) {
    if (!o.limit || typeof o.limit !== 'object') throw new InvalidArgError('restart.limit must be { count, withinMs }');
    assertKnownKeys(o.limit, LIMIT_KEYS, 'LaunchSpec.restart.limit');
    const { count, withinMs } = o.limit;
    if (!Number.isInteger(count) || count < 0 || count > MAX_LIMIT_COUNT)
      throw new InvalidArgError(`restart.limit.count must be an integer from 0 to ${MAX_LIMIT_COUNT}`);
    assertDuration(withinMs, 'restart.limit.withinMs');
  }
  if (o.successCodes !== undefined) {
    const ok =
      Array.isArray(o.successCodes) &&
      o.successCodes.length <= 256 &&
      o.successCodes.every((c) => Number.isInteger(c) && c >= 0 && c <= 255);
    if (!ok) throw new InvalidArgError('restart.successCodes must be a list of exit codes from 0 to 255');
  }
}

/** The policy with its defaults; null where nothing is ever restarted. */
export function restartPolicy(o: RestartOptions | undefined): RestartPolicy | null {
  if (!o || o.when === 'no') return null;
  const delayMs = o.delayMs ?? 100;
  const limit = { count: o.limit?.count ?? 5, withinMs: o.limit?.withinMs ?? 10_000 };
  return {
    when: o.when,
    delayMs,
    maxDelayMs: o.maxDelayMs ?? delayMs,
    limit,
    resetAfterMs: o.resetAfterMs ?? limit.withinMs,
    successCodes: [...new Set(o.successCodes ?? [])].sort((a, b) => a - b),
  };
}

/** The signals whose death systemd counts clean: a service asked to end that did. */
const CLEAN_SIGNALS: ReadonlySet<string> = new Set(['SIGHUP', 'SIGINT', 'SIGTERM', 'SIGPIPE']);

/** Clean: exit 0 or a success code, or death by SIGHUP, SIGINT, SIGTERM or SIGPIPE; never one custody caused. */
export function isClean(end: LastExit, successCodes: readonly number[]): boolean {
  if (end.result === 'health' || end.result === 'watchdog' || end.result === 'unknown') return false;
  if (end.result === 'oom-kill' || end.result === 'core-dump') return false;
  if (end.code !== null) return end.code === 0 || successCodes.includes(end.code);
  return end.signal !== null && CLEAN_SIGNALS.has(end.signal);
}

/** Whether the policy restarts after this end (never after stop()). */
export function restartsAfter(p: RestartPolicy, end: LastExit): boolean {
  if (end.result === 'stopped') return false;
  if (p.when === 'always') return true;
  if (isClean(end, p.successCodes)) return false;
  if (p.when === 'on-failure') return true;
  // on-abnormal: a signal, a watchdog or a health failure, a status that cannot be known; not an exit code.
  return end.code === null;
}

export type Step = { giveUp: false; delayMs: number; budget: RestartBudget } | { giveUp: true; budget: RestartBudget };

/**
 * The budget after one more end at `now`, of a run that lasted `ranMs`: given
 * up where the window now holds more than `limit.count` ends, else the delay
 * before the restart (doubling with each in a row, from delayMs again after a
 * run of resetAfterMs).
 */
export function nextStep(p: RestartPolicy, b: RestartBudget, now: number, ranMs: number): Step {
  // A window of 0 ms counts nothing (systemd's StartLimitIntervalSec=0: no limit).
  const ends =
    p.limit.withinMs === 0
      ? []
      : [...b.ends.filter((t) => t > now - p.limit.withinMs && t <= now), now].slice(-(p.limit.count + 1));
  const streak = ranMs >= p.resetAfterMs ? 0 : b.streak;
  if (ends.length > p.limit.count) return { giveUp: true, budget: { ...b, streak, ends } };
  // 2^31 is past any duration custody accepts: the doubling stops there, it never overflows.
  const delayMs = Math.min(p.maxDelayMs, p.delayMs * 2 ** Math.min(streak, 31));
  return { giveUp: false, delayMs, budget: { restarts: b.restarts + 1, streak: streak + 1, ends } };
}

/** A manifest's policy and budget, decoded: a reason where malformed. */
export function restartRecordProblem(v: unknown): string | null {
  if (!v || typeof v !== 'object') return 'restart is not an object';
  const r = v as Record<string, unknown>;
  const isCount = (n: unknown) => typeof n === 'number' && Number.isSafeInteger(n) && n >= 0;
  try {
    validateRestart(r.policy);
  } catch (err) {
    return `restart.policy: ${(err as Error).message}`;
  }
  const p = r.policy as RestartOptions;
  if (p.when === 'no' || p.limit === undefined || p.delayMs === undefined) return 'restart.policy is not settled';
  if (!isCount(r.restarts) || !isCount(r.streak)) return 'restart counts are malformed';
  if (!Array.isArray(r.ends) || r.ends.length > p.limit.count + 1 || !r.ends.every(isCount))
    return 'restart.ends is malformed';
  return null;
}
