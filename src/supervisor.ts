/**
 * The Supervisor: launch, stop, list, release and close over a state dir,
 * with recovery run once when it opens. One supervisor holds a state dir at
 * a time. It keeps the public methods and the table of instances
 * (src/lifecycle/instances.ts); an instance's launch (lifecycle/attempt.ts),
 * exit (lifecycle/exits.ts) and stop (lifecycle/stop.ts) are delegated.
 */
import { CgroupRoot, validateLimits, type CgroupUsage, InstanceCgroup } from './process/cgroup.js';
import { guardCgroup } from './process/cgroup-guard.js';
import { CustodyError, DeferredError, InvalidArgError, QuarantinedError, UnsupportedError } from './errors.js';
import { emitter, type Emit } from './events.js';
import type { ProcessHandle } from './process/handle.js';
import { InstanceLogs } from './state/logs.js';
import type { Instance, LaunchSpec } from './lifecycle/launch.js';
import type { NotifyChannel } from './lifecycle/notify.js';
import { recover, type RecoveryReport } from './recovery/recover.js';
import { DeferredRetry } from './recovery/retry.js';
import type { InstanceStopResult, InstanceSummary, InstanceStatus, StopOptions, SupervisorOptions } from './options.js';
import { holdsLoop, validateStopOptions, validateSupervisorOptions } from './options.js';
import { assertEntryName, assertId, type Manifest } from './state/manifest.js';
import { StateStore } from './state/store.js';
import { sweep, validateSweep, type SweepOptions, type SweepResult } from './process/sweep.js';
import { reportSweep, scheduleSweeps } from './process/sweep-schedule.js';
import { backend, capabilities as hostCapabilities } from './backend/index.js';
import { addReaperSource, reapMembers, removeReaperSource } from './process/reaper.js';
import { acquireSubreaper, releaseSubreaper } from './process/subreaper.js';
import type { Capabilities } from './types.js';
import { assertDuration } from './validate.js';
import { checkExecSupport, validateSpec, validateSpecs } from './lifecycle/spec.js';
import { launchInstance } from './lifecycle/attempt.js';
import { holdExitOf } from './lifecycle/exits.js';
import { FdReserve } from './lifecycle/fd-reserve.js';
import type { LifecycleHost } from './lifecycle/host.js';
import {
  describeTracked,
  InstanceTable,
  lifeOf,
  pinnedOf,
  shownStatus,
  type Life,
  type Quarantined,
  type Running,
} from './lifecycle/instances.js';
import { stopInstance } from './lifecycle/stop.js';
import { adopt } from './lifecycle/adopted.js';
import { disarm, newLife } from './lifecycle/ends.js';
import { adoptResting, cancelRest, endedUnseen, relaunch, settleOwed } from './lifecycle/restart.js';

export type {
  InstanceInfo,
  InstanceStatus,
  InstanceSummary,
  StopOptions,
  InstanceStopResult,
  StopResult,
  SupervisorOptions,
} from './options.js';

