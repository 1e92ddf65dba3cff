/**
 * Recovery's effects: what carries a decision out (state written or
 * removed, the supervisor told, events emitted, the report kept), for every
 * kind of manifest alike. Nothing here decides; src/recovery/decide.ts does.
 */
import { capabilities } from '../backend/index.js';
import type { Emit } from '../events.js';
import { type CgroupRoot, InstanceCgroup } from '../process/cgroup.js';
import { removeCgroup } from '../process/cgroup-tree.js';
import { UnsafePathError } from '../errors.js';
import type { ProcessHandle } from '../process/handle.js';
import { isMember } from '../process/ownership.js';
import { terminateCgroup } from '../process/tree.js';
import { removeDeclaredPaths } from '../state/paths.js';
import type {
  BackoffManifest,
  FailedManifest,
  Manifest,
  QuarantinedManifest,
  RunningManifest,
} from '../state/manifest.js';
import type { StateStore } from '../state/store.js';
import { decideFailure, type Outcome, type Platform } from './decide.js';
import { pin } from './pins.js';
import type { RecoveryEntry, RecoveryHost, RecoveryReport } from './host.js';

/** Cleaned instances' removals under way at once: enough to keep libuv's threadpool (4 threads) fed, few enough to leave it to the scan and the pins. */
const REMOVALS_IN_FLIGHT = 8;

export type Quarantined = Extract<Outcome, { do: 'quarantine' }>;
export type Cleaned = Extract<Outcome, { do: 'clean' }>;

export class RecoveryEffects {
  readonly report: RecoveryReport = { adopted: [], repaired: [], cleaned: [], quarantined: [], deferred: [] };
  readonly host: RecoveryHost;
  readonly emit: Emit;
  readonly store: StateStore;
  readonly platform: Platform;
  // Cleaned instances' state is removed on the threadpool, a few at a time, while the next manifests are
  // judged; they share one fsync of the state dir, once all are removed. An instance is reported cleaned
  // once its state is gone; a removal that fails is deferred (transient) or fails recover(), as before.
  #unsynced = false;
  readonly #removing = new Set<Promise<void>>();
  #removalFailure: { error: unknown } | undefined;

  constructor(host: RecoveryHost) {
    this.host = host;
    this.emit = host.emit;
    this.store = host.store;
    this.platform = { provable: capabilities().proc, allowUnprovable: host.allowUnprovable };
  }

  async quarantine(id: string, manifest: Manifest | null, o: Quarantined): Promise<RecoveryEntry> {
    const { reason, field } = o;
    let m = manifest;
    const pid = m?.identity?.pid;
    if (m && o.persist && m.state !== 'quarantined') {
      const at = new Date().toISOString();
      const q: QuarantinedManifest = {
        ...m,
        state: 'quarantined',
        quarantine: { reason, ...(field ? { field } : {}), at },
        updatedAt: at,
      };
      try {
        await this.store.write(q);
        m = q;
      } catch (err) {
        this.emit('warning', { id, message: `could not persist the quarantine of ${id}: ${(err as Error).message}` });
      }
    }
    this.host.quarantine(id, m, reason, field);
    const entry: RecoveryEntry = { id, ...(pid ? { pid } : {}), reason, ...(field ? { field } : {}) };
    this.report.quarantined.push(entry);
    this.emit('quarantine', {
      ...entry,
      message: `${id} quarantined: ${reason}${field ? ` (${field})` : ''}; it will not be signalled`,
    });
    return entry;
  }

