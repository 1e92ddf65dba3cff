/**
 * What recovery reports and what it needs from its supervisor: the types
 * recover.ts (which orchestrates) and effects.ts (which carries out and
 * reports) share. A leaf of its own, so that neither imports the other for
 * them.
 */
import type { Emit } from '../events.js';
import type { CgroupRoot, InstanceCgroup } from '../process/cgroup.js';
import type { ProcessHandle } from '../process/handle.js';
import type { BackoffManifest, FailedManifest, Manifest, RunningManifest } from '../state/manifest.js';
import type { StateStore } from '../state/store.js';

/** One manifest of a RecoveryReport: its id, pid, and why it ended as it did. */
export interface RecoveryEntry {
  id: string;
  pid?: number;
  reason?: string;
  field?: string;
}

/** What recovery did with each manifest when the supervisor opened (`Supervisor.open()`'s `report`, `supervisor.recover()`). */
export interface RecoveryReport {
  adopted: RecoveryEntry[];
  repaired: RecoveryEntry[];
  cleaned: RecoveryEntry[];
  quarantined: RecoveryEntry[];
  /** Not decided now (the kernel could not answer: EMFILE, ENOMEM, EIO...); a later recover() decides them. */
  deferred: Array<RecoveryEntry & { error: Error }>;
}

/** The few things recovery needs from its supervisor: no more. */
export interface RecoveryHost {
  readonly store: StateStore;
  readonly emit: Emit;
  /** Adopt without proof where the platform cannot prove identity (a warning each time). */
  readonly allowUnprovable: boolean;
  /** The supervisor's cgroup root, where it has one. */
  readonly cgroups: CgroupRoot | null;
  /** Whether a cgroup (by path) belongs to an instance the supervisor tracks or is launching right now. */
  usesCgroup(path: string): boolean;
  /** Whether recovery should (re)consider this id: not tracked, or deferred earlier. */
  wants(id: string): boolean;
  adopt(manifest: RunningManifest, handle: ProcessHandle, cgroup: InstanceCgroup | null): void;
  quarantine(id: string, manifest: Manifest | null, reason: string, field?: string): void;
  defer(id: string, error: Error): void;
  /** Recovery cleaned this id's state (or found none of custody's): a deferral of it is over. */
  forget(id: string): void;
  /** A backoff or failed manifest: no process, nothing to prove; the supervisor takes it on with that status. */
  adoptResting(manifest: BackoffManifest | FailedManifest): void;
  /**
   * The run of an instance is over (its process gone, or a stop of it finished) and its state is about to go:
   * where its end owes more (an afterExit hook, a restart), the supervisor settles it instead: `settled` (its
   * state removed, or kept as backoff or failed), `waiting` (a hook owed with no spec: kept, shown exited);
   * null: nothing more, the state goes as any other's.
   */
  ended(manifest: Manifest): Promise<'settled' | 'waiting' | null>;
}
