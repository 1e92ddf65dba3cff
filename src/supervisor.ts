/**
 * The Supervisor: launch, stop, list, release and close over a state dir,
 * with recovery run once when it opens. One supervisor holds a state dir at
 * a time.
 */
import { randomBytes } from 'node:crypto';
import { closeSync, openSync, statSync } from 'node:fs';
import { CgroupRoot, validateLimits, type CgroupUsage, type InstanceCgroup } from './process/cgroup.js';
import {
  AbortError,
  CustodyError,
  DeferredError,
  InvalidArgError,
  QuarantinedError,
  UnsupportedError,
} from './errors.js';
import { emitter, type Emit } from './events.js';
import { holdExit, type ProcessHandle, releaseExit, resolveExecutable } from './process/handle.js';
import { awaitedExit } from './process/awaited.js';
import { callHook } from './lifecycle/hooks.js';
import { InstanceLogs, logLimits } from './state/logs.js';
import {
  abandon,
  confirm,
  confirmedIdentity,
  confirmedTarget,
  obtainPid,
  spawned,
  startChild,
  targetInCgroup,
  waitReady,
  type Attempt,
  type Instance,
  type LaunchSpec,
} from './lifecycle/launch.js';
import type { NotifyChannel } from './lifecycle/notify.js';
import { openNotify } from './lifecycle/notify-launch.js';
import { recover, type RecoveryReport } from './recovery/recover.js';
import type { InstanceSummary, InstanceStatus, StopOptions, StopResult, SupervisorOptions } from './options.js';
import { holdsLoop, validateStopOptions, validateSupervisorOptions } from './options.js';
import { removeDeclaredPaths } from './state/paths.js';
import {
  assertEntryName,
  assertId,
  MANIFEST_VERSION,
  StateStore,
  type Manifest,
  type StartingManifest,
} from './state/store.js';
import { endedResult, forceEnd, terminate } from './process/terminate.js';
import { sweep, validateSweep, type SweepOptions, type SweepResult } from './process/sweep.js';
import { sessionLeftovers, terminateCgroup, terminateMembers, terminateTree } from './process/tree.js';
import { backend, capabilities as hostCapabilities } from './backend/index.js';
import { describeExit } from './process/exit.js';
import { UNKNOWN_EXIT } from './process/signals.js';
import { addReaperSource, orphansInSession, reapMembers, removeReaperSource } from './process/reaper.js';
import { displayArg, fsPath } from './bytes.js';
import type { Capabilities, ProcessIdentity } from './types.js';
import { TIMED_OUT, within } from './timing.js';
import type { ExitStatus } from './types.js';
import { assertDuration, assertStringArray } from './validate.js';
import { validateSpec } from './lifecycle/spec.js';

export type { InstanceInfo, InstanceStatus, StopOptions, StopResult, SupervisorOptions } from './options.js';

/*
 * The table of tracked instances, one record per id, a union on `status`:
 * each status carries only what exists in it. A transition replaces the
 * record; whoever holds an old one (an exit watcher, a stop in flight) finds
 * out by comparing it with the table's. Only what stop, list, the reaper
 * and recovery's questions need is kept, not the manifest (it is on disk):
 * a supervisor may hold thousands of instances.
 */

/** A process custody pinned, confirmed and recorded. */
interface Pinned {
  /** The record launch() returned (and get() returns); its id is the table's key. */
  instance: Instance;
  handle: ProcessHandle;
  cgroup: InstanceCgroup | null;
  /** The session custody created for it, while the target is in it (the manifest's `session`). */
  session: number | null;
  /** Declared paths, removed once it is proven gone. */
  paths: readonly string[];
}

interface Starting {
  status: 'starting';
}

interface Running extends Pinned {
  status: 'running';
  /** What its main process left in its session when it exited on its own (#onGone), ended by #cleanUpAfter. */
  leftovers?: ProcessHandle[];
}

/** Its main process exited on its own; what it left (its cgroup's leftovers, its state) is being cleaned up. */
interface Exited extends Pinned {
  status: 'exited';
  exit: ExitStatus;
  cleanup: Promise<void>;
}

/** A stop in flight; list() shows the status it came from, and a failed stop goes back to it. */
interface Stopping {
  status: 'stopping';
  from: Running | Exited;
  done: Promise<StopResult>;
}

interface Quarantined {
  status: 'quarantined';
  /** null for a manifest that could not be read. */
  manifest: Manifest | null;
  reason: string;
  field?: string;
}

/** Recovery (or a failed abandon) could not decide it now. */
interface Deferred {
  status: 'deferred';
  error: Error;
}

type Tracked = Starting | Running | Exited | Stopping | Quarantined | Deferred;

/** The pinned process of a record, stopping or not; null where there is none. */
function pinnedOf(t: Tracked): Running | Exited | null {
  if (t.status === 'stopping') return t.from;
  return t.status === 'running' || t.status === 'exited' ? t : null;
}

/** The status list() shows: a stop in flight is not a status of its own. */
function shownStatus(t: Tracked): InstanceStatus {
  return t.status === 'stopping' ? t.from.status : t.status;
}

/** Empty declared paths, shared by every instance that has none. */
const NO_PATHS: readonly string[] = Object.freeze([]);

