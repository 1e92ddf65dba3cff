/**
 * The Supervisor's public option and result shapes, apart from the class, so
 * that the modules it delegates to and the checks of each option share them;
 * and those checks: everything Supervisor.open() and stop() refuse is refused
 * here, before anything is touched.
 */
import { InvalidArgError } from './errors.js';
import type { EventSink } from './events.js';
import type { Instance, LaunchSpec } from './lifecycle/launch.js';
import { type CgroupOptions, CgroupRoot } from './process/cgroup.js';
import { type SweepOptions, validateSweep } from './process/sweep.js';
import type { LastExit } from './types.js';
import { assertDuration, assertFlag, assertKnownKeys } from './validate.js';

export type { InstanceStopResult, StopResult } from './types.js';

/** The status of an instance in `list()`. */
export type InstanceStatus =
  | 'starting'
  | 'running'
  | 'exited'
  | 'stopping'
  | 'quarantined'
  | 'deferred'
  | 'backoff'
  | 'failed';

/** One row of Supervisor.list(): an instance as it stands when listed. */
export interface InstanceSummary {
  id: string;
  status: InstanceStatus;
  pid: number | null;
  /** The live parent pid, read now (a daemon is re-parented after its launcher exits); null once it is gone. */
  ppid: number | null;
  reason?: string;
  field?: string;
  /** An exited instance's end, and why (systemd's Result=); a backoff or failed one's last end. */
  exit?: LastExit;
  /** The restarts its policy made since launch(), where it has a restart policy. */
  restarts?: number;
  /** The instance's cgroup (absolute path), where it has one. */
  cgroup?: string | null;
}

/** @deprecated Renamed InstanceSummary (what list() returns); this alias goes in the next minor version. */
export type InstanceInfo = InstanceSummary;

/** Options of `Supervisor.open()`. */
export interface SupervisorOptions {
  /**
   * Custody's own dir: created 0700 if missing, stamped `.custody`; refused
   * if it is /, $HOME, /etc, a dir that is not custody's, or a path another
   * uid could change (ERR_CUSTODY_NOT_CUSTODY_DIR, ERR_CUSTODY_UNSAFE_PATH).
   */
  stateDir: string;
  /** Create the state dir when it does not exist (default true); false: ERR_CUSTODY_NO_STATE_DIR, nothing created. */
  create?: boolean;
  /** Receives every event; also published on diagnostics_channel `custody:<type>`. Warnings never get lost: without a sink they become process warnings. */
  onEvent?: EventSink;
  /** Off Linux or without /proc ownership cannot be proven: adopt anyway (a warning each time) instead of quarantining. */
  allowUnprovable?: boolean;
  /**
   * Hold the event loop while supervised processes run, as a ref'd timer or
   * socket does. Default false: they are detached daemons, and the agent may
   * end while they run. Awaiting an instance's `exited` holds the loop
   * until it settles either way.
   */
  ref?: boolean;
  /** @deprecated Renamed `ref`; this alias goes in the next minor version (giving both is ERR_CUSTODY_INVALID_ARG). */
  keepAlive?: boolean;
  /**
   * Become a child subreaper (PR_SET_CHILD_SUBREAPER, native backend): a
   * daemon that double-forks away from its launcher (QEMU -daemonize) is
   * re-parented to this process instead of init, stays visible, and custody
   * reaps it when it exits. Process-wide; only pids custody launched or
   * adopted are reaped, never children of Node's child_process.
   */
  subreaper?: boolean;
  /** Heal leaked helpers while idle: sweep these exact-argv patterns every intervalMs; findings arrive as sweep events. */
  sweep?: {
    /** How often, in ms. */
    intervalMs: number;
    /** The sweeps to run, each as `sweep()` takes it. */
    patterns: SweepOptions[];
  };
  /**
   * Instance cgroups (cgroup v2): `root` is a cgroup directory this process
   * may create cgroups in (created if absent). Each launch gets its own
   * cgroup below it, entered before exec; stop ends the whole cgroup;
   * freeze(), thaw(), usage() and LaunchSpec.limits work on it. A root that
   * is relative, not on a cgroup v2 mount, not a directory or not writable is
   * ERR_CUSTODY_BAD_CGROUP. Without it nothing changes.
   */
  cgroup?: CgroupOptions;
  /**
   * The specs of instances this supervisor may adopt, by id: what a manifest cannot hold (functions). An
   * adopted instance takes its `health` probe from here; one launched with a probe or a watchdog whose spec
   * is not given runs without it (a warning says so).
   */
  specs?: Record<string, LaunchSpec>;
}

