/**
 * The Supervisor's public option and result shapes, apart from the class, so
 * that the modules it delegates to and the checks of each option share them.
 */
import type { CgroupOptions } from './process/cgroup.js';
import type { EventSink } from './events.js';
import type { Instance } from './lifecycle/launch.js';
import type { SweepOptions } from './process/sweep.js';
import type { TerminateResult } from './process/terminate.js';
import type { ExitStatus } from './types.js';

export type InstanceStatus = 'starting' | 'running' | 'exited' | 'stopping' | 'quarantined' | 'deferred';

export interface InstanceInfo {
  id: string;
  status: InstanceStatus;
  pid: number | null;
  /** The live parent pid, read now (a daemon is re-parented after its launcher exits); null once it is gone. */
  ppid: number | null;
  reason?: string;
  field?: string;
  exit?: ExitStatus;
  /** The instance's cgroup (absolute path), where it has one. */
  cgroup?: string | null;
}

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
  /** Keep the event loop alive while supervised processes run. Default false: they are detached daemons. */
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
  sweep?: { intervalMs: number; patterns: SweepOptions[] };
  /**
   * Instance cgroups (cgroup v2): `root` is a cgroup directory this process
   * may create cgroups in (created if absent). Each launch gets its own
   * cgroup below it, entered before exec; stop ends the whole cgroup;
   * freeze(), thaw(), usage() and LaunchSpec.limits work on it. A root that
   * is relative, not on a cgroup v2 mount, not a directory or not writable is
   * ERR_CUSTODY_BAD_CGROUP. Without it nothing changes.
   */
  cgroup?: CgroupOptions;
}

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

/** How a stop ended: what terminate() says of the main process (the instance is stopped as a whole). */
export type StopResult = TerminateResult;
