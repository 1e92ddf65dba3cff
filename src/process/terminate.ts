/**
 * terminate(): TERM, a bounded wait, KILL, a bounded wait, proven gone. A
 * process that is already gone is success. Signals go only through the
 * handle's pin, so they reach the proven process or nobody.
 *
 * It returns the moment the exit is seen: the status is what the kernel has
 * by then (a non-child's exists only once its own parent reaps it, and an
 * init that reaps slowly would otherwise add its delay to every stop).
 */
import { backend } from '../backend/index.js';
import { AbortError, InvalidArgError, StopTimeoutError } from '../errors.js';
import { exitStatusWithin, ProcessHandle } from './handle.js';
import { signalNumber, UNKNOWN_EXIT } from './signals.js';
import { TIMED_OUT, within } from '../timing.js';
import type { StopResult } from '../types.js';
import { assertDuration, assertSignallable } from '../validate.js';

// StopResult is declared with the other shared result types: events.ts names
// it too, and importing it from here tied the event vocabulary to the
// signalling code (an import cycle). Re-exported for the public API.
export type { StopResult };

/** Options of `terminate()` and `terminateTree()`. */
export interface TerminateOptions {
  /** The polite signal. Default SIGTERM. */
  termSignal?: NodeJS.Signals | number;
  /** How long to wait after termSignal before escalating. Default 2000 ms. */
  graceMs?: number;
  /** The signal that cannot be ignored. Default SIGKILL. */
  killSignal?: NodeJS.Signals | number;
  /** How long to wait after killSignal for the exit to be seen. Default 5000 ms. */
  killWaitMs?: number;
  /**
   * The caller's cancellation. Already aborted: an AbortError, nothing sent.
   * Aborted midway: "force it now": killSignal, a wait of up to killWaitMs for
   * the exit, then the AbortError (StopTimeoutError if it outlives even that),
   * so an abort never leaves a process half-stopped.
   */
  signal?: AbortSignal;
  /** Called when escalating to killSignal, before it is sent: a warning worth surfacing. */
  onEscalate?: (info: { pid: number; graceMs: number }) => void;
}

/** @deprecated Renamed StopResult, which stop() returns too; this alias goes in the next minor version. */
export type TerminateResult = StopResult;

/**
 * The result of ending a process by some means other than terminate() (a tree, a cgroup): 'exited' when it
 * was alive before, with the status it ended with (waited for at most 50 ms, else unknown).
 */
export async function endedResult(handle: ProcessHandle, wasAlive: boolean, escalated: boolean): Promise<StopResult> {
  const status = await exitStatusWithin(handle, 50);
  return { outcome: wasAlive ? 'exited' : 'already-gone', escalated, code: status.code, signal: status.signal };
}

/** How long an exit a fresh read has shown is waited for, to be heard (with its status) by a busy loop. */
const EXIT_HEARD_MS = 1000;

/**
 * Whether the process runs now, read fresh: not from the exit watch, which
 * a busy event loop may not have heard yet. A zombie has ended (it waits
 * only to be reaped, and no signal reaches it). What a deadline's verdict
 * rests on: a stop that ran out of time on a starved loop must not report
 * a process alive that has exited meanwhile.
 */
export function stillRuns(h: ProcessHandle): boolean {
  if (h.hasExited) return false;
  const st = backend.stat(h.pid);
  // Alive (zombie or not) after the read, under the pin: the stat was this process's, not a later owner's.
  if (!h.isAlive()) return false;
  return st !== null && st.state !== 'Z' && st.state !== 'X';
}

/** Validates a terminate call (before any signal) and fills in the defaults. */
export function terminateParams(handle: unknown, options: TerminateOptions, what: string) {
  if (!(handle instanceof ProcessHandle))
    throw new InvalidArgError(`${what}() needs a ProcessHandle (from open() or spawn())`);
  assertSignallable(handle.pid);
  const params = {
    termSignal: signalNumber(options.termSignal ?? 'SIGTERM'),
    killSignal: signalNumber(options.killSignal ?? 'SIGKILL'),
    graceMs: options.graceMs ?? 2000,
    killWaitMs: options.killWaitMs ?? 5000,
  };
  assertDuration(params.graceMs, 'graceMs');
  assertDuration(params.killWaitMs, 'killWaitMs');
  return params;
}

/** Ends one process: `termSignal` (SIGTERM), a bounded wait (`graceMs`), then `killSignal` (SIGKILL) and a wait bounded by `killWaitMs` until it is proven gone. A process already gone is success (`already-gone`). Refuses pid 1 and the caller itself. */
export async function terminate(handle: ProcessHandle, options: TerminateOptions = {}): Promise<StopResult> {
  const { termSignal, killSignal, graceMs, killWaitMs } = terminateParams(handle, options, 'terminate');
  const abort = options.signal;
  if (abort?.aborted) throw new AbortError(abort.reason);

  // Decisions wait for the exit to be seen (`gone`), never for its status.
  const done = (outcome: StopResult['outcome'], escalated: boolean): StopResult => {
    const status = handle.exitStatus ?? UNKNOWN_EXIT;
    return { outcome, escalated, code: status.code, signal: status.signal };
  };
  const goneWithin = async (ms: number) => {
    try {
      return (await within(handle.gone, ms, abort)) !== TIMED_OUT;
    } catch (err) {
      if (err instanceof AbortError) await forceEnd(handle, { killSignal, killWaitMs });
      throw err;
    }
  };
  if (!handle.signal(termSignal)) return done('already-gone', false);
  if (await goneWithin(graceMs)) return done('exited', false);
  // Past the grace, a process that has ended but whose exit this busy loop has not heard yet is no escalation:
  // its exit (and status) is waited for, as a KILL's would be.
  if (!stillRuns(handle)) {
    await goneWithin(EXIT_HEARD_MS);
    return done('exited', false);
  }

  options.onEscalate?.({ pid: handle.pid, graceMs });
  const sent = handle.signal(killSignal);
  if (!(await goneWithin(killWaitMs))) {
    if (!stillRuns(handle)) {
      await goneWithin(EXIT_HEARD_MS);
      return done(sent ? 'exited' : 'already-gone', sent);
    }
    throw new StopTimeoutError(handle.pid, killWaitMs);
  }
  return done('exited', sent);
}

/**
 * Ends a process now: killSignal (SIGKILL by default), then up to killWaitMs
 * (5000) for the exit to be seen. Resolves once it is gone; throws
 * StopTimeoutError if it is still alive at the bound. What an abort midway
 * through a stop turns into.
 */
export async function forceEnd(
  handle: ProcessHandle,
  options: { killSignal?: NodeJS.Signals | number; killWaitMs?: number } = {},
): Promise<void> {
  const killWaitMs = options.killWaitMs ?? 5000;
  handle.signal(signalNumber(options.killSignal ?? 'SIGKILL'));
  if ((await within(handle.gone, killWaitMs)) === TIMED_OUT && stillRuns(handle)) {
    throw new StopTimeoutError(handle.pid, killWaitMs);
  }
}
