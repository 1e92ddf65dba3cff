/**
 * The life of a tracked instance, as one state machine: the table of
 * instances a supervisor holds, the record each state carries, and every
 * legal move between states. Each record carries only what exists in its
 * state; a move replaces the record, and whoever holds an old one (an exit
 * watcher, a stop in flight) finds out by comparing it with the table's. An
 * illegal move is a bug in custody: it throws, it is never papered over.
 *
 * Moves that signal, remove or relaunch are written (fsync'd) to the state
 * dir before they are acted on: a stop writes the `stopping` manifest before
 * its first signal (persistStopping), so a stop that fails halfway, or a
 * crash in its middle, leaves a record that the next stop() or recovery
 * finishes, never one that says `running` of a half-ended instance or
 * nothing at all. `deferred` and the other-namespace quarantine exist in
 * memory only: they never rewrite a manifest.
 *
 * Only what stop, list, the reaper and recovery's questions need is kept,
 * not the manifest (it is on disk): a supervisor may hold thousands.
 */
import type { InstanceCgroup } from '../process/cgroup.js';
import { resultOf } from '../process/exit.js';
import type { ProcessHandle } from '../process/handle.js';
import type { InstanceStatus, InstanceStopResult, InstanceSummary } from '../options.js';
import { IncompleteInstanceError, type Manifest, type StoppingManifest } from '../state/manifest.js';
import type { LogFiles } from '../state/logs.js';
import type { StateStore } from '../state/store.js';
import type { AfterExitEnd, ExitResult, ExitStatus, LastExit } from '../types.js';
import type { Instance, LaunchSpec } from './launch.js';
import type { RestartBudget, RestartPolicy } from './restart-policy.js';

/** A spec's afterExit hook, with its timeout settled. */
export interface AfterExitHook {
  run: (end: AfterExitEnd) => unknown;
  timeoutMs: number;
}

/** The afterExit hook of a spec, where it has one. */
export function afterExitOf(spec: LaunchSpec | null | undefined): AfterExitHook | undefined {
  return spec?.afterExit ? { run: spec.afterExit, timeoutMs: spec.afterExitTimeoutMs ?? 10_000 } : undefined;
}

/** How a run's end leaves an instance with a restart policy: waiting for its restart, or given up. */
export type Rest = { kind: 'backoff'; delayMs: number } | { kind: 'failed' };

/**
 * What outlives one run of an instance with a restart policy: the spec it is
 * launched from again, the budget it has used, and the Instance the agent
 * holds, whose pid, token, identity and cgroup follow the current run and
 * whose `exited` settles once, at stop() or when it gives up.
 */
export interface Life {
  /** null where a recovered instance had no spec in open({ specs }): it waits for launch(). */
  spec: LaunchSpec | null;
  policy: RestartPolicy;
  budget: RestartBudget;
  /** The Instance handed out; null until a run of it is tracked in this supervisor. */
  view: Instance | null;
  /** When the current run was recorded running (ms since the epoch); 0 where it is not known. */
  runningSince: number;
  lastExit: LastExit | null;
  /** Settles `view.exited` (and `exited` before there is a view). */
  settle: (s: ExitStatus) => void;
  /** Holds the event loop while someone waits on it, from run to run, until it settles or letGo(). */
  exited: Promise<ExitStatus>;
  /** Stops `exited` holding the loop without settling it (the supervisor closes; the instance runs on). */
  letGo: () => void;
  /** A restart's launch is in flight: its failure is one more end, not the caller's error. */
  relaunching: boolean;
  /** What such a failed launch left the instance as, for the restart to move it there once the launch is over. */
  pending?: Rest | null;
}

/** A process custody pinned, confirmed and recorded. */
export interface Pinned {
  /** The record launch() returned (and get() returns); its id is the table's key. */
  instance: Instance;
  handle: ProcessHandle;
  cgroup: InstanceCgroup | null;
  /** The session custody created for it, while the target is in it (the manifest's `session`). */
  session: number | null;
  /** Declared paths, removed once it is proven gone. */
  paths: readonly string[];
  /** Its restart policy's life, where it has one. */
  life?: Life;
  /** Its afterExit hook, where it has one. */
  afterExit?: AfterExitHook;
}

