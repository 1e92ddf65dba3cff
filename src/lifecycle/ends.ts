/**
 * What becomes of an instance's state once a run of it is proven gone (every
 * process ended, its cgroup removed): it is removed, or, where its restart
 * policy restarts it, rewritten in place as `backoff` (or `failed`, past its
 * limit) with the budget it has used, fsync'd before the restart is armed.
 * Rewritten, never removed and written again: a crash in between would lose
 * the restart and the budget. The one place that decides it, for the ends
 * seen live (an exit's cleanup, a stop, a restart's launch that failed) and
 * those recovery finds (a process gone while no supervisor ran).
 */
import { holdsLoop } from '../options.js';
import { awaitedSettle } from '../process/awaited.js';
import type {
  BackoffManifest,
  FailedManifest,
  Manifest,
  ManifestRestart,
  StoppingManifest,
} from '../state/manifest.js';
import { TIMED_OUT, within } from '../timing.js';
import type { AfterExitEnd, LastExit } from '../types.js';
import { callHook } from './hooks.js';
import type { LifecycleHost } from './host.js';
import type { AfterExitHook, Backoff, Failed, Life, Rest, Tracked } from './instances.js';
import type { Instance, LaunchSpec } from './launch.js';
import { FRESH_BUDGET, nextStep, type RestartPolicy, restartPolicy, restartsAfter } from './restart-policy.js';

/** A life for a launch() of `spec`; one it had in backoff carries its budget and its Instance on. */
export function newLife(spec: LaunchSpec, carried?: Life): Life | undefined {
  const policy = restartPolicy(spec.restart);
  if (!policy) return undefined;
  if (carried) return Object.assign(carried, { spec, policy, relaunching: false });
  return makeLife(spec, policy);
}

function makeLife(spec: LaunchSpec | null, policy: RestartPolicy): Life {
  const { promise: exited, settle, letGo } = awaitedSettle();
  return {
    spec,
    policy,
    budget: FRESH_BUDGET,
    view: null,
    runningSince: 0,
    lastExit: null,
    settle,
    exited,
    letGo,
    relaunching: false,
  };
}

/**
 * The life a manifest records, for a supervisor that recovers it: the recorded policy governs this end; the
 * spec handed back (without one: none, it waits for launch()) governs the runs that follow.
 */
export function recordedLife(r: ManifestRestart, spec: LaunchSpec | null): Life {
  const life = makeLife(spec, r.policy);
  life.budget = { restarts: r.restarts, streak: r.streak, ends: r.ends };
  life.lastExit = r.lastExit;
  return life;
}

/** What a manifest records of a life. */
export function restartRecord(life: Life): ManifestRestart {
  return { policy: life.policy, ...life.budget, lastExit: life.lastExit };
}

/** Ties an Instance to its life: the view the agent holds, whose `exited` settles once, for good. */
export function viewOf(life: Life, fresh: Instance): Instance {
  life.runningSince = Date.now();
  if (!life.view) {
    life.view = Object.assign(fresh, { exited: life.exited, restarts: life.budget.restarts });
    return life.view;
  }
  const { pid, token, identity, cgroup } = fresh;
  return Object.assign(life.view, { pid, token, identity, cgroup, restarts: life.budget.restarts });
}

/** The instance has ended for good: its Instance's `exited` settles. */
export function finish(life: Life, end: LastExit): void {
  life.lastExit = end;
  if (life.view) life.view.lastExit = end;
  const { code, signal } = end;
  life.settle(end.coreDumped ? { code, signal, coreDumped: true } : { code, signal });
}

/** The run that ended: whose, and what its end owes. */
export interface RunEnd {
  id: string;
  life?: Life | undefined;
  afterExit?: AfterExitHook | undefined;
  /** Its main process; null where a launch attempt ended before it had one. */
  pid: number | null;
  token: string;
}

/**
 * The state of a run proven gone: its afterExit hook (recorded as owed first), then the state removed, or
 * (its policy restarts it) rewritten as backoff or failed. `restart` false: an end stop() made, whatever the
 * status it saw. `count` false: an end that is not one (a restart's launch undone because the supervisor
 * closes) keeps the budget and restarts at the next open.
 */
export async function settleEnd(
  host: LifecycleHost,
  run: RunEnd,
  end: LastExit,
  { restart = true, count = true }: { restart?: boolean; count?: boolean } = {},
): Promise<Rest | null> {
  const { id, life } = run;
  let after: Rest | null = null;
  if (life && restart && restartsAfter(life.policy, end)) {
    const now = Date.now();
    const ran = life.runningSince ? now - life.runningSince : 0;
    const step = count
      ? nextStep(life.policy, life.budget, now, ran)
      : { giveUp: false, delayMs: 0, budget: life.budget };
    life.budget = step.budget;
    // The Instance the agent holds counts a restart once scheduled, as list() does, whether or not its launch runs.
    if (life.view) life.view.restarts = life.budget.restarts;
    after = step.giveUp ? { kind: 'failed' } : { kind: 'backoff', delayMs: step.delayMs };
  }
  if (run.afterExit) await runAfterExit(host, run, run.afterExit, end, after?.kind === 'backoff');
  if (!life || !after) {
    await removeState(host, id);
    if (life) finish(life, end);
    return null;
  }
  life.lastExit = end;
  if (life.view) life.view.lastExit = end;
  await writeRest(host, id, life, after, Date.now());
  return after;
}

