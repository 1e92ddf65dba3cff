/**
 * What a Supervisor lends the modules it delegates an instance's life to
 * (attempt, exits, stop): its state dir, its table, its event sink, and the
 * few decisions that stay its own (whether it is closed, what is in
 * flight, the fd reserve, the subreaper).
 */
import type { Emit } from '../events.js';
import type { CgroupRoot } from '../process/cgroup.js';
import type { SupervisorOptions } from '../options.js';
import type { InstanceLogs } from '../state/logs.js';
import type { StateStore } from '../state/store.js';
import type { Backoff, InstanceTable, Running } from './instances.js';
import type { NotifyChannel } from './notify.js';

export interface LifecycleHost {
  readonly store: StateStore;
  readonly emit: Emit;
  readonly table: InstanceTable;
  readonly logs: InstanceLogs;
  readonly cgroups: CgroupRoot | null;
  readonly options: SupervisorOptions;
  /** close() has begun: nothing new is watched or launched. */
  readonly closed: boolean;
  /** This supervisor holds the process's subreaper flag. */
  readonly subreaper: boolean;
  /** The sd_notify sockets of running instances launched with ready: 'notify'. */
  readonly notifiers: Set<NotifyChannel>;
  /** Cgroups of launches in flight (made before their manifest is written). */
  readonly launching: Set<string>;
  /** Registers an operation that uses the state dir: close() lets it finish first. */
  inFlight<T>(p: Promise<T>): Promise<T>;
  /** Runs the undoing of a launch with the fd reserve released, for a launch that failed for want of fds. */
  withRoom<T>(undo: () => Promise<T>): Promise<T>;
  /** Reaps what re-parenting brought us, as a subreaper (a warning if it cannot look now). */
  reap(): void;
  /** Watches a running instance's held exit again (src/lifecycle/exits.ts), after a stop that never began. */
  holdExitOf(t: Running): void;
  /** A backoff's restart is due: launch it again (src/lifecycle/restart.ts). */
  relaunch(id: string, record: Backoff): void;
}
