/**
 * Recovery's pins: a process read under a pidfd (the native backend) or a
 * start-time re-check (js), so that what was judged is what gets adopted or
 * signalled. The recorded pids of running manifests are pinned ahead, on
 * the threadpool, while this thread decides.
 */
import { backend } from '../backend/index.js';
import type { PidRef, RawIdentity } from '../backend/types.js';
import { isNoProcess } from '../process/identity.js';
import { pin as pinProcess, type Pinned, pinnedFrom } from '../process/pin.js';

export type { Pinned } from '../process/pin.js';

/** Recovery's pin: the one pin(), reaping a zombie child of ours (what an exited launch left). */
export function pin(pid: number): Pinned | null {
  return pinProcess(pid, { reapIfChild: true });
}

/** Whether a pinned process has not been reaped: signal 0 through its pin; EPERM (another uid's) proves it is there. */
function stillThere(ref: PidRef): boolean {
  try {
    return ref.signal(0);
  } catch {
    return true;
  }
}

/** Pids per batch of pins taken ahead, and batches on the threadpool at once (see PinsAhead). */
const PIN_BATCH = 128;
const PIN_BATCHES_IN_FLIGHT = 2;

/**
 * The pins of the recorded pids of running manifests, taken ahead, in the
 * order recovery will want them, in batches on the backend's threadpool:
 * each is tens of microseconds of /proc reads, thousands of them at a
 * restart, done while this thread reads manifests and decides. A pin taken
 * ahead is what pin() would have read then, and the pidfd keeps it the same
 * process; one whose process has been reaped since is read again, now, as
 * pin() reads (its pid may be someone else's by then). A few batches at a
 * time: what is taken ahead holds a pidfd per live process until taken.
 */
export class PinsAhead {
  readonly #pending = new Map<number, Promise<{ raw: RawIdentity; ref: PidRef } | Error>>();
  readonly #batches: number[][] = [];
  readonly #pinMany: NonNullable<typeof backend.inspectPinnedMany> | undefined;

  /** Where the backend reads only on this thread, nothing is taken ahead: pin() reads each when it is wanted. */
  constructor(pids: readonly number[]) {
    this.#pinMany = backend.inspectPinnedMany?.bind(backend);
    if (!this.#pinMany) return;
    const unique = [...new Set(pids)];
    for (let k = 0; k < unique.length; k += PIN_BATCH) this.#batches.push(unique.slice(k, k + PIN_BATCH));
    for (let k = 0; k < PIN_BATCHES_IN_FLIGHT; k++) this.#next();
  }

  #next(): void {
    const batch = this.#batches.shift();
    if (!batch || !this.#pinMany) return;
    const rows = this.#pinMany(batch, { reapIfChild: true });
    void rows.then(
      () => this.#next(),
      () => this.#next(),
    );
    batch.forEach((pid, k) => {
      const row = rows.then((r) => r[k] as { raw: RawIdentity; ref: PidRef } | Error);
      // Taken or not, never an unhandled rejection: take() and close() see the error.
      row.catch(() => {});
      this.#pending.set(pid, row);
    });
  }

  /** The pin of pid as pin() reads it; undefined where none was taken ahead (or it was taken already). */
  async take(pid: number): Promise<Pinned | null | undefined> {
    const row = this.#pending.get(pid);
    if (!row) return undefined;
    this.#pending.delete(pid);
    const r = await row;
    if (r instanceof Error) {
      if (isNoProcess(r)) return null;
      throw r;
    }
    if (!stillThere(r.ref)) {
      r.ref.close();
      return pin(pid);
    }
    return pinnedFrom(pid, r);
  }

  /** Releases every pin not taken, once its batch is in. */
  async close(): Promise<void> {
    this.#batches.length = 0;
    const rest = [...this.#pending.values()];
    this.#pending.clear();
    for (const row of rest) {
      const r = await row.catch((err: unknown) => err as Error);
      if (!(r instanceof Error)) r.ref.close();
    }
  }
}