/** A launch in flight: its attempts own the id until it runs or is undone. */
export interface Starting {
  status: 'starting';
  /** A restart's launch (or launch() of an id in backoff): the life whose Instance it updates. */
  life?: Life;
}

/** Ended, every process of it proven gone; its restart is due at `dueAt` (or waits for launch(): `no-spec`). */
export interface Backoff {
  status: 'backoff';
  life: Life;
  /** ms since the epoch; null while it waits for launch(). */
  dueAt: number | null;
  timer: NodeJS.Timeout | null;
}

/** Ended more often than its limit allows: kept, with its last end, until launch() or remove(). */
export interface Failed {
  status: 'failed';
  life: Life;
}

/**
 * Ended while no supervisor ran (or during its afterExit), and the hook it owes has no spec to run from: its
 * state waits, shown as `exited` (reason `no-spec`), until launch() (which runs the hook from its spec) or
 * remove().
 */
export interface Owed {
  status: 'owed';
  end: AfterExitEnd;
}

export interface Running extends Pinned {
  status: 'running';
  /** What its main process left in its session when it exited on its own, ended by its cleanup. */
  leftovers?: ProcessHandle[];
  /** Its instance logs, whose tails its exit event carries; null where its output was not logged. */
  logFiles: LogFiles | null;
  /** Custody told it to end (the watchdog's SIGABRT): its exit then says this, whatever its status. */
  endedBy?: ExitResult;
}

/** Its main process exited on its own; what it left (its cgroup's leftovers, its state) is being cleaned up. */
export interface Exited extends Pinned {
  status: 'exited';
  exit: ExitStatus;
  cleanup: Promise<void>;
}

/**
 * Being stopped, or a stop (or an exited instance's cleanup) that failed once
 * it had begun: the next stop() finishes it. Never back to running once
 * `persisted`: something may have been signalled.
 */
export interface Stopping {
  status: 'stopping';
  /** What it was when the stop began (its pin, its exit if it had exited). */
  from: Running | Exited;
  /** The `stopping` manifest is written: from here on the stop is finished, never undone. */
  persisted: boolean;
  /** The stop in flight; null once one failed, until the next stop() resumes it. */
  done: Promise<InstanceStopResult> | null;
  /** The last stop failed halfway: list() says `stopping`, where a first stop in flight shows what it stops. */
  failed: Error | null;
  /**
   * Members pinned before the first signal (a few of the main's children), kept across a failed stop: after the
   * main is gone they are what proves its session, and the next stop() ends what is left of them.
   */
  members: ProcessHandle[];
}

export interface Quarantined {
  status: 'quarantined';
  /** null for a manifest that could not be read. */
  manifest: Manifest | null;
  reason: string;
  field?: string;
}

/** Recovery (or a failed abandon) could not decide it now. */
export interface Deferred {
  status: 'deferred';
  error: Error;
}

export type Tracked = Starting | Running | Exited | Stopping | Quarantined | Deferred | Backoff | Failed | Owed;

/** The restart policy's life an entry belongs to, where it has one (a stop in flight: that of what it stops). */
export function lifeOf(t: Tracked): Life | undefined {
  if (t.status === 'stopping') return t.from.life;
  return 'life' in t ? t.life : undefined;
}
export type TrackedStatus = Tracked['status'];
/** Not in the table: never launched, or proven gone and forgotten. */
export type Untracked = 'untracked';

/**
 * Every legal move, by the state it leaves. Later states (a restart's
 * backoff, work after an exit) are new rows here and new records above.
 */
