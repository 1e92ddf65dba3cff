/**
 * The readiness step of a launch attempt, once confirmed: sd_notify, a unix
 * socket (and its probe) or a check of the caller's, each raced against the
 * target's exit so a process that dies is reported at once, not at the
 * ready deadline.
 */
import { connect } from 'node:net';
import { backend } from '../backend/index.js';
import { ReadyTimeoutError } from '../errors.js';
import type { ProcessHandle } from '../process/handle.js';
import { isNoProcess } from '../process/identity.js';
import { backoff, TIMED_OUT, within } from '../timing.js';
import type { ProcessIdentity } from '../types.js';
import { callHook } from './hooks.js';
import {
  type Attempt,
  confirmedIdentity,
  confirmedTarget,
  type Instance,
  type ReadySpec,
  type SocketReady,
  targetExitedError,
} from './launch.js';

/**
 * Waits until ready, failing the moment the process exits (with its status
 * and stderr tail). Bounded by timeoutMs and the abort signal; whatever is
 * still polling or probing is told to stop when the wait ends.
 */
export async function waitReady(
  a: Attempt,
  instance: Instance,
  ready: ReadySpec,
  timeoutMs: number,
  signal?: AbortSignal,
): Promise<void> {
  if (ready === 'notify') {
    if (!a.notify) throw new Error(`launch of ${a.id}: ready 'notify' without its socket`);
    await a.notify.wait(timeoutMs, signal);
    return;
  }
  const target = confirmedTarget(a);
  const over = new AbortController();
  const probeFailure: { last?: unknown } = {};
  const died = target.gone.then(() => 'died' as const);
  const check =
    typeof ready === 'function'
      ? callHook(ready, instance).then(() => 'ready' as const)
      : pollSocket(ready, target, confirmedIdentity(a), probeFailure, over.signal);
  try {
    const r = await within(Promise.race([check, died]), timeoutMs, signal);
    if (r === TIMED_OUT) {
      const last = probeFailure.last as Error | undefined;
      const detail =
        typeof ready === 'function'
          ? 'the ready check did not resolve'
          : 'last' in probeFailure
            ? `the probe of ${ready.socket} never succeeded: ${last?.message ?? String(last)}`
            : `nothing accepted on ${ready.socket}`;
      const cause = 'last' in probeFailure ? { cause: probeFailure.last } : undefined;
      throw new ReadyTimeoutError(a.id, timeoutMs, detail, cause);
    }
    if (r === 'died') {
      throw await targetExitedError(a, target, signal);
    }
  } finally {
    over.abort();
  }
}

/**
 * Whether the confirmed process still runs: not seen to exit, not a zombie,
 * and the pid still its own (same start). Read now, not when the exit
 * watcher next runs: a connect can succeed on a socket whose owner just died.
 */
function stillRunning(target: ProcessHandle, identity: ProcessIdentity): boolean {
  if (target.hasExited) return false;
  try {
    const raw = backend.inspect(target.pid);
    return raw.state !== 'Z' && raw.startTicks === identity.startTicks;
  } catch (err) {
    return !isNoProcess(err);
  }
}

/**
 * Connects until the socket accepts while the process still runs, then
 * probes, if there is a probe, until it resolves. Never resolves when the
 * process is gone: the exit wins the race in waitReady.
 */
async function pollSocket(
  ready: SocketReady,
  target: ProcessHandle,
  identity: ProcessIdentity,
  failure: { last?: unknown },
  signal: AbortSignal,
): Promise<'ready'> {
  const never = new Promise<never>(() => {});
  for await (const _ of backoff({ maxMs: 50, signal })) {
    if (!stillRunning(target, identity)) return never;
    if (await connects(ready.socket)) {
      // The wait may have ended while the connect was in flight: a probe
      // called now would run after the timeout was reported, against a
      // process being abandoned, and its failure would be lost.
      if (signal.aborted || !stillRunning(target, identity)) return never;
      if (!ready.probe) return 'ready';
      try {
        await callHook(ready.probe, ready.socket, signal);
        if (!stillRunning(target, identity)) return never;
        return 'ready';
      } catch (err) {
        if (signal.aborted) return never;
        failure.last = err;
      }
    }
  }
  return never;
}

function connects(path: string): Promise<boolean> {
  return new Promise<boolean>((resolve) => {
    const s = connect({ path });
    s.once('connect', () => {
      s.destroy();
      resolve(true);
    });
    s.once('error', () => {
      s.destroy();
      resolve(false);
    });
  });
}
