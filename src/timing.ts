import { AbortError } from './errors.js';

export const TIMED_OUT = Symbol('timed out');

/**
 * Races a promise against a deadline and an AbortSignal. Resolves with the
 * promise's value or TIMED_OUT; rejects with AbortError on abort. The timer
 * and the abort listener are always removed, so nothing keeps the loop alive.
 */
export function within<T>(
  promise: Promise<T>,
  ms: number,
  signal?: AbortSignal,
  unref = false,
): Promise<T | typeof TIMED_OUT> {
  if (signal?.aborted) return Promise.reject(new AbortError(signal.reason));
  return new Promise((resolve, reject) => {
    let timer: NodeJS.Timeout | undefined;
    const onAbort = () => {
      cleanup();
      reject(new AbortError(signal?.reason));
    };
    const cleanup = () => {
      if (timer) clearTimeout(timer);
      signal?.removeEventListener('abort', onAbort);
    };
    const settle = (finish: () => void) => {
      cleanup();
      finish();
    };
    if (Number.isFinite(ms)) {
      timer = setTimeout(() => settle(() => resolve(TIMED_OUT)), Math.max(0, ms));
      if (unref) timer.unref();
    }
    signal?.addEventListener('abort', onAbort, { once: true });
    promise.then(
      (v) => settle(() => resolve(v)),
      (e) => settle(() => reject(e)),
    );
  });
}

/** Waits ms; `unref`: the timer does not keep the event loop alive (a wait nobody must be kept for). */
export function sleep(ms: number, signal?: AbortSignal, unref = false): Promise<void> {
  return within(new Promise<never>(() => {}), ms, signal, unref).then(() => undefined);
}

export interface BackoffOptions {
  /** The first wait (default 1 ms); each next one doubles, up to maxMs. */
  firstMs?: number;
  maxMs: number;
  /** When to stop, as a Date.now() value; or timeoutMs from the first attempt. Neither: never. */
  deadline?: number;
  timeoutMs?: number;
  /** Aborts the wait: the loop throws AbortError. */
  signal?: AbortSignal;
  /** The waits do not keep the event loop alive. */
  unref?: boolean;
}

/**
 * The one polling loop: `for await (const waited of backoff(o)) { if (done()) break; }`. The first attempt
 * comes at once, each next one after a wait that doubles (firstMs, 2*firstMs, ... maxMs), the last cut to
 * the deadline; the loop ends once an attempt finds the deadline passed. Yields the ms waited before the
 * attempt (0 for the first). Leaving the loop early leaves no timer behind.
 */
export async function* backoff(options: BackoffOptions): AsyncGenerator<number, void, undefined> {
  const { maxMs, signal } = options;
  const deadline = options.deadline ?? Date.now() + (options.timeoutMs ?? Number.POSITIVE_INFINITY);
  let delay = options.firstMs ?? 1;
  let waited = 0;
  for (;;) {
    if (signal?.aborted) throw new AbortError(signal.reason);
    yield waited;
    const left = deadline - Date.now();
    if (left <= 0) return;
    waited = Math.min(delay, left);
    await sleep(waited, signal, options.unref === true);
    delay = Math.min(Math.max(delay * 2, 1), maxMs);
  }
}

/**
 * How long synchronous work over many items (a scan of /proc, a check of
 * every log) runs on the event loop before it lets the loop turn.
 */
export const LOOP_SLICE_MS = 2;

/**
 * Slices for such work: call the result before each item; it returns a
 * promise to await (a turn of the loop, via setImmediate) once the slice's
 * time is spent, and null while it is not.
 */
export function loopSlices(ms = LOOP_SLICE_MS): () => Promise<void> | null {
  let until = performance.now() + ms;
  return () => {
    if (performance.now() < until) return null;
    return new Promise<void>((resolve) =>
      setImmediate(() => {
        until = performance.now() + ms;
        resolve();
      }),
    );
  };
}

/** How often paced checks run, and how much of each tick they may take together. */
const PACE_TICK_MS = 25;
const PACE_BUDGET_MS = 4;

interface PacedCheck {
  check: () => boolean;
  withdrawn?: boolean;
  resolve: () => void;
  reject: (err: unknown) => void;
}

/** The checks waiting for their turn, in the order they run next (one that ran and goes on waits at the end). */
const pacedChecks = new Set<PacedCheck>();
let paceTimer: NodeJS.Timeout | undefined;

/**
 * A check that many waiters poll on one shared timer: each tick runs the
 * waiting checks in turn for at most PACE_BUDGET_MS (at least one), and the
 * next tick goes on where it stopped. Five thousand stops in flight, each
 * polling on a timer of its own, read /proc or cgroup.events five thousand
 * times a tick and starve the loop that would deliver their processes'
 * exits (every stop then waited longer, and so polled more); paced, they
 * take a bounded share of the loop, and a check's period grows with the
 * number waiting instead. `done` settles once check() returns true (rejects
 * if it throws); cancel() withdraws it. A check that is never done (one
 * that acts, then returns false) runs until cancelled.
 */
export function paced(check: () => boolean): { done: Promise<void>; cancel: () => void } {
  let entry: PacedCheck | undefined;
  const done = new Promise<void>((resolve, reject) => {
    entry = { check, resolve, reject };
  });
  const e = entry as PacedCheck;
  pacedChecks.add(e);
  paceTimer ??= setInterval(paceTick, PACE_TICK_MS);
  return { done, cancel: () => withdraw(e) };
}

function withdraw(e: PacedCheck): void {
  e.withdrawn = true;
  pacedChecks.delete(e);
  if (pacedChecks.size === 0 && paceTimer) {
    clearInterval(paceTimer);
    paceTimer = undefined;
  }
}

function paceTick(): void {
  const stop = performance.now() + PACE_BUDGET_MS;
  // Each check at most once a tick: the ones that go on waiting are put back at the end.
  let ran = 0;
  for (let left = pacedChecks.size; left > 0 && (ran === 0 || performance.now() < stop); left--) {
    const e = pacedChecks.values().next().value;
    if (!e) break;
    ran++;
    pacedChecks.delete(e);
    let ok: boolean;
    try {
      ok = e.check();
    } catch (err) {
      withdraw(e);
      e.reject(err);
      continue;
    }
    if (ok) {
      withdraw(e);
      e.resolve();
    } else if (!e.withdrawn) {
      // Taken out for its turn, it may have seen the last other check withdrawn, and the timer with it.
      pacedChecks.add(e);
      paceTimer ??= setInterval(paceTick, PACE_TICK_MS);
    }
  }
}

/**
 * Waits (paced) until check() returns true, at most ms. After the bound the
 * check is made once more, fresh: a deadline measured on a busy loop must
 * not report as still true what has become false meanwhile. true: the check
 * held.
 */
export async function pacedUntil(check: () => boolean, ms: number, signal?: AbortSignal): Promise<boolean> {
  if (check()) return true;
  const p = paced(check);
  try {
    return (await within(p.done, ms, signal)) !== TIMED_OUT || check();
  } finally {
    p.cancel();
  }
}
