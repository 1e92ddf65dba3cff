/**
 * Restarts, and what ends them: the relaunch a backoff's timer makes (a whole
 * launch: new token, confirm, readiness), the cancel that stop() and remove()
 * make of a pending one, and what a supervisor that opens makes of the
 * restart state another left (a backoff or failed manifest, a run that ended
 * while no supervisor ran). ends.ts decides what an end leaves; this module
 * acts on it.
 */
import type { InstanceStopResult } from '../options.js';
import type { BackoffManifest, FailedManifest, Manifest } from '../state/manifest.js';
import type { AfterExitEnd, LastExit } from '../types.js';
import { launchInstance } from './attempt.js';
import { arm, disarm, finish, recordedLife, removeState, rest, runOwed, settleEnd } from './ends.js';
import type { LifecycleHost } from './host.js';
import { afterExitOf, type Backoff, type Failed, type Owed } from './instances.js';
import type { LaunchSpec } from './launch.js';

/** A backoff's restart is due: the instance is launched again from its spec, its budget carried on. */
export function relaunch(host: LifecycleHost, id: string, record: Backoff): void {
  if (host.table.get(id) !== record || host.closed || !record.life.spec) return;
  record.timer = null;
  void host.inFlight(restartNow(host, id, record));
}

async function restartNow(host: LifecycleHost, id: string, record: Backoff): Promise<void> {
  const { life } = record;
  const spec = life.spec as LaunchSpec;
  life.relaunching = true;
  life.pending = null;
  // Until it runs again: a launch that fails ran for no time.
  life.runningSince = 0;
  try {
    // One attempt: each failed one is an end of its own, counted and backed off.
    await launchInstance(host, { ...spec, attempts: 1, signal: undefined }, life);
  } catch (err) {
    const after = life.pending;
    life.pending = null;
    if (after) rest(host, id, undefined, after, life);
    else if (!host.closed)
      // Deferred or quarantined by its abandon: recovery decides it; nothing restarts it meanwhile.
      host.emit('warning', { id, message: `restart of ${id} failed: ${(err as Error).message}` });
  } finally {
    life.relaunching = false;
  }
}

/**
 * stop() or remove() of an instance waiting for its restart, or failed: the pending restart is cancelled, the
 * state removed, its Instance's `exited` settles. Nothing runs, so nothing is signalled.
 */
export async function cancelRest(
  host: LifecycleHost,
  id: string,
  record: Backoff | Failed,
  how: 'stop' | 'remove',
): Promise<InstanceStopResult> {
  if (record.status === 'backoff') disarm(record);
  host.table.moveFrom(id, record, undefined);
  await removeState(host, id);
  const { life } = record;
  const last = life.lastExit;
  const end: LastExit = { code: last?.code ?? null, signal: last?.signal ?? null, result: 'stopped' };
  if (record.status === 'backoff') finish(life, end);
  const result: InstanceStopResult = {
    outcome: 'already-gone',
    escalated: false,
    code: null,
    signal: null,
    result: 'stopped',
  };
  if (how === 'stop') {
    const message = `${record.status === 'backoff' ? 'pending restart cancelled' : 'failed instance'}; state removed, nothing signalled`;
    host.emit('stop', { id, ...result, message });
  }
  return result;
}

/**
 * A backoff or failed manifest found at open, as `adopted` with that status: a backoff with its spec restarts
 * when it was due (at once if that is past); without one it waits for launch() (`no-spec`).
 */
export function adoptResting(host: LifecycleHost, m: BackoffManifest | FailedManifest, spec: LaunchSpec | null): void {
  const life = recordedLife(m.restart, spec);
  if (m.state === 'failed') {
    host.table.move(m.id, { status: 'failed', life });
    return;
  }
  const record: Backoff = { status: 'backoff', life, dueAt: null, timer: null };
  host.table.move(m.id, record);
  arm(host, m.id, record, Math.max(0, Date.parse(m.restartAt) - Date.now()));
}

/**
 * Recovery found a run over (its process gone, or a stop of it finished) whose end is owed more than the
 * removal of its state: an afterExit hook (recorded, or owed from a hook cut off) or a restart policy. Its
 * end, unseen, is settled like any other. `settled`: done (state removed, or backoff or failed); `waiting`: a
 * hook is owed and no spec gives it, so its state waits (no-spec); null: nothing more than the removal.
 */
export async function endedUnseen(
  host: LifecycleHost,
  m: Manifest,
  spec: LaunchSpec | null,
): Promise<'settled' | 'waiting' | null> {
  const owesHook = !!m.owed || !!m.keepAlive?.afterExit;
  if (!m.restart && !owesHook) return null;
  // A status no one saw cannot be known; a stop that was finished says why it began; a hook cut off, the end it had.
  const result = m.state === 'stopping' ? (m.stoppingFor ?? 'stopped') : 'unknown';
  const end: LastExit = m.owed
    ? { code: m.owed.code, signal: m.owed.signal, result: m.owed.result }
    : { code: null, signal: null, result };
  const pid = m.owed ? m.owed.pid : (m.identity?.pid ?? null);
  const hook = afterExitOf(spec);
  if (owesHook && !hook) {
    const owed: AfterExitEnd = m.owed ?? { id: m.id, pid, token: m.token, ...end, restarting: false };
    await host.store.write({ ...m, owed, updatedAt: new Date().toISOString() }, { sync: true });
    host.table.move(m.id, { status: 'owed', end: owed });
    return 'waiting';
  }
  const life = m.restart ? recordedLife(m.restart, spec) : undefined;
  // stop()'s own end never restarts.
  const restart = m.owed ? m.owed.restarting : end.result !== 'stopped';
  const run = { id: m.id, life, afterExit: hook, pid, token: m.token };
  const after = await settleEnd(host, run, end, { restart });
  if (after && life) rest(host, m.id, host.table.get(m.id), after, life);
  return 'settled';
}

/**
 * launch() or remove() of an instance whose afterExit is owed with no spec to run it: launch() runs it from
 * its spec first (and then launches afresh); remove() forgets it without running it, the operator's call.
 */
export async function settleOwed(
  host: LifecycleHost,
  id: string,
  record: Owed,
  spec: LaunchSpec | null,
): Promise<void> {
  const hook = afterExitOf(spec);
  if (hook) await runOwed(host, record.end, hook);
  if (host.table.get(id) !== record) return;
  await removeState(host, id);
  host.table.moveFrom(id, record, undefined);
}
