/**
 * terminate(): TERM, a bounded wait, KILL, a bounded wait, proven gone. A
 * process that is already gone is success. Signals go only through the
 * handle's pin, so they reach the proven process or nobody.
 */
import { AbortError, InvalidArgError, StopTimeoutError } from './errors.js';
import { ProcessHandle } from './handle.js';
import { signalNumber } from './signals.js';
import { TIMED_OUT, within } from './timing.js';
import type { ExitStatus } from './types.js';
import { assertDuration, assertSignallable } from './validate.js';

export interface TerminateOptions {
  /** The polite signal. Default SIGTERM. */
  termSignal?: NodeJS.Signals | number;
  /** How long to wait after termSignal before escalating. Default 2000 ms. */
  graceMs?: number;
  /** The signal that cannot be ignored. Default SIGKILL. */
  killSignal?: NodeJS.Signals | number;
  /** How long to wait after killSignal for the exit to be seen. Default 5000 ms. */
  killWaitMs?: number;
  /** The caller's cancellation: rejects with an AbortError; signals already sent stay sent. */
  signal?: AbortSignal;
  /** Called when escalating to killSignal, before it is sent: a warning worth surfacing. */
  onEscalate?: (info: { pid: number; graceMs: number }) => void;
}

export interface TerminateResult {
  outcome: 'exited' | 'already-gone';
  /** killSignal had to be sent. */
  escalated: boolean;
  code: number | null;
  signal: NodeJS.Signals | null;
}

/** Validates a terminate call (before any signal) and fills in the defaults. */
export function terminateParams(handle: unknown, options: TerminateOptions, what: string) {
  if (!(handle instanceof ProcessHandle)) throw new InvalidArgError(`${what}() needs a ProcessHandle (from open() or spawn())`);
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

export async function terminate(handle: ProcessHandle, options: TerminateOptions = {}): Promise<TerminateResult> {
  const { termSignal, killSignal, graceMs, killWaitMs } = terminateParams(handle, options, 'terminate');
  const abort = options.signal;
  if (abort?.aborted) throw new AbortError(abort.reason);

  const done = (outcome: TerminateResult['outcome'], escalated: boolean, status: ExitStatus): TerminateResult => ({
    outcome,
    escalated,
    code: status.code,
    signal: status.signal,
  });

  // Decisions wait for the exit to be seen (`gone`); the status may come a
  // little later, once a non-child's parent has reaped it.
  const statusOf = async (): Promise<ExitStatus> => {
    const st = handle.exitStatus ?? (await within(handle.exited, STATUS_WAIT_MS));
    return st === TIMED_OUT ? { code: null, signal: null } : st;
  };
  if (!handle.signal(termSignal)) return done('already-gone', false, await statusOf());
  if ((await within(handle.gone, graceMs, abort)) !== TIMED_OUT) return done('exited', false, await statusOf());

  options.onEscalate?.({ pid: handle.pid, graceMs });
  const sent = handle.signal(killSignal);
  if ((await within(handle.gone, killWaitMs, abort)) === TIMED_OUT) {
    if (!handle.isAlive()) return done(sent ? 'exited' : 'already-gone', sent, { code: null, signal: null });
    throw new StopTimeoutError(handle.pid, killWaitMs);
  }
  return done('exited', sent, await statusOf());
}

/** How long to wait, once an exit is seen, for its status (a non-child's parent reaping it). */
const STATUS_WAIT_MS = 1500;