/** Owns a state dir and the instances in it: `Supervisor.open()` recovers what a previous agent left, then `launch()`, `stop()`, `list()`, `sweep()` and the rest act on instances it can prove are its own. */
export class Supervisor {
  readonly stateDir: string;
  readonly #store: StateStore;
  readonly #emit: Emit;
  readonly #options: SupervisorOptions;
  readonly #table = new InstanceTable();
  /** Operations that use the state dir; close() lets them finish first. */
  #pending = new Set<Promise<unknown>>();
  #reserve = new FdReserve();
  /** Whether this supervisor holds a reference on the process's subreaper flag. */
  #subreaper = false;
  /** The sessions its running instances' members are in, for the subreaper's reaping. */
  readonly #sessions = () => {
    const running = this.#table.pinned().filter((p) => p.status === 'running');
    return {
      sessions: running.flatMap((p) => [p.session ?? 0, p.instance.identity.session ?? 0]),
      pids: running.map((p) => p.handle.pid),
      cgroups: running.flatMap((p) => (p.cgroup ? [p.cgroup.node] : [])),
    };
  };
  #closed = false;
  #stopSweeps: (() => void) | undefined;
  #logs: InstanceLogs;
  #cgroups: CgroupRoot | null = null;
  /** Cgroups of launches in flight (made before their manifest is written). */
  readonly #launching = new Set<string>();
  /** Ids a recover() is judging now; launch refuses them until it is done. */
  readonly #recovering = new Set<string>();
  /** The sd_notify sockets of running instances launched with ready: 'notify'. */
  #notifiers = new Set<NotifyChannel>();
  /** What the lifecycle modules see of this supervisor. */
  readonly #host: LifecycleHost;
  /** Deferred ids are looked at again by the supervisor itself, with a doubling wait. */
  readonly #retry: DeferredRetry;

  private constructor(options: SupervisorOptions, store: StateStore, emit: Emit) {
    this.#options = options;
    this.stateDir = options.stateDir;
    this.#store = store;
    this.#emit = emit;
    this.#logs = new InstanceLogs(store.dir, {
      report: (type, fields) => this.#emit(type, fields),
      live: () => [...this.#table.keys(), ...this.#store.ids()],
    });
    const sup = this;
    this.#host = {
      store,
      emit,
      table: this.#table,
      logs: this.#logs,
      get cgroups() {
        return sup.#cgroups;
      },
      options,
      get closed() {
        return sup.#closed;
      },
      get subreaper() {
        return sup.#subreaper;
      },
      notifiers: this.#notifiers,
      launching: this.#launching,
      inFlight: (p) => this.#inFlight(p),
      withRoom: (undo) => this.#reserve.lend(undo, () => this.#closed),
      reap: () => this.#reap(),
      holdExitOf: (t: Running) => holdExitOf(this.#host, t),
      relaunch: (id, record) => relaunch(this.#host, id, record),
    };
    this.#retry = new DeferredRetry({
      pending: () => [...this.#table.values()].some((t) => t.status === 'deferred'),
      recover: () => (this.#closed ? Promise.resolve() : this.recover()),
      failed: (err, nextMs) =>
        emit('warning', {
          message: `recovery of the deferred instances failed (${err.message}); the supervisor tries again in ${nextMs / 1000} s`,
        }),
      ref: holdsLoop(options),
    });
  }

  /**
   * Opens the state dir (creating it 0700 unless `create: false`), takes its
   * lock, stamps it if it is new or custody 0.1's, and recovers every
   * manifest in it before resolving: { supervisor, report }.
   */
  static async open(options: SupervisorOptions): Promise<{ supervisor: Supervisor; report: RecoveryReport }> {
    validateSupervisorOptions(options);
    validateSpecs(options.specs);
    // A /proc of another pid namespace would make every proof below about other processes.
    if (backend.capabilities().proc) backend.assertOwnProc();
    const emit = emitter(options.onEvent);
    const store = await StateStore.open(options.stateDir, { emit, create: options.create });
    const sup = new Supervisor(options, store, emit);
    try {
      if (options.cgroup !== undefined) {
        sup.#cgroups = CgroupRoot.open(
          options.cgroup,
          options.stateDir,
          (message) => sup.#emit('warning', { message }),
          store,
        );
      }
      if (options.subreaper) sup.#subreaper = acquireSubreaper();
      if (sup.#subreaper) addReaperSource(sup.#sessions);
      if (options.subreaper && !sup.#subreaper) {
        sup.#emit('warning', {
          message: `subreaper needs the native backend (${backend.capabilities().reason ?? backend.name}); daemons that double-fork will be re-parented to init`,
        });
      }
      const report = await sup.recover();
      // Taken once recovery is done, so that recovery itself has every fd there is.
      sup.#reserve.refill();
      if (options.sweep) sup.#stopSweeps = scheduleSweeps(options.sweep, (p) => sup.sweep(p), emit);
      return { supervisor: sup, report };
    } catch (err) {
      sup.#letGo();
      throw err;
    }
  }

  /**
   * Recovers manifests that no tracked instance owns. Runs once when the
   * supervisor opens; calling it again only looks at manifests that appeared
   * since (instances already tracked are skipped).
   */
  async recover(): Promise<RecoveryReport> {
    this.#assertOpen();
    return this.#inFlight(this.#recover());
  }

  #recover(): Promise<RecoveryReport> {
    // The adopted instances' logs are checked against their caps once recovery is done.
    const release = this.#logs.holdFirstChecks();
    // The ids this recovery judges: a launch of one meanwhile is refused
    // (its manifest would be written over the one being judged, and
    // cleaning that would take the new launch's state with it).
    const judging: string[] = [];
    const done = () => {
      for (const id of judging) this.#recovering.delete(id);
      try {
        // A deferred id whose state is gone altogether has nothing left to decide.
        if (!this.#closed && [...this.#table.values()].some((t) => t.status === 'deferred')) {
          const present = new Set(this.#store.ids());
          for (const [id, t] of [...this.#table.entries()])
            if (t.status === 'deferred' && !present.has(id)) this.#table.move(id, undefined);
        }
      } catch {
        // The state dir unlistable now: the deferrals stay for the next recover().
      } finally {
        release();
        this.#retry.poke();
      }
    };
    return recover({
      store: this.#store,
      emit: this.#emit,
      allowUnprovable: this.#options.allowUnprovable === true,
      cgroups: this.#cgroups,
      usesCgroup: (path) =>
        this.#launching.has(path) ||
        [...this.#table.values()].some(
          (t) =>
            pinnedOf(t)?.cgroup?.path === path || (t.status === 'quarantined' && t.manifest?.cgroup?.path === path),
        ),
      wants: (id) => {
        // Not one another recover() is judging right now.
        if (this.#recovering.has(id)) return false;
        const t = this.#table.get(id);
        if (t && t.status !== 'deferred') return false;
        this.#recovering.add(id);
        judging.push(id);
        return true;
      },
      adopt: (m: Manifest, h: ProcessHandle, cg: InstanceCgroup | null) => {
        // The recorded policy and budget govern the run it adopts; specs[id] the runs after it.
        adopt(this.#host, m, h, cg, this.#specOf(m.id));
      },
      adoptResting: (m) => adoptResting(this.#host, m, this.#specOf(m.id)),
      ended: (m) => endedUnseen(this.#host, m, this.#specOf(m.id)),
      quarantine: (id, m, reason, field) => this.#quarantine(id, m, reason, field),
      defer: (id, error) => this.#table.move(id, { status: 'deferred', error }),
      forget: (id) => {
        if (this.#table.get(id)?.status === 'deferred') this.#table.move(id, undefined);
      },
    }).finally(done);
  }

  #inFlight<T>(p: Promise<T>): Promise<T> {
    this.#pending.add(p);
    const done = () => this.#pending.delete(p);
    p.then(done, done);
    return p;
  }

  #specOf(id: string): LaunchSpec | null {
    return this.#options.specs?.[id] ?? null;
  }

  #quarantine(id: string, manifest: Manifest | null, reason: string, field?: string): void {
    const t: Quarantined = { status: 'quarantined', manifest, reason };
    if (field !== undefined) t.field = field;
    this.#table.move(id, t);
  }

  #reap(): void {
    if (!this.#subreaper) return;
    try {
      reapMembers();
    } catch (err) {
      this.#emit('warning', {
        message: `subreaper: could not look for orphans to reap now (${(err as Error).message}); the next SIGCHLD retries`,
      });
    }
  }

  /** Launches, confirms, records the identity, waits until ready, then records it running. Retries up to `attempts`, abandoning each failure cleanly. */
  launch(spec: LaunchSpec): Promise<Instance> {
    return this.#inFlight(this.#launch(spec));
  }

  async #launch(spec: LaunchSpec): Promise<Instance> {
    this.#assertOpen();
    validateSpec(spec);
    checkExecSupport(spec, this.#cgroups !== null);
    const limits = validateLimits(spec.limits);
    if (limits && !this.#cgroups)
      throw new InvalidArgError(
        'limits need a supervisor opened with a cgroup root (Supervisor.open({ cgroup: { root } }))',
      );
    // Refused (ERR_CUSTODY_UNSUPPORTED) before anything exists where the root lacks a controller.
    this.#cgroups?.prepareLimits(limits);
    if (this.#recovering.has(spec.id))
      throw new CustodyError(
        'ERR_CUSTODY_BUSY',
        `instance ${spec.id} is being recovered; launch it once recover() is done`,
      );
    // launch() of an id waiting for its restart carries its budget (and its Instance) on; of a failed one, or
    // of any other, starts afresh.
    const existing = this.#table.get(spec.id);
    // A hook owed by its last end runs first, from this spec.
    if (existing?.status === 'owed') await settleOwed(this.#host, spec.id, existing, spec);
    let carried: Life | undefined;
    if (existing?.status === 'backoff') {
      disarm(existing);
      carried = existing.life;
    }
    // A launch whose abandon could not end everything leaves its id deferred.
    return launchInstance(this.#host, spec, newLife(spec, carried)).finally(() => this.#retry.poke());
  }

  /**
   * Stops an instance: the graceful hook (bounded), then SIGTERM, a bounded
   * wait and SIGKILL; state and declared paths go once it is proven gone.
   * With a cgroup: the hook, SIGTERM to the main process, cgroup.kill after
   * the grace, `populated 0`, the cgroup removed, then the state. A stop
   * that failed halfway left it `stopping`: this one finishes it.
   */
  async stop(id: string, options: StopOptions = {}): Promise<InstanceStopResult> {
    this.#assertOpen();
    assertId(id);
    validateStopOptions(options);
    const t = this.#table.get(id);
    if (!t || t.status === 'starting') throw notFound(id, t?.status);
    if (t.status === 'quarantined') throw new QuarantinedError(id, t.reason);
    if (t.status === 'deferred') throw new DeferredError(id, t.error);
    if (t.status === 'stopping' && t.done) return t.done;
    // Nothing runs: a pending restart is cancelled, the state goes.
    if (t.status === 'backoff' || t.status === 'failed') return this.#inFlight(cancelRest(this.#host, id, t, 'stop'));
    if (t.status === 'owed')
      throw new CustodyError(
        'ERR_CUSTODY_NOT_FOUND',
        `instance ${id} has exited; its afterExit is owed (no-spec): launch() or remove() it`,
      );
    const graceMs = options.graceMs ?? 30_000;
    const cgroup = pinnedOf(t)?.cgroup;
    // ERR_CUSTODY_UNSAFE_PATH before anything is written or signalled: its cgroup is no longer one to act through.
    if (cgroup) guardCgroup(cgroup);
    if (cgroup && options.tree === false) {
      throw new InvalidArgError(
        `${id} has a cgroup: the instance is the cgroup, and tree: false (the main process alone) cannot stop it`,
      );
    }
    return stopInstance(this.#host, t, { ...options, graceMs });
  }

  /**
   * Ends orphans by exact argv (see sweep()), never touching an instance
   * this supervisor tracks. Findings arrive as a sweep event; SIGKILLs and
   * survivors as warnings.
   */
  async sweep(options: SweepOptions): Promise<SweepResult> {
    this.#assertOpen();
    validateSweep(options);
    const pinned = this.#table.pinned();
    const tracked = pinned.map((p) => p.handle.pid);
    // Whatever is in an instance's cgroup is that instance's, whatever its argv says: never an orphan.
    const members = pinned.flatMap((p) => p.cgroup?.procs() ?? []);
    const exclude = new Set([...(options.exclude ?? []), ...tracked, ...members, ...this.#unsettledPids()]);
    const result = await sweep({ ...options, exclude });
    reportSweep(this.#emit, options, result);
    return result;
  }

  /**
   * The pids quarantined and deferred instances record: never signalled,
   * by a sweep neither (it may be the instance's process, or a stranger
   * that took its pid: sparing either is safe). A deferred record keeps no
   * manifest; it is read again, and one that cannot be read names nothing.
   */
  #unsettledPids(): number[] {
    const out: number[] = [];
    for (const [id, t] of this.#table.entries()) {
      let m: Manifest | null = null;
      if (t.status === 'quarantined') m = t.manifest;
      else if (t.status === 'deferred') {
        try {
          m = this.#store.read(id);
        } catch {
          m = null;
        }
      }
      if (m?.identity) out.push(m.identity.pid);
    }
    return out;
  }

  /**
   * Forgets an instance that has exited (its state is already gone), or one waiting for its restart or failed
   * (its pending restart is cancelled, its state removed; nothing runs, nothing is signalled). Refuses a
   * quarantined one.
   */
  async remove(id: string): Promise<void> {
    this.#assertOpen();
    assertId(id);
    const t = this.#table.get(id);
    if (!t) throw notFound(id);
    if (t.status === 'quarantined') throw new QuarantinedError(id, t.reason);
    if (t.status === 'backoff' || t.status === 'failed') {
      await this.#inFlight(cancelRest(this.#host, id, t, 'remove'));
      return;
    }
    // Its owed hook is not run: the operator's call.
    if (t.status === 'owed') return this.#inFlight(settleOwed(this.#host, id, t, null));
    if (t.status !== 'exited')
      throw new CustodyError(
        'ERR_CUSTODY_BUSY',
        `instance ${id} is ${t.status}${t.status === 'stopping' ? '' : '; stop() it instead'}`,
      );
    this.#table.move(id, undefined);
  }

  /** Every instance with its status; a quarantined one never hides the others. */
  list(): InstanceSummary[] {
    return [...this.#table.entries()].map(([id, t]) => describeTracked(id, t, liveParent));
  }

  /**
   * Freezes an instance's cgroup (cgroup.freeze, Linux 5.2): every process
   * stops where it is, and resolves once cgroup.events says `frozen 1`
   * (ERR_CUSTODY_CGROUP_TIMEOUT past timeoutMs, default 5000). stop() thaws first.
   */
  async freeze(id: string, options: { timeoutMs?: number } = {}): Promise<void> {
    const cg = this.#cgroupOf(id, 'freeze');
    if (options.timeoutMs !== undefined) assertDuration(options.timeoutMs, 'timeoutMs');
    await cg.freeze(options.timeoutMs);
    this.#emit('freeze', { id, message: `${id} frozen` });
  }

  /** Thaws a frozen instance; resolves once cgroup.events says `frozen 0`. */
  async thaw(id: string, options: { timeoutMs?: number } = {}): Promise<void> {
    const cg = this.#cgroupOf(id, 'thaw');
    if (options.timeoutMs !== undefined) assertDuration(options.timeoutMs, 'timeoutMs');
    await cg.thaw(options.timeoutMs);
    this.#emit('thaw', { id, message: `${id} thawed` });
  }

  /** What an instance's cgroup has used: CPU time (cpu.stat), memory (memory.current, null without the memory controller), processes. */
  usage(id: string): CgroupUsage {
    return this.#cgroupOf(id, 'usage').usage();
  }

  #cgroupOf(id: string, what: string): InstanceCgroup {
    this.#assertOpen();
    assertId(id);
    const t = this.#table.get(id);
    // While it is being stopped it still runs: usage() and thaw() still answer.
    const p = t && pinnedOf(t);
    if (!t || p?.status !== 'running') throw notFound(id, t && shownStatus(t), 'running');
    if (!p.cgroup) {
      throw new UnsupportedError(
        `${what}() needs an instance cgroup: ${this.#cgroups ? `${id} has none (its target was created outside it)` : 'the supervisor was opened without a cgroup root'}`,
      );
    }
    return p.cgroup;
  }

  /** capabilities(), with `cgroup` describing this supervisor's root (null without one). */
  capabilities(): Capabilities {
    const caps = hostCapabilities();
    if (!this.#cgroups)
      return {
        ...caps,
        cgroup: null,
        cgroupReason: caps.cgroup ? 'this supervisor was opened without a cgroup root' : caps.cgroupReason,
      };
    return { ...caps, cgroup: this.#cgroups.capabilities() };
  }

  /** The instance record of a running id. */
  get(id: string): Instance | undefined {
    const t = this.#table.get(id);
    // Between runs (and while a restart launches) the Instance held is the life's.
    if (t?.status === 'backoff' || t?.status === 'failed' || t?.status === 'starting') return t.life?.view ?? undefined;
    return t ? pinnedOf(t)?.instance : undefined;
  }

  /**
   * Clears a quarantine: an operator's decision that the state can go. The
   * process, if any, is never signalled; the manifest is removed. `id` is the
   * name list() shows, even one that is not a valid id (a dir such as
   * `bad id` is quarantined as a bad manifest), but never a path.
   */
  async release(id: string): Promise<void> {
    this.#assertOpen();
    assertEntryName(id);
    const t = this.#table.get(id);
    if (t?.status !== 'quarantined') throw notFound(id, t && shownStatus(t), 'quarantined');
    await this.#inFlight(this.#release(id, t));
  }

  /**
   * Clears every quarantine at once (an operator clearing many): a release
   * event for each, nothing signalled. Resolves with the ids released; if
   * some state could not be removed, those stay quarantined, each named in
   * a warning, and it rejects with the first error once all were tried.
   */
  async releaseAll(): Promise<string[]> {
    this.#assertOpen();
    const released: string[] = [];
    let failure: unknown;
    for (const [id, t] of [...this.#table.entries()]) {
      if (t.status !== 'quarantined') continue;
      try {
        await this.#inFlight(this.#release(id, t));
        released.push(id);
      } catch (err) {
        failure ??= err;
        this.#emit('warning', { id, message: `release of ${id} failed: ${(err as Error).message}` });
      }
    }
    if (failure) throw failure;
    return released;
  }

  async #release(id: string, t: Quarantined): Promise<void> {
    // Its cgroup goes only if nothing is in it (rmdir refuses otherwise), and only if it is still the one
    // recorded at a path custody may act through: nothing is signalled.
    const recorded = t.manifest?.cgroup;
    try {
      const cg = recorded ? InstanceCgroup.recorded(recorded) : 'gone';
      if (cg !== 'gone') await cg.remove(0);
    } catch {
      // left as it is: populated, or not custody's to remove
    }
    await this.#store.remove(id);
    this.#table.moveFrom(id, t, undefined);
    const message = `quarantine of ${id} released by the operator (${t.reason}); nothing was signalled`;
    this.#emit('release', { id, pid: t.manifest?.identity?.pid, reason: t.reason, message });
  }

  /**
   * Releases the lock and the pidfds once what is under way has finished (a
   * launch in flight undoes itself, a stop completes); supervised processes
   * keep running (their children are still reaped if they exit while we run).
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    this.#retry.close();
    this.#stopSweeps?.();
    while (this.#pending.size) await Promise.allSettled([...this.#pending]);
    // After the launches in flight: one that completed meanwhile kept its socket too.
    for (const n of this.#notifiers) n.close();
    this.#notifiers.clear();
    this.#logs.close();
    this.#letGo();
  }

  /** Lets go of what this supervisor holds: the subreaper reference, the fd reserve, the pins, the cgroup root, the lock. */
  #letGo(): void {
    this.#retry.close();
    if (this.#subreaper) {
      this.#subreaper = false;
      removeReaperSource(this.#sessions);
      releaseSubreaper();
    }
    this.#reserve.release();
    for (const t of this.#table.values()) {
      // Its manifest says backoff: the next open restarts it when it is due.
      if (t.status === 'backoff') disarm(t);
      // Its exited will not settle in this supervisor: whoever awaits it must not keep the process alive.
      lifeOf(t)?.letGo();
      pinnedOf(t)?.handle.close();
      if (t.status === 'stopping') for (const m of t.members) m.close();
    }
    this.#cgroups?.close();
    this.#store.close();
  }

  #assertOpen(): void {
    if (this.#closed) throw new CustodyError('ERR_CUSTODY_CLOSED', 'this supervisor is closed');
  }

  async [Symbol.for('nodejs.asyncDispose')](): Promise<void> {
    await this.close();
  }
}

function liveParent(pid: number, startTicks: number | undefined): number | null {
  const st = backend.stat(pid);
  return st && st.startTicks === startTicks ? st.ppid : null;
}

function notFound(id: string, status?: InstanceStatus, wanted = 'running or exited'): CustodyError {
  return new CustodyError(
    'ERR_CUSTODY_NOT_FOUND',
    status ? `instance ${id} is ${status}, not ${wanted}` : `no instance ${id}`,
  );
}