/**
 * The hook, recorded as owed first (fsync'd: an agent that dies before it returns runs it at recovery), then
 * run within its timeout; a throw or a timeout is a warning, and the end goes on.
 */
async function runAfterExit(
  host: LifecycleHost,
  run: RunEnd,
  hook: AfterExitHook,
  end: LastExit,
  restarting: boolean,
): Promise<void> {
  const { id } = run;
  const owed: AfterExitEnd = {
    id,
    pid: run.pid,
    token: run.token,
    code: end.code,
    signal: end.signal,
    result: end.result,
    restarting,
  };
  try {
    const m = host.store.read(id);
    if (!m.owed) await host.store.write({ ...m, owed, updatedAt: new Date().toISOString() }, { sync: true });
  } catch (err) {
    host.emit('warning', {
      id,
      message: `${id}: could not record its afterExit hook as owed (${(err as Error).message}); it runs now all the same`,
    });
  }
  await runOwed(host, owed, hook);
}

/** Runs an owed hook within its timeout: a throw or a timeout is a warning, and the end goes on. */
export async function runOwed(host: LifecycleHost, owed: AfterExitEnd, hook: AfterExitHook): Promise<void> {
  const { id } = owed;
  try {
    const done = await within(callHook(hook.run, owed), hook.timeoutMs, undefined, true);
    if (done === TIMED_OUT)
      host.emit('warning', {
        id,
        message: `${id}: afterExit did not return within ${hook.timeoutMs} ms; the end goes on`,
      });
  } catch (err) {
    host.emit('warning', { id, message: `${id}: afterExit failed: ${(err as Error).message}` });
  }
}

/** The fields of a stopping or backoff manifest that no other state has. */
const RUN_ONLY: readonly (keyof StoppingManifest | keyof BackoffManifest)[] = [
  'owed',
  'stoppingSince',
  'stoppingFor',
  'restartAt',
  'waiting',
];

/** The backoff or failed manifest, written over the run's own; one that cannot be written is a warning. */
async function writeRest(host: LifecycleHost, id: string, life: Life, rest: Rest, now: number): Promise<void> {
  try {
    const fields: Record<string, unknown> = { ...host.store.read(id) };
    // What only the run's own state had goes with it.
    for (const own of RUN_ONLY) delete fields[own];
    const at = new Date(now).toISOString();
    const common = {
      ...(fields as unknown as Manifest),
      identity: null,
      quarantine: null,
      session: null,
      cgroup: null,
      updatedAt: at,
    };
    const restart = restartRecord(life);
    const m: BackoffManifest | FailedManifest =
      rest.kind === 'failed'
        ? { ...common, state: 'failed', restart }
        : {
            ...common,
            state: 'backoff',
            restart,
            restartAt: new Date(now + rest.delayMs).toISOString(),
            ...(life.spec ? {} : { waiting: 'no-spec' as const }),
          };
    await host.store.write(m, { sync: true });
  } catch (err) {
    host.emit('warning', {
      id,
      message: `${id}: could not record its ${rest.kind} state (${(err as Error).message}); it holds in memory only, and recovery finds its run gone and judges it again`,
    });
  }
}

/**
 * Moves the instance (while its record is still `from`; undefined: untracked) to what settleEnd wrote, and
 * arms the restart; the events say which.
 */
export function rest(host: LifecycleHost, id: string, from: Tracked | undefined, r: Rest, life: Life): void {
  if (host.table.get(id) !== from) return;
  const end = life.lastExit;
  const result = end?.result ?? 'unknown';
  if (r.kind === 'failed') {
    const failed: Failed = { status: 'failed', life };
    host.table.move(id, failed);
    const { count, withinMs } = life.policy.limit;
    host.emit('gave-up', {
      id,
      result,
      restarts: life.budget.restarts,
      message: `${id} ended more than ${count} times within ${withinMs} ms (last: ${result}); it is failed until launch() or remove()`,
    });
    if (end) finish(life, end);
    return;
  }
  const record: Backoff = { status: 'backoff', life, dueAt: null, timer: null };
  host.table.move(id, record);
  arm(host, id, record, r.delayMs);
  const when = life.spec ? `in ${r.delayMs} ms` : 'once launch() gives its spec (no-spec)';
  host.emit('restart', {
    id,
    attempt: life.budget.restarts,
    delayMs: r.delayMs,
    result,
    message: `${id} ended (${result}); restart ${life.budget.restarts} ${when}`,
  });
}

/** Arms a backoff's restart `delayMs` from now, where it has a spec to launch and the supervisor is open. */
export function arm(host: LifecycleHost, id: string, record: Backoff, delayMs: number): void {
  if (!record.life.spec || host.closed) return;
  record.dueAt = Date.now() + delayMs;
  record.timer = setTimeout(() => host.relaunch(id, record), delayMs);
  if (!holdsLoop(host.options)) record.timer.unref();
}

/** Disarms a backoff's pending restart (stop(), remove(), launch(), close()). */
export function disarm(record: Backoff): void {
  if (record.timer) clearTimeout(record.timer);
  record.timer = null;
}

/**
 * State of a process proven gone. A removal that fails (EIO, EROFS) does
 * not undo that proof: a warning, and recovery cleans the manifest later.
 */
export async function removeState(host: LifecycleHost, id: string): Promise<void> {
  try {
    await host.store.remove(id);
  } catch (err) {
    const why = (err as Error).message;
    host.emit('warning', {
      id,
      message: `${id} is gone, but its state could not be removed (recovery will clean it): ${why}`,
    });
  }
}