export const MOVES: { readonly [S in TrackedStatus | Untracked]: readonly (TrackedStatus | Untracked)[] } = {
  // launch(); recovery's adopt, quarantine, deferral; a backoff or failed manifest recovered, or a restart's
  // launch that failed (its end is counted).
  untracked: ['starting', 'running', 'quarantined', 'deferred', 'backoff', 'failed', 'owed'],
  // Confirmed and recorded; an abandon that could not prove the attempt undone; one that left a process
  // running it would not signal (abandon-left); undone.
  starting: ['running', 'deferred', 'quarantined', 'untracked'],
  // Exited on its own; a stop began.
  running: ['exited', 'stopping'],
  // Stopped (joins its cleanup), its cleanup failed halfway, remove(), a relaunch; cleaned up, its policy
  // restarts it or gives up.
  exited: ['stopping', 'untracked', 'backoff', 'failed'],
  // A stop resumed or failed; proven gone; a stop that had not begun (nothing persisted, nothing signalled);
  // custody's own stop (health, watchdog) done, its policy restarts it or gives up.
  stopping: ['stopping', 'untracked', 'running', 'exited', 'backoff', 'failed'],
  // release().
  quarantined: ['untracked'],
  // A later recover() decided it, or its state is gone.
  deferred: ['running', 'quarantined', 'deferred', 'untracked', 'backoff', 'failed', 'owed'],
  // Its restart is launched (a launch() of the id carries the budget on); stop() or remove().
  backoff: ['untracked'],
  // launch() starts it afresh; remove().
  failed: ['untracked'],
  // launch() (its hook run first), remove().
  owed: ['untracked'],
};

/** Whether `from` may become `to`: its row in MOVES, and a stop that has begun is never undone. */
export function isLegalMove(from: Tracked | undefined, to: Tracked | undefined): boolean {
  const a: TrackedStatus | Untracked = from?.status ?? 'untracked';
  const b: TrackedStatus | Untracked = to?.status ?? 'untracked';
  if (!MOVES[a].includes(b)) return false;
  if (from?.status === 'stopping' && (b === 'running' || b === 'exited')) return !from.persisted && to === from.from;
  return true;
}

export class IllegalMoveError extends Error {
  constructor(id: string, from: Tracked | undefined, to: Tracked | undefined) {
    super(`internal: instance ${id} cannot move from ${from?.status ?? 'untracked'} to ${to?.status ?? 'untracked'}`);
    this.name = 'IllegalMoveError';
  }
}

/** The table of a supervisor's instances; every change of one is a checked move. */
export class InstanceTable {
  readonly #records = new Map<string, Tracked>();

  get(id: string): Tracked | undefined {
    return this.#records.get(id);
  }

  has(id: string): boolean {
    return this.#records.has(id);
  }

  entries(): IterableIterator<[string, Tracked]> {
    return this.#records.entries();
  }

  values(): IterableIterator<Tracked> {
    return this.#records.values();
  }

  keys(): IterableIterator<string> {
    return this.#records.keys();
  }

  /** Moves `id` to `to` (undefined: forgets it); throws IllegalMoveError where its state has no such move. */
  move(id: string, to: Tracked | undefined): void {
    const from = this.#records.get(id);
    if (!isLegalMove(from, to)) throw new IllegalMoveError(id, from, to);
    if (to) this.#records.set(id, to);
    else this.#records.delete(id);
  }