  /**
   * The instance is over: what is left in its cgroup ended, declared paths and state removed (off this thread).
   * A directory at its cgroup's path that custody may not act through quarantines it instead: nothing is
   * signalled through it, nothing removed.
   */
  async clean(m: Manifest, o: Cleaned, pid?: number): Promise<void> {
    // After a reboot the recorded cgroup is not the instance's, whatever is at its path now (ids recur).
    const cg = o.reason === 'rebooted' ? 'gone' : this.#recorded(m);
    if (cg instanceof UnsafePathError) {
      await this.quarantine(m.id, m, { do: 'quarantine', reason: 'mismatch', field: 'cgroup', persist: true });
      return;
    }
    // Whatever is left in its cgroup is provably the instance's, which is over: ended first, then the cgroup goes.
    if (cg instanceof InstanceCgroup) await this.#endCgroup(m, cg, o.graceMs);
    removeDeclaredPaths(m.paths, this.emit, m.id);
    // A run that ended while no one watched is an end like any other: its policy may restart it.
    const owes = m.restart || m.owed || m.keepAlive?.afterExit;
    const settled = owes && o.reason !== 'incomplete' ? await this.host.ended(m) : null;
    if (settled === 'waiting') {
      // A hook owed with no spec to run it: the state waits, shown exited (no-spec).
      this.report.adopted.push({ id: m.id, ...(pid ? { pid } : {}), reason: 'no-spec' });
      return;
    }
    if (settled === 'settled') {
      const entry: RecoveryEntry = { id: m.id, ...(pid ? { pid } : {}), reason: o.reason };
      this.host.forget(m.id);
      this.report.cleaned.push(entry);
      this.emit('clean', { ...entry, message: cleanedMessage(m.id, o.reason) });
      return;
    }
    while (this.#removing.size >= REMOVALS_IN_FLIGHT) await Promise.race(this.#removing);
    this.#unsynced = true;
    const removal: Promise<void> = this.store
      .remove(m.id, { sync: false })
      .then(
        () => {
          const entry: RecoveryEntry = { id: m.id, ...(pid ? { pid } : {}), reason: o.reason };
          this.host.forget(m.id);
          this.report.cleaned.push(entry);
          this.emit('clean', { ...entry, message: cleanedMessage(m.id, o.reason) });
        },
        (err: unknown) => {
          const failed = decideFailure(err);
          if (failed.do === 'defer') this.defer(m.id, failed.error);
          else this.#removalFailure ??= { error: err };
        },
      )
      .finally(() => this.#removing.delete(removal));
    this.#removing.add(removal);
  }

  /** An outcome that keeps no process: cleaned, quarantined or deferred. */
  async conclude(m: Manifest, o: Outcome, pid?: number): Promise<void> {
    if (o.do === 'clean') return this.clean(m, o, pid);
    if (o.do === 'quarantine') {
      await this.quarantine(m.id, m, o);
      return;
    }
    if (o.do === 'defer') return this.defer(m.id, o.error);
    throw new Error(`recovery of ${m.id} cannot ${o.do} here`);
  }

  /** A backoff or failed manifest: adopted with that status (nothing runs, nothing to prove). */
  adoptResting(m: BackoffManifest | FailedManifest): void {
    this.host.adoptResting(m);
    this.report.adopted.push({ id: m.id, reason: m.state });
  }

  adopt(m: RunningManifest, handle: ProcessHandle, cg: InstanceCgroup | null, reason?: string): void {
    this.host.adopt(m, handle, cg);
    this.report.adopted.push({ id: m.id, pid: handle.pid, ...(reason ? { reason } : {}) });
  }

  /** Rewrites a proven manifest in the current format and state; a failure is a warning, the proof stands. */
  async rewrite(m: RunningManifest): Promise<void> {
    await this.store.write(m).catch((err: unknown) =>
      this.emit('warning', {
        id: m.id,
        message: `could not rewrite ${m.id}'s manifest in the current format: ${(err as Error).message}`,
      }),
    );
  }

  defer(id: string, error: Error): void {
    // Nothing was signalled or removed; a later recover() decides.
    this.host.defer(id, error);
    const entry = { id, reason: (error as NodeJS.ErrnoException).code ?? 'transient', error };
    this.report.deferred.push(entry);
    this.emit('warning', {
      id,
      reason: entry.reason,
      message: `${id}: recovery deferred (${error.message}); the supervisor looks again on its own, 1 s on and doubling to 60 s (recover() looks now)`,
    });
  }

  /**
   * The recorded cgroup as recovery judges by it, found by its recorded path
   * and id whatever root this supervisor was opened with (or none): the same
   * cgroup; 'gone' where it is no more (nothing can run outside a cgroup it
   * was placed in, and a populated cgroup cannot be removed), and where a
   * directory there may not be acted through (a running instance is then
   * quarantined, and a clean quarantines the others); null where none was recorded.
   */
  cgroupOf(m: Manifest): InstanceCgroup | 'gone' | null {
    if (!m.cgroup) return null;
    const cg = this.#recorded(m);
    return cg instanceof UnsafePathError ? 'gone' : cg;
  }

  readonly #refused = new Set<string>();

  /** The recorded cgroup, gone, or why custody may not act through what is at its path (said once per instance). */
  #recorded(m: Manifest): InstanceCgroup | 'gone' | UnsafePathError | null {
    if (!m.cgroup) return null;
    try {
      return InstanceCgroup.recorded(m.cgroup);
    } catch (err) {
      if (!(err instanceof UnsafePathError)) throw err;
      if (!this.#refused.has(m.id)) {
        this.#refused.add(m.id);
        this.emit('warning', {
          id: m.id,
          path: err.path,
          message: `${m.id}: its cgroup ${err.message}; nothing is signalled through it`,
        });
      }
      return err;
    }
  }

  /** Once every manifest is judged: the removals settled and made durable, then the cgroups no manifest names. */
  async finish(): Promise<RecoveryReport> {
    await this.settle();
    if (this.#removalFailure) throw this.#removalFailure.error;
    if (this.#unsynced) await this.store.syncDir();
    if (this.host.cgroups) await this.#unnamedCgroups(this.host.cgroups);
    return this.report;
  }

  /** Waits for every removal under way, failed or not. */
  async settle(): Promise<void> {
    await Promise.allSettled(this.#removing);
  }

  /** Ends what is in an instance's cgroup (SIGTERM and graceMs first, where given) and removes it. */
  async #endCgroup(m: Manifest, cg: InstanceCgroup, graceMs: number): Promise<void> {
    const left = cg.procs();
    if (cg.populated()) {
      const roots = graceMs > 0 ? left.flatMap((pid) => memberPin(pid, cg)) : [];
      try {
        await terminateCgroup(cg, roots, {
          graceMs,
          onEscalate: ({ pid }) =>
            this.emit('escalate', {
              id: m.id,
              pid,
              message: `pid ${pid} in the cgroup of ${m.id} ignored SIGTERM; cgroup.kill`,
            }),
        });
      } finally {
        for (const h of roots) h.close();
      }
      this.emit('warning', {
        id: m.id,
        pids: left,
        message: `${m.id}: ${left.length} process(es) left in its cgroup were ended with it`,
      });
    }
    await removeCgroup(cg, this.emit, m.id);
  }

  /**
   * Cgroups of this supervisor's that no manifest names (one deleted by
   * hand, or a crash between creating a cgroup and writing its manifest):
   * removed when empty; reported, and left alone, when something runs in it.
   */
  async #unnamedCgroups(root: CgroupRoot): Promise<void> {
    const named = new Set<string>();
    for (const id of this.store.ids()) {
      try {
        const m = this.store.read(id);
        if (m.cgroup) named.add(m.cgroup.path);
      } catch {
        // an unreadable manifest names nothing: its cgroup, if populated, is reported below
      }
    }
    for (const cg of root.list()) {
      if (named.has(cg.path) || this.host.usesCgroup(cg.path)) continue;
      if (!cg.populated()) {
        await removeCgroup(cg, this.emit, undefined, 0);
        continue;
      }
      this.emit('warning', {
        pids: cg.procs(),
        cgroup: cg.path,
        message: `cgroup ${cg.path} holds processes but no manifest names it: left alone, nothing signalled`,
      });
    }
  }
}

function cleanedMessage(id: string, reason: Cleaned['reason']): string {
  if (reason === 'stopped') return `${id}: a stop cut off midway was finished (what it proved ended); state cleaned`;
  return `${id}: ${reason}; state cleaned, nothing signalled`;
}

/** A pin on a pid proven (under the pin) to be in the cgroup; [] when it is not, or gone. */
function memberPin(pid: number, cg: InstanceCgroup): ProcessHandle[] {
  const p = pin(pid);
  if (p && isMember(p.identity, { pids: new Set(), cgroup: cg.node })) return [p.handle];
  p?.handle.close();
  return [];
}