export class Supervisor {
  readonly stateDir: string;
  readonly #store: StateStore;
  readonly #emit: Emit;
  readonly #options: SupervisorOptions;
  readonly #table = new Map<string, Tracked>();
  #busy = new Set<string>();
  /** Operations that use the state dir; close() lets them finish first. */
  #pending = new Set<Promise<unknown>>();
  #reserve = new FdReserve(RESERVE_FDS);
  #undoing = 0;
  /** Whether this supervisor holds a reference on the process's subreaper flag. */
  #subreaper = false;
  /** The sessions its running instances' members are in, for the subreaper's reaping. */
  readonly #sessions = () => {
    const running = [...this.#table.values()].flatMap((t) => {
      const p = pinnedOf(t);
      return p?.status === 'running' ? [p] : [];
    });
    return {
      sessions: running.flatMap((p) => [p.session ?? 0, p.instance.identity.session ?? 0]),
      pids: running.map((p) => p.handle.pid),
      cgroups: running.flatMap((p) => (p.cgroup ? [p.cgroup.node] : [])),
    };
  };
  #closed = false;
  #sweepTimer: NodeJS.Timeout | undefined;
  #sweeping = false;
  #logs: InstanceLogs;
  #cgroups: CgroupRoot | null = null;
  /** Cgroups of launches in flight (made before their manifest is written). */
  readonly #launching = new Set<string>();
  /** Ids a recover() is judging now; launch refuses them until it is done. */
  readonly #recovering = new Set<string>();
  /** The sd_notify sockets of running instances launched with ready: 'notify'. */
  #notifiers = new Set<NotifyChannel>();

  private constructor(options: SupervisorOptions, store: StateStore, emit: Emit) {
    this.#options = options;
    this.stateDir = options.stateDir;
    this.#store = store;
    this.#emit = emit;
    this.#logs = new InstanceLogs(store.dir, {
      report: (type, fields) => this.#emit(type, fields),
      live: () => [...this.#table.keys(), ...this.#store.ids()],
    });
  }

  /**
   * Opens the state dir (creating it 0700 unless `create: false`), takes its
   * lock, stamps it if it is new or custody 0.1's, and recovers every
   * manifest in it before resolving: { supervisor, report }.
   */
  static async open(options: SupervisorOptions): Promise<{ supervisor: Supervisor; report: RecoveryReport }> {
    validateSupervisorOptions(options);
    // A /proc of another pid namespace would make every proof below about other processes.
    if (backend.capabilities().proc) backend.assertOwnProc();
    const emit = emitter(options.onEvent);
    const store = await StateStore.open(options.stateDir, { emit, create: options.create });
    const sup = new Supervisor(options, store, emit);
    try {
      if (options.cgroup !== undefined) {
        sup.#cgroups = CgroupRoot.open(options.cgroup, options.stateDir, (message) =>
          sup.#emit('warning', { message }),
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
      if (options.sweep) sup.#startSweeps(options.sweep);
      return { supervisor: sup, report };
    } catch (err) {
      sup.#releaseAll();
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
          for (const [id, t] of this.#table) if (t.status === 'deferred' && !present.has(id)) this.#table.delete(id);
        }
      } catch {
        // The state dir unlistable now: the deferrals stay for the next recover().
      } finally {
        release();
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
      adopt: (m: Manifest, h: ProcessHandle, cg: InstanceCgroup | null) => void this.#track(m, h, cg),
      quarantine: (id, m, reason, field) => this.#quarantine(id, m, reason, field),
      defer: (id, err) => this.#defer(id, err),
      forget: (id) => {
        if (this.#table.get(id)?.status === 'deferred') this.#table.delete(id);
      },
    }).finally(done);
  }

  /**
   * Undoing a launch scans and pins processes, which takes fds; a launch that failed for want of them
   * (EMFILE) gets the reserve's to do it with.
   */
  async #withRoom<T>(undo: () => Promise<T>): Promise<T> {
    if (this.#undoing++ === 0) this.#reserve.release();
    try {
      return await undo();
    } finally {
      // Not after close(): the reserve would outlive the supervisor.
      if (--this.#undoing === 0 && !this.#closed) this.#reserve.refill();
    }
  }

  #inFlight<T>(p: Promise<T>): Promise<T> {
    this.#pending.add(p);
    const done = () => this.#pending.delete(p);
    p.then(done, done);
    return p;
  }

  /** Registers an adopted or launched process and watches its exit. */
  #track(manifest: Manifest, handle: ProcessHandle, cgroup: InstanceCgroup | null): Instance {
    const identity = manifest.identity;
    if (!identity) throw new Error(`internal: ${manifest.id} is tracked without a recorded identity`);
    const instance: Instance = {
      id: manifest.id,
      pid: handle.pid,
      token: manifest.token,
      identity,
      exited: awaitedExit(handle),
      cgroup: cgroup?.path ?? null,
    };
    const running: Running = {
      status: 'running',
      instance,
      handle,
      cgroup,
      session: manifest.session ?? null,
      paths: manifest.paths.length ? manifest.paths : NO_PATHS,
    };
    this.#table.set(manifest.id, running);
    if (!holdsLoop(this.#options)) handle.unref();
    // Bound rather than a closure: one small object per instance, no context.
    void handle.exited.then(this.#onExit.bind(this, instance));
    this.#holdExitOf(running);
    void this.#logs.watch(manifest.id, manifest.logs);
    return instance;
  }

  /**
   * Without a cgroup, the session its main process leads (a detached launch's) is what holds the instance's
   * other processes: its zombie is kept when it exits on its own, so that what it left there is found while
   * the session's id can be no one else's (#onGone). Native only (the js backend's libuv reaps at once).
   */
  #holdExitOf(t: Running): void {
    if (t.cgroup || t.session === null || t.session !== t.handle.pid) return;
    holdExit(t.handle, this.#onGone.bind(this, t));
  }

  /** The main process exited on its own, its zombie held: find what it left in its session, then reap it. */
  async #onGone(t: Running): Promise<void> {
    const { id } = t.instance;
    const ours = () => this.#table.get(id) === t && !this.#closed;
    // A stop in flight keeps the zombie to its end (it anchors the session; terminateTree reaps it).
    const stopOwns = () => {
      const now = this.#table.get(id);
      return now?.status === 'stopping' && now.from === t;
    };
    if (stopOwns()) return;
    try {
      if (!ours() || t.session === null) return;
      const found = await sessionLeftovers(t.session, LEFTOVER_SCAN_MS);
      // A stop that began meanwhile owns the instance now.
      if (ours()) t.leftovers = found;
      else for (const h of found) h.close();
    } catch (err) {
      this.#emit('warning', {
        id,
        message: `could not look for what ${id} left in its session: ${(err as Error).message}`,
      });
    } finally {
      // Reaped: #onExit follows.
      if (!stopOwns()) releaseExit(t.handle);
    }
  }

  #quarantine(id: string, manifest: Manifest | null, reason: string, field?: string): void {
    const t: Quarantined = { status: 'quarantined', manifest, reason };
    if (field !== undefined) t.field = field;
    this.#table.set(id, t);
  }

  /** Recovery (or a failed abandon) could not decide this id now; launch and stop refuse it until a later recover() does. */
  #defer(id: string, error: Error): void {
    this.#table.set(id, { status: 'deferred', error });
  }

  #onExit(instance: Instance, status: ExitStatus): void {
    const { id } = instance;
    const t = this.#table.get(id);
    // A stop in flight, or a later launch of the id, owns what happens now.
    if (t?.status !== 'running' || t.instance !== instance || this.#closed) return;
    this.#logs.unwatch(id);
    const { handle, cgroup, session, paths } = t;
    const cleanup = this.#cleanUpAfter(t);
    this.#table.set(id, { status: 'exited', instance, handle, cgroup, session, paths, exit: status, cleanup });
    this.#emit('exit', {
      id,
      pid: t.handle.pid,
      code: status.code,
      signal: status.signal,
      message: `exited on its own (${describeExit(status)})`,
    });
    // Proven gone (its pidfd said so): stale sockets and state go with it,
    // and, as systemd does when a service's main process exits, whatever it
    // left in its cgroup (the cgroup first: the state goes only once it is empty).
    removeDeclaredPaths(t.paths, this.#emit, id);
  }

  #cleanUpAfter(t: Running): Promise<void> {
    const { id } = t.instance;
    return this.#inFlight(
      (async () => {
        if (t.cgroup) {
          const { leftovers } = await this.#terminate(t, 0, undefined);
          if (leftovers?.length) {
            const message = `${id}: ${leftovers.length} process(es) its main process left in its cgroup were killed (cgroup.kill)`;
            this.#emit('warning', { id, pids: leftovers, message });
          }
          await t.cgroup.remove();
        } else if (t.leftovers?.length) {
          await this.#endLeftovers(t, t.leftovers);
        }
        await this.#store.remove(id);
      })(),
    ).catch((err: unknown) => {
      this.#emit('warning', {
        id,
        message: `could not clean up after an exited instance: ${(err as Error).message}`,
      });
    });
  }

  /** Ends what an exited main process left in its session (#onGone found and pinned them), as its cgroup's would be. */
  async #endLeftovers(t: Running, leftovers: ProcessHandle[]): Promise<void> {
    const { id } = t.instance;
    try {
      // The leader is reaped: the session counts only while one of them is in it.
      const { members } = await terminateMembers(leftovers, {
        session: t.session,
        sessionEachPass: true,
        reapIfChild: true,
        graceMs: 0,
      });
      const message = `${id}: ${members.length} process(es) its main process left in its session were killed`;
      this.#emit('warning', { id, pids: members, message });
    } catch (err) {
      // One that cannot be signalled (EPERM: another uid's): said, and the main's state goes all the same.
      this.#emit('warning', {
        id,
        pids: leftovers.map((h) => h.pid),
        message: `${id}: could not end what its main process left in its session: ${(err as Error).message}`,
      });
    } finally {
      for (const h of leftovers) h.close();
      t.leftovers = undefined;
    }
  }

  /** Launches, confirms, waits until ready, then records the identity. Retries up to `attempts`, abandoning each failure cleanly. */
  launch(spec: LaunchSpec): Promise<Instance> {
    return this.#inFlight(this.#launch(spec));
  }

  async #launch(spec: LaunchSpec): Promise<Instance> {
    this.#assertOpen();
    validateSpec(spec);
    const limits = validateLimits(spec.limits);
    if (limits && !this.#cgroups)
      throw new InvalidArgError(
        'limits need a supervisor opened with a cgroup root (Supervisor.open({ cgroup: { root } }))',
      );
    // Refused (ERR_CUSTODY_UNSUPPORTED) before anything exists where the root lacks a controller.
    this.#cgroups?.prepareLimits(limits);
    const { id } = spec;
    if (this.#recovering.has(id))
      throw new CustodyError('ERR_CUSTODY_BUSY', `instance ${id} is being recovered; launch it once recover() is done`);
    const existing = this.#table.get(id);
    if (existing?.status === 'quarantined') throw new QuarantinedError(id, existing.reason);
    if (existing?.status === 'deferred') throw new DeferredError(id, existing.error);
    if (this.#busy.has(id) || (existing && existing.status !== 'exited')) {
      const now = existing?.status === 'stopping' ? 'stopping' : (existing?.status ?? 'launching');
      throw new CustodyError('ERR_CUSTODY_BUSY', `instance ${id} is already ${now}`);
    }
    // A state dir moved or replaced since open would get a record nobody finds.
    this.#store.assertInPlace();
    this.#busy.add(id);
    if (existing?.status === 'exited') this.#table.delete(id);
    const placeholder: Starting = { status: 'starting' };
    this.#table.set(id, placeholder);
    try {
      const attempts = spec.attempts ?? 1;
      let lastError: unknown;
      for (let n = 1; n <= attempts; n++) {
        if (spec.signal?.aborted) throw new AbortError(spec.signal.reason);
        try {
          return await this.#attempt(spec, n);
        } catch (err) {
          lastError = err;
          // Deferred: an attempt not proven undone; its state waits for recover(), not for another attempt.
          const deferred = this.#table.get(id)?.status === 'deferred';
          if (err instanceof AbortError || err instanceof InvalidArgError || this.#closed || deferred) throw err;
          if (n < attempts)
            this.#emit('retry', {
              id,
              attempt: n + 1,
              message: `attempt ${n + 1} of ${attempts} after: ${(err as Error).message}`,
            });
        }
      }
      throw lastError;
    } finally {
      this.#busy.delete(id);
      if (this.#table.get(id) === placeholder) this.#table.delete(id);
    }
  }

  async #attempt(spec: LaunchSpec, attemptNo: number): Promise<Instance> {
    const token = randomBytes(16).toString('hex');
    const argv = typeof spec.args === 'function' ? spec.args(token) : spec.args;
    assertStringArray(argv, 'args');
    const pidSpec = spec.pid ?? 'child';
    const tokenMode = spec.token ?? 'argv';
    // Only where the child's own argv is the target's can it be checked up
    // front: a launcher may assemble the target's argv (and its token) from
    // its own, and only the confirmed target must carry it. In env mode the
    // environment carries it, whatever the argv.
    if (tokenMode === 'argv' && pidSpec === 'child' && !argv.some((a) => a.includes(token))) {
      throw new InvalidArgError(`args of ${spec.id} must carry the launch token: pass args as a function of the token`);
    }
    const pidFile = typeof pidSpec === 'object' ? pidSpec.file : null;
    const paths = [...(spec.paths ?? [])];
    if (spec.ready && typeof spec.ready === 'object') paths.push(spec.ready.socket);
    if (pidFile) paths.push(pidFile);
    const executable = spec.executable
      ? statSync(fsPath(resolveExecutable(spec.executable, spec.env ?? process.env, spec.cwd)))
      : null;
    const now = new Date().toISOString();
    const manifest: StartingManifest = {
      version: MANIFEST_VERSION,
      id: spec.id,
      token,
      tokenMode,
      state: 'starting',
      identity: null,
      command: spec.command,
      args: argv,
      expect: spec.expect ?? [],
      paths: [...new Set(paths)],
      executable: spec.executable ?? null,
      uid: spec.uid ?? null,
      pidSource: pidSpec === 'child' ? 'child' : typeof pidSpec === 'function' ? 'function' : 'file',
      pidFile,
      createdAt: now,
      updatedAt: now,
      supervisorPid: process.pid,
      // What the child shows until its exec: a crash in between leaves recovery a fork to wait for.
      forkImage: backend.ownForkImage(),
      quarantine: null,
      // What the agent needs of the launch after a restart: the log caps, the launcher's role.
      logs: spec.stdout === undefined || spec.stderr === undefined ? logCaps(spec.logs) : null,
      launcherExits: spec.launcherExits !== false,
    };
    const a: Attempt = {
      id: spec.id,
      token,
      tokenMode,
      command: spec.command,
      argv,
      uid: spec.uid ?? null,
      session: null,
      expect: manifest.expect,
      executable: executable ? { dev: executable.dev, ino: executable.ino } : null,
      executablePath: spec.executable ?? null,
      paths: manifest.paths,
      pidSpec,
      launcherExits: spec.launcherExits !== false,
      child: null,
      target: null,
      identity: null,
      cgroup: null,
      stderrTail: () => undefined,
      notify: null,
    };
    // Stale paths of an earlier run would make readiness lie.
    removeDeclaredPaths(a.paths, this.#emit, spec.id);
    // Before the manifest: a log dir that cannot be trusted fails the launch with nothing to undo.
    const logged = spec.stdout === undefined || spec.stderr === undefined;
    const logs = this.#logs.prepare(spec.id, logged ? spec.logs : false);
    // The cgroup before the manifest that names it: a crash between the two leaves an empty cgroup, which recovery removes.
    a.cgroup = this.#cgroups?.create(spec.id, token, spec.limits) ?? null;
    if (a.cgroup) {
      manifest.cgroup = { path: a.cgroup.path, id: a.cgroup.id };
      this.#launching.add(a.cgroup.path);
    }
    try {
      return await this.#run(spec, attemptNo, manifest, a, logs);
    } finally {
      if (a.cgroup) this.#launching.delete(a.cgroup.path);
    }
  }

  async #run(
    spec: LaunchSpec,
    attemptNo: number,
    manifest: StartingManifest,
    a: Attempt,
    logs: ReturnType<InstanceLogs['prepare']>,
  ): Promise<Instance> {
    const { token } = a;
    const pidSpec = a.pidSpec;
    // Written, and fsync'd, before anything is spawned: a supervisor killed
    // from here on leaves a record recovery can find the process by.
    try {
      await this.#store.write(manifest);
    } catch (err) {
      await a.cgroup?.remove();
      throw err;
    }
    this.#emit('launch', {
      id: spec.id,
      attempt: attemptNo,
      token,
      message: `attempt ${attemptNo}: starting manifest written; spawning ${spec.command}`,
    });
    const confirmTimeoutMs = spec.confirmTimeoutMs ?? 3000;
    const signal = spec.signal;
    try {
      // Bound before the spawn, so nothing the instance sends is lost; closed on failure below, else with the instance.
      if (spec.ready === 'notify') a.notify = openNotify(a, this.#emit);
      startChild(a, spec, logs);
      const child = spawned(a);
      this.#emit('spawn', {
        id: spec.id,
        pid: child.pid,
        message: `spawned pid ${child.pid} (${pidSpec === 'child' ? 'the target itself' : 'a launcher; the target pid comes from it'})`,
      });
      const deadline = Date.now() + confirmTimeoutMs;
      let pid = await obtainPid(a, deadline, confirmTimeoutMs, signal);
      await confirm(a, pid, deadline, confirmTimeoutMs, signal);
      this.#emit('confirm', {
        id: spec.id,
        pid,
        identity: a.identity,
        message: `pid ${pid} exec'd into the expected argv; identity recorded from that inspection`,
      });
      const cgroup = a.cgroup && targetInCgroup(a) ? a.cgroup : null;
      if (a.cgroup && !cgroup) {
        this.#emit('warning', {
          id: spec.id,
          pid,
          message: `pid ${pid} was created outside the instance cgroup (by whatever the pid function asked): ${spec.id} runs with cgroup null, under the token rule`,
        });
      }
      const instance: Instance = {
        id: spec.id,
        pid,
        token,
        identity: confirmedIdentity(a),
        exited: confirmedTarget(a).exited,
        cgroup: cgroup?.path ?? null,
      };
      if (spec.ready) {
        const alias = typeof spec.ready === 'object' ? spec.ready.timeoutMs : undefined;
        const readyTimeoutMs = spec.readyTimeoutMs ?? alias ?? 10_000;
        await waitReady(a, instance, spec.ready, readyTimeoutMs, signal);
        // A notify launch's MAINPID= may have made another pid the target (re-confirmed).
        pid = confirmedTarget(a).pid;
        const how = spec.ready === 'notify' ? 'ready: READY=1 from the instance' : 'ready';
        this.#emit('ready', { id: spec.id, pid, message: how });
      }
      // Closed while launching: nobody would watch it; undo rather than orphan it.
      if (this.#closed)
        throw new CustodyError('ERR_CUSTODY_CLOSED', `the supervisor was closed while ${spec.id} was launching`);
      // The session is recorded only while the target is in it: stop and recovery then count its members.
      const target = confirmedTarget(a);
      const identity = confirmedIdentity(a);
      const session = a.session !== null && identity.session === a.session ? a.session : null;
      const cg = cgroup ? { path: cgroup.path, id: cgroup.id } : null;
      const running: Manifest = {
        ...manifest,
        state: 'running',
        identity,
        session,
        cgroup: cg,
        updatedAt: new Date().toISOString(),
      };
      await this.#store.write(running);
      if (child !== target) {
        // The launcher is ours to reap whenever it ends; it holds nothing.
        child.unref();
        child.close();
        if (a.cgroup && !cgroup) this.#removeLauncherCgroup(spec.id, child, a.cgroup);
      }
      const tracked = this.#track(running, target, cgroup);
      const notify = a.notify;
      if (notify) {
        // STATUS= updates and barriers keep working while the instance runs; closed with it, or with us.
        notify.keep();
        this.#notifiers.add(notify);
        void target.gone.then(() => this.#notifiers.delete(notify));
      }
      // What the launch left re-parented to us (-daemonize's zombie fork) is reapable now that its sessions are known.
      this.#reap();
      this.#emit('running', { id: spec.id, pid, message: 'running; identity manifest written' });
      return tracked;
    } catch (err) {
      // Nothing said from here on counts.
      a.notify?.close();
      let ended: number[];
      try {
        ended = await this.#withRoom(() => abandon(a, spec.abandonGraceMs ?? 2000, this.#emit));
        // Proven empty: the cgroup goes, then the state.
        await a.cgroup?.remove();
      } catch (abandonErr) {
        // Something of the attempt would not die: its manifest stays, for a
        // later recover() to decide; until then the id is refused.
        this.#emit('warning', {
          id: spec.id,
          message: `abandon of ${spec.id} failed (${(abandonErr as Error).message}); its manifest is kept`,
        });
        this.#defer(spec.id, abandonErr as Error);
        throw err;
      }
      // State goes only now: every process of the attempt is proven gone.
      await this.#removeState(spec.id);
      this.#emit('abandon', {
        id: spec.id,
        attempt: attemptNo,
        pids: ended,
        error: err,
        message: (err as Error).message,
      });
      throw err;
    }
  }

  /** A pid function's launcher held the cgroup its target is not in: it goes once the launcher has exited, if nothing is left in it. */
  #removeLauncherCgroup(id: string, launcher: ProcessHandle, cg: InstanceCgroup): void {
    void launcher.exited
      .then(() => cg.remove())
      .catch((err: unknown) => {
        this.#emit('warning', {
          id,
          message: `the launcher's cgroup ${cg.path} was not removed (${(err as Error).message}); what is left in it is not signalled`,
        });
      });
  }

  /**
   * Stops an instance: the graceful hook (bounded), then SIGTERM, a bounded
   * wait and SIGKILL; state and declared paths go once it is proven gone.
   * With a cgroup: the hook, SIGTERM to the main process, cgroup.kill after
   * the grace, `populated 0`, the cgroup removed, then the state.
   */
  async stop(id: string, options: StopOptions = {}): Promise<StopResult> {
    this.#assertOpen();
    assertId(id);
    validateStopOptions(options);
    const t = this.#table.get(id);
    if (!t || t.status === 'starting') throw notFound(id, t?.status);
    if (t.status === 'quarantined') throw new QuarantinedError(id, t.reason);
    if (t.status === 'deferred') throw new DeferredError(id, t.error);
    if (t.status === 'stopping') return t.done;
    const graceMs = options.graceMs ?? 30_000;
    if (t.cgroup && options.tree === false) {
      throw new InvalidArgError(
        `${id} has a cgroup: the instance is the cgroup, and tree: false (the main process alone) cannot stop it`,
      );
    }
    const stopping: Stopping = {
      status: 'stopping',
      from: t,
      done: this.#inFlight(this.#stop(t, { ...options, graceMs })),
    };
    this.#table.set(id, stopping);
    try {
      return await stopping.done;
    } finally {
      // Not stopped (it threw before the process was proven gone): it is what it was.
      if (this.#table.get(id) === stopping) {
        this.#table.set(id, t);
        if (t.status === 'running') this.#holdExitOf(t);
      }
    }
  }

  async #stop(t: Running | Exited, options: StopOptions & { graceMs: number }): Promise<StopResult> {
    const h = t.handle;
    if (options.signal?.aborted) throw new AbortError(options.signal.reason);
    // An exit seen while we were not stopping is being cleaned up: let that finish first.
    // (Awaited either way: stop() records the stop before any of it happens.)
    await (t.status === 'exited' ? t.cleanup : null);
    let result: StopResult;
    try {
      result = await this.#end(t, options);
    } catch (err) {
      if (!(err instanceof AbortError)) throw err;
      // Abort means "force it now": KILL, a bounded wait until it is gone
      // (StopTimeoutError if it outlives that), and only then the AbortError.
      if (t.cgroup)
        await terminateCgroup(t.cgroup, [h], {
          termSignal: 'SIGKILL',
          graceMs: 0,
          killEach: this.#killEach(),
        });
      else if (options.tree !== false)
        await terminateTree(h, { termSignal: 'SIGKILL', graceMs: 0, reapIfChild: true, session: t.session });
      else {
        releaseExit(h);
        await forceEnd(h);
      }
      await t.cgroup?.remove();
      await this.#removeState(t.instance.id);
      const killed: StopResult = { outcome: 'exited', escalated: true, code: null, signal: 'SIGKILL' };
      this.#stopped(t, killed, 'stop aborted: ended with SIGKILL; state removed');
      throw err;
    }
    // Proven gone (populated 0, or every pin's exit seen): the cgroup goes, then the state.
    await t.cgroup?.remove();
    await this.#removeState(t.instance.id);
    const how = `${result.outcome}${result.escalated ? ', after SIGKILL' : ''}`;
    this.#stopped(t, result, `stopped (${how}); state removed`);
    return result;
  }

  /** Without cgroup.kill (Linux < 5.14) every member is killed through its own pidfd. */
  #killEach(): boolean {
    return this.#cgroups?.capabilities().kill !== true;
  }

  /** Members re-parented to us (as subreaper) that the instance's tree no longer reaches. */
  #orphansOf(t: Pinned): ProcessHandle[] {
    const session = t.instance.identity.session;
    return this.#subreaper && session ? orphansInSession(session) : [];
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

  /** Proven gone: the pin, the declared paths, the entry go; the stop event says how. */
  #stopped(t: Pinned, result: StopResult, message: string): void {
    const { id } = t.instance;
    this.#reap();
    t.handle.close();
    this.#logs.unwatch(id);
    removeDeclaredPaths(t.paths, this.#emit, id);
    const now = this.#table.get(id);
    if (now?.status === 'stopping' && now.from === t) this.#table.delete(id);
    this.#emit('stop', { id, pid: t.handle.pid, ...result, message });
  }

  async #end(t: Running | Exited, options: StopOptions & { graceMs: number }): Promise<StopResult> {
    const h = t.handle;
    if (t.status === 'exited' || h.exitStatus) {
      // Leftovers of a main process that is gone are still the instance's.
      if (t.cgroup) await this.#terminate(t, 0, options.signal);
      const st = (t.status === 'exited' ? t.exit : h.exitStatus) ?? UNKNOWN_EXIT;
      return { outcome: 'already-gone', escalated: false, code: st.code, signal: st.signal };
    }
    const single = options.tree === false;
    if (!options.graceful) {
      const { leftovers: _l, ...result } = await this.#terminate(t, options.graceMs, options.signal, single);
      return result;
    }
    const { id } = t.instance;
    const ac = new AbortController();
    // Gone, not exited: a non-child's status may come much later, if ever.
    const gone = h.gone.then(() => 'gone' as const);
    // The hook asks (sync or async); the process then has the rest of graceMs to act on it.
    const hook = callHook(options.graceful, t.instance, ac.signal).then(
      () => gone,
      (err: unknown) => {
        const why = (err as Error)?.message ?? String(err);
        this.#emit('warning', { id, message: `graceful stop hook failed: ${why}` });
        return 'failed' as const;
      },
    );
    let r: 'gone' | 'failed' | typeof TIMED_OUT | undefined;
    try {
      r = await within(Promise.race([hook, gone]), options.graceMs, options.signal);
    } finally {
      // Whatever ended the graceful phase, the hook's work is over.
      ac.abort(new Error(r === TIMED_OUT ? 'graceful stop timed out' : 'graceful stop is over'));
    }
    if (r === TIMED_OUT) {
      this.#emit('warning', {
        id,
        message: `graceful stop did not end the process within ${options.graceMs} ms; terminating`,
      });
    }
    const { leftovers: _l, ...result } = await this.#terminate(t, options.termGraceMs ?? 2000, options.signal, single);
    return r === 'gone' ? { ...result, outcome: 'exited' } : result;
  }

  /**
   * SIGTERM, graceMs, then the kill: of the cgroup where the instance has
   * one (the proof is `populated 0`), else of the tree (every member
   * pinned), else (tree: false) of the main process alone.
   */
  async #terminate(
    t: Pinned,
    graceMs: number,
    signal: AbortSignal | undefined,
    single = false,
  ): Promise<StopResult & { leftovers?: number[] }> {
    const h = t.handle;
    const { id } = t.instance;
    const onEscalate = ({ pid, graceMs }: { pid: number; graceMs: number }) =>
      this.#emit('escalate', {
        id,
        pid,
        message: `${id} (pid ${pid}) did not stop within ${graceMs} ms of SIGTERM; sending SIGKILL`,
      });
    if (t.cgroup) {
      const wasAlive = h.isAlive();
      const r = await terminateCgroup(t.cgroup, [h], { graceMs, signal, onEscalate, killEach: this.#killEach() });
      return { ...(await endedResult(h, wasAlive, r.escalated)), leftovers: r.leftovers };
    }
    if (single) {
      // The main alone: nothing to anchor, and its status is wanted as it comes.
      releaseExit(h);
      return terminate(h, { graceMs, signal, onEscalate });
    }
    const { members: _members, ...result } = await terminateTree(h, {
      graceMs,
      signal,
      onEscalate,
      reapIfChild: true,
      session: t.session,
      also: this.#orphansOf(t),
    });
    return result;
  }

  /**
   * Ends orphans by exact argv (see sweep()), never touching an instance
   * this supervisor tracks. Findings arrive as a sweep event; SIGKILLs and
   * survivors as warnings.
   */
  async sweep(options: SweepOptions): Promise<SweepResult> {
    this.#assertOpen();
    validateSweep(options);
    const pinned = [...this.#table.values()].flatMap((t) => pinnedOf(t) ?? []);
    const tracked = pinned.map((p) => p.handle.pid);
    // Whatever is in an instance's cgroup is that instance's, whatever its argv says: never an orphan.
    const members = pinned.flatMap((p) => p.cgroup?.procs() ?? []);
    const exclude = new Set([...(options.exclude ?? []), ...tracked, ...members, ...this.#unsettledPids()]);
    const result = await sweep({ ...options, exclude });
    this.#reportSweep(options, result);
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
    for (const [id, t] of this.#table) {
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

  #reportSweep(options: SweepOptions, r: SweepResult): void {
    const pids = (l: ProcessIdentity[]) => l.map((i) => i.pid);
    if (r.matched.length === 0) return;
    const argv = validateSweep(options);
    this.#emit('sweep', {
      argv,
      dryRun: options.dryRun === true,
      matched: pids(r.matched),
      terminated: pids(r.terminated),
      killed: pids(r.killed),
      survivors: pids(r.survivors),
      message: `${options.dryRun ? 'would end' : 'ended'} ${r.matched.length} orphan(s) matching ${JSON.stringify(argv.map(displayArg)).slice(0, 120)}`,
    });
    if (r.killed.length)
      this.#emit('warning', { message: `sweep: pids ${pids(r.killed).join(', ')} ignored SIGTERM and were killed` });
    if (r.survivors.length)
      this.#emit('warning', { message: `sweep: pids ${pids(r.survivors).join(', ')} survived the sweep's deadline` });
  }

  #startSweeps(config: { intervalMs: number; patterns: SweepOptions[] }): void {
    this.#sweepTimer = setInterval(() => {
      if (this.#sweeping || this.#closed) return;
      this.#sweeping = true;
      void (async () => {
        for (const pattern of config.patterns) {
          try {
            await this.sweep(pattern);
          } catch (err) {
            this.#emit('warning', { message: `periodic sweep failed: ${(err as Error).message}` });
          }
        }
      })().finally(() => (this.#sweeping = false));
    }, config.intervalMs);
    this.#sweepTimer.unref();
  }

  /** Forgets an instance that has exited (its state is already gone). Refuses a quarantined one. */
  remove(id: string): void {
    this.#assertOpen();
    assertId(id);
    const t = this.#table.get(id);
    if (!t) throw notFound(id);
    if (t.status === 'quarantined') throw new QuarantinedError(id, t.reason);
    if (t.status !== 'exited')
      throw new CustodyError(
        'ERR_CUSTODY_BUSY',
        `instance ${id} is ${t.status}${t.status === 'stopping' ? '' : '; stop() it instead'}`,
      );
    this.#table.delete(id);
  }

  /** Every instance with its status; a quarantined one never hides the others. */
  list(): InstanceSummary[] {
    return [...this.#table].map(([id, t]) => info(id, t));
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
    for (const [id, t] of [...this.#table]) {
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
    // Its cgroup goes only if nothing is in it (rmdir refuses otherwise): nothing is signalled.
    await this.#cgroups
      ?.find(t.manifest?.cgroup)
      ?.remove(0)
      .catch(() => {});
    await this.#store.remove(id);
    if (this.#table.get(id) === t) this.#table.delete(id);
    const message = `quarantine of ${id} released by the operator (${t.reason}); nothing was signalled`;
    this.#emit('release', { id, pid: t.manifest?.identity?.pid, reason: t.reason, message });
  }

  /**
   * State of a process proven gone. A removal that fails (EIO, EROFS) does
   * not undo that proof: a warning, and recovery cleans the manifest later.
   */
  async #removeState(id: string): Promise<void> {
    try {
      await this.#store.remove(id);
    } catch (err) {
      const why = (err as Error).message;
      this.#emit('warning', {
        id,
        message: `${id} is gone, but its state could not be removed (recovery will clean it): ${why}`,
      });
    }
  }

  /**
   * Releases the lock and the pidfds once what is under way has finished (a
   * launch in flight undoes itself, a stop completes); supervised processes
   * keep running (their children are still reaped if they exit while we run).
   */
  async close(): Promise<void> {
    if (this.#closed) return;
    this.#closed = true;
    if (this.#sweepTimer) clearInterval(this.#sweepTimer);
    while (this.#pending.size) await Promise.allSettled([...this.#pending]);
    // After the launches in flight: one that completed meanwhile kept its socket too.
    for (const n of this.#notifiers) n.close();
    this.#notifiers.clear();
    this.#logs.close();
    this.#releaseAll();
  }

  #releaseAll(): void {
    if (this.#subreaper) {
      this.#subreaper = false;
      removeReaperSource(this.#sessions);
      releaseSubreaper();
    }
    this.#reserve.release();
    for (const t of this.#table.values()) pinnedOf(t)?.handle.close();
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

/** What list() says of one record. */
function info(id: string, t: Tracked): InstanceSummary {
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
  const p = pinnedOf(t);
  if (!p) return { id, status, pid: null, ppid: null };
  const { handle, instance } = p;
  // identity.ppid is the parent at launch; a daemon's changes when its launcher exits.
  const ppid =
    p.status === 'running' && !handle.hasExited ? liveParent(handle.pid, instance.identity.startTicks) : null;
  const out: InstanceSummary = { id, status, pid: handle.pid, ppid };
  if (p.status === 'exited') out.exit = p.exit;
  if (p.cgroup) out.cgroup = p.cgroup.path;
  return out;
}

function liveParent(pid: number, startTicks: number | undefined): number | null {
  const st = backend.stat(pid);
  return st && st.startTicks === startTicks ? st.ppid : null;
}

/**
 * PR_SET_CHILD_SUBREAPER is process-wide: supervisors share it, counted, and
 * the last one that asked turns it off again, if it was off before the first.
 */
let subreaperHolders = 0;
let subreaperWasOn = false;

function acquireSubreaper(): boolean {
  if (subreaperHolders === 0) {
    subreaperWasOn = backend.childSubreaper() === true;
    if (!subreaperWasOn && !backend.setChildSubreaper(true)) return false;
  }
  subreaperHolders++;
  return true;
}

function releaseSubreaper(): void {
  if (--subreaperHolders === 0 && !subreaperWasOn) backend.setChildSubreaper(false);
}

/** Enough for a process-table scan and a pin (a dir, a stat, a cmdline, a pidfd). */
const RESERVE_FDS = 4;

/** The longest an exited main's session scan is waited for (its zombie is held meanwhile; a busy table takes tens of ms). */
const LEFTOVER_SCAN_MS = 500;

/** Fds held (on /dev/null) so that undoing a launch can run when the fd table is otherwise full. */
class FdReserve {
  #fds: number[] = [];
  readonly #size: number;

  constructor(size: number) {
    this.#size = size;
  }

  /** Takes back what it can; fewer when the table is still full, and the next refill tries again. */
  refill(): void {
    while (this.#fds.length < this.#size) {
      try {
        this.#fds.push(openSync('/dev/null', 'r'));
      } catch {
        return;
      }
    }
  }

  release(): void {
    for (const fd of this.#fds.splice(0)) closeSync(fd);
  }
}

function notFound(id: string, status?: InstanceStatus, wanted = 'running or exited'): CustodyError {
  return new CustodyError(
    'ERR_CUSTODY_NOT_FOUND',
    status ? `instance ${id} is ${status}, not ${wanted}` : `no instance ${id}`,
  );
}

/** The caps the manifest records: null where the launch's output does not go to custody's log files. */
function logCaps(options: LaunchSpec['logs']): { maxBytes: number; keep: number } | null {
  if (options === false) return null;
  const { maxBytes, keep } = logLimits(options);
  return { maxBytes, keep };
}