  /**
   * Moves `id` only while its record is still `from` (a watcher or a stop that
   * held it may have been overtaken); returns whether it did.
   */
  moveFrom(id: string, from: Tracked, to: Tracked | undefined): boolean {
    if (this.#records.get(id) !== from) return false;
    this.move(id, to);
    return true;
  }

  /** Every pinned record, stopping or not. */
  pinned(): Array<Running | Exited> {
    return [...this.#records.values()].flatMap((t) => pinnedOf(t) ?? []);
  }
}

/** The pinned process of a record, stopping or not; null where there is none. */
export function pinnedOf(t: Tracked): Running | Exited | null {
  if (t.status === 'stopping') return t.from;
  return t.status === 'running' || t.status === 'exited' ? t : null;
}

/** The status list() shows: a first stop in flight shows what it stops; one that failed halfway shows `stopping`. */
export function shownStatus(t: Tracked): InstanceStatus {
  if (t.status === 'owed') return 'exited';
  if (t.status !== 'stopping') return t.status;
  return t.failed ? 'stopping' : t.from.status;
}

/**
 * Writes the `stopping` manifest, fsync'd, before a stop's (or a cleanup's)
 * first signal. false where there is no manifest left to rewrite (an exited
 * instance whose cleanup already removed it): nothing is left to stop then.
 */
export async function persistStopping(store: StateStore, id: string, why: ExitResult): Promise<boolean> {
  let m: Manifest;
  try {
    m = store.read(id);
  } catch (err) {
    // No instance dir, or one without a manifest: its state is already gone.
    const cause = (err as { cause?: NodeJS.ErrnoException }).cause;
    if (err instanceof IncompleteInstanceError || cause?.code === 'ENOENT') return false;
    throw err;
  }
  if (m.state === 'stopping') return true;
  // Its run ended and was cleaned up meanwhile (its policy restarts it): nothing of it is left to signal.
  if (m.state === 'backoff' || m.state === 'failed') return false;
  if (!m.identity) throw new Error(`internal: ${id} is stopped without a recorded identity`);
  const now = new Date().toISOString();
  const stopping: StoppingManifest = {
    ...m,
    state: 'stopping',
    identity: m.identity,
    quarantine: null,
    stoppingSince: now,
    stoppingFor: why,
    updatedAt: now,
  };
  await store.write(stopping, { sync: true });
  return true;
}

/** What list() says of one record. `liveParent` reads the current parent of a running main. */
export function describeTracked(
  id: string,
  t: Tracked,
  liveParent: (pid: number, startTicks: number | undefined) => number | null,
): InstanceSummary {
  const status = shownStatus(t);
  if (t.status === 'quarantined') {
    const out: InstanceSummary = { id, status, pid: t.manifest?.identity?.pid ?? null, ppid: null, reason: t.reason };
    if (t.field !== undefined) out.field = t.field;
    return out;
  }
  if (t.status === 'deferred') {
    const out: InstanceSummary = { id, status, pid: null, ppid: null };
    const reason = (t.error as NodeJS.ErrnoException).code;
    if (reason !== undefined) out.reason = reason;
    return out;
  }
  if (t.status === 'owed') {
    const { pid, code, signal, result } = t.end;
    return { id, status, pid, ppid: null, reason: 'no-spec', exit: { code, signal, result } };
  }
  if (t.status === 'backoff' || t.status === 'failed') {
    const { life } = t;
    const out: InstanceSummary = { id, status, pid: null, ppid: null, restarts: life.budget.restarts };
    if (life.lastExit) out.exit = life.lastExit;
    if (t.status === 'backoff' && t.dueAt === null) out.reason = 'no-spec';
    return out;
  }
  if (t.status === 'stopping' && t.failed) {
    const out: InstanceSummary = { id, status, pid: t.from.handle.pid, ppid: null };
    const reason = (t.failed as NodeJS.ErrnoException).code;
    if (reason !== undefined) out.reason = reason;
    if (t.from.cgroup) out.cgroup = t.from.cgroup.path;
    return out;
  }
  const p = pinnedOf(t);
  if (!p) return { id, status, pid: null, ppid: null };
  const { handle, instance } = p;
  // identity.ppid is the parent at launch; a daemon's changes when its launcher exits.
  const ppid =
    p.status === 'running' && !handle.hasExited ? liveParent(handle.pid, instance.identity.startTicks) : null;
  const out: InstanceSummary = { id, status, pid: handle.pid, ppid };
  if (p.status === 'exited') out.exit = p.instance.lastExit ?? { ...p.exit, result: resultOf(p.exit) };
  if (p.cgroup) out.cgroup = p.cgroup.path;
  if (p.life) out.restarts = p.life.budget.restarts;
  return out;
}
