/**
 * terminate(): TERM, a bounded wait, KILL, a bounded wait, proven gone. A
 * process that is already gone is success. Signals go only through the
 * handle's pin, so they reach the proven process or nobody.
 */
import { InvalidArgError, StopTimeoutError } from './errors.js';
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

export async function terminate(handle: ProcessHandle, options: TerminateOptions = {}): Promise<TerminateResult> {
  if (!(handle instanceof ProcessHandle)) throw new InvalidArgError('terminate() needs a ProcessHandle (from open() or spawn())');
  assertSignallable(handle.pid);
  const termSignal = signalNumber(options.termSignal ?? 'SIGTERM');
  const killSignal = signalNumber(options.killSignal ?? 'SIGKILL');
  const graceMs = options.graceMs ?? 2000;
  const killWaitMs = options.killWaitMs ?? 5000;
  assertDuration(graceMs, 'graceMs');
  assertDuration(killWaitMs, 'killWaitMs');
  const abort = options.signal;
  if (abort?.aborted) await within(Promise.resolve(), 0, abort);

  const done = (outcome: TerminateResult['outcome'], escalated: boolean, status: ExitStatus): TerminateResult => ({
    outcome,
    escalated,
    code: status.code,
    signal: status.signal,
  });

  if (!handle.signal(termSignal)) {
    // Already gone: success. Take the status if it is known or arrives at once.
    const status = handle.exitStatus ?? (await within(handle.exited, 50)) ;
    return done('already-gone', false, status === TIMED_OUT ? { code: null, signal: null } : status);
  }
  let status = await within(handle.exited, graceMs, abort);
  if (status !== TIMED_OUT) return done('exited', false, status);

  options.onEscalate?.({ pid: handle.pid, graceMs });
  const sent = handle.signal(killSignal);
  status = await within(handle.exited, killWaitMs, abort);
  if (status === TIMED_OUT) {
    if (!handle.isAlive()) return done(sent ? 'exited' : 'already-gone', sent, { code: null, signal: null });
    throw new StopTimeoutError(handle.pid, killWaitMs);
  }
  return done('exited', sent, status);
}