/** Options of `supervisor.stop(id, options)`. */
export interface StopOptions {
  /**
   * Stop the instance, not just its main process (default true): every
   * member (its descendants, and the session custody created for it) is
   * pinned and signalled through its own pidfd, rescanned until none is left
   * after SIGKILL. false: the main process only. With a cgroup the instance
   * is its cgroup (SIGTERM to the main process, cgroup.kill after the grace)
   * and false is ERR_CUSTODY_INVALID_ARG.
   */
  tree?: boolean;
  /** Bound of the graceful phase: the hook, or the wait after SIGTERM when there is no hook. Default 30000. */
  graceMs?: number;
  /**
   * Ask the process to stop its own way (e.g. a VM powerdown over its control socket).
   * Sync or async; bounded by graceMs.
   */
  graceful?: (instance: Instance, signal: AbortSignal) => unknown;
  /** After a graceful hook, how long SIGTERM may take before SIGKILL. Default 2000. */
  termGraceMs?: number;
  /**
   * Already aborted: AbortError, nothing signalled. Aborted midway: "force it now": SIGKILL, a bounded wait
   * (5 s) until it is gone, its state removed, then AbortError. Never a half-stopped process.
   */
  signal?: AbortSignal;
}

const SUPERVISOR_OPTION_KEYS: Record<keyof SupervisorOptions, true> = {
  stateDir: true,
  create: true,
  onEvent: true,
  allowUnprovable: true,
  ref: true,
  keepAlive: true,
  subreaper: true,
  sweep: true,
  cgroup: true,
  specs: true,
};
const SWEEP_KEYS: Record<keyof NonNullable<SupervisorOptions['sweep']>, true> = { intervalMs: true, patterns: true };
const CGROUP_KEYS: Record<keyof CgroupOptions, true> = { root: true };
const STOP_OPTION_KEYS: Record<keyof StopOptions, true> = {
  tree: true,
  graceMs: true,
  graceful: true,
  termGraceMs: true,
  signal: true,
};

/** Supervisor.open()'s options, checked before the state dir (or a cgroup) is touched. */
export function validateSupervisorOptions(options: SupervisorOptions): void {
  if (!options || typeof options !== 'object') throw new InvalidArgError('Supervisor.open needs { stateDir }');
  assertKnownKeys(options, SUPERVISOR_OPTION_KEYS, 'SupervisorOptions');
  if (options.onEvent !== undefined && typeof options.onEvent !== 'function')
    throw new InvalidArgError('onEvent must be a function');
  for (const flag of ['create', 'allowUnprovable', 'ref', 'keepAlive', 'subreaper'] as const)
    assertFlag(options[flag], flag);
  if (options.ref !== undefined && options.keepAlive !== undefined)
    throw new InvalidArgError('give ref or its deprecated alias keepAlive, not both');
  if (options.cgroup !== undefined) {
    if (options.cgroup && typeof options.cgroup === 'object')
      assertKnownKeys(options.cgroup, CGROUP_KEYS, 'SupervisorOptions.cgroup');
    CgroupRoot.validate(options.cgroup);
  }
  if (options.sweep !== undefined) {
    const sw = options.sweep;
    if (!sw || typeof sw !== 'object' || !Array.isArray(sw.patterns))
      throw new InvalidArgError('sweep must be { intervalMs, patterns }');
    assertKnownKeys(sw, SWEEP_KEYS, 'SupervisorOptions.sweep');
    assertDuration(sw.intervalMs, 'sweep.intervalMs');
    if (sw.intervalMs < 100) throw new InvalidArgError('sweep.intervalMs must be at least 100');
    for (const p of sw.patterns) validateSweep(p);
  }
  // specs: checked by validateSpecs (src/lifecycle/spec.ts), as launch() checks one.
}

/** Whether a supervisor's instances hold the event loop while they run (`ref`, or its old name). */
export function holdsLoop(options: SupervisorOptions): boolean {
  return (options.ref ?? options.keepAlive) === true;
}

/** stop()'s options, checked before anything is signalled. */
export function validateStopOptions(options: StopOptions): void {
  if (!options || typeof options !== 'object') throw new InvalidArgError('stop() options must be an object');
  assertKnownKeys(options, STOP_OPTION_KEYS, 'StopOptions');
  assertFlag(options.tree, 'tree');
  if (options.graceMs !== undefined) assertDuration(options.graceMs, 'graceMs');
  if (options.termGraceMs !== undefined) assertDuration(options.termGraceMs, 'termGraceMs');
  if (options.graceful !== undefined && typeof options.graceful !== 'function')
    throw new InvalidArgError('graceful must be a function');
  if (options.signal !== undefined && !(options.signal instanceof AbortSignal))
    throw new InvalidArgError('signal must be an AbortSignal');
}
