/**
 * The native backend's exit watcher: the one table that routes the addon's
 * batched pidfd exit reports to the pins waiting on them. Its own module
 * because it is per addon, not per backend (every backend and both builds on
 * one addon share it), and the pins only register with it.
 */
import type { NativeAddon } from './addon.js';

/** Told of a watched pidfd's exit (see ExitWatches). */
export interface ExitListener {
  /** code: the si_code of the child a reaping watch reaped, 0 when none was, -errno when its waitid failed. */
  exitReported(code: number, status: number): void;
}

/** Int32 slots per reported exit in the addon's event array: id, code, status. */
const EXIT_EVENT_SLOTS = 3;

/**
 * The addon's exit dispatcher and whom each watch reports to. The addon
 * reports a batch of exits with one call, through one array, so a watch
 * costs a map entry here rather than a function and a persistent reference
 * in the addon. One per loaded addon: the addon has one dispatcher per
 * environment, so every backend on it shares this table.
 */
export class ExitWatches {
  readonly #addon: NativeAddon;
  /** The addon's event array, once the dispatcher is registered (at the first watch). */
  #events: Int32Array | undefined;
  readonly #listeners = new Map<number, ExitListener>();

  constructor(addon: NativeAddon) {
    this.#addon = addon;
  }

  /** Watches `fd` until its exit is reported to `listener`, once; `reap` reaps our child as it is. */
  watch(fd: number, reap: boolean, listener: ExitListener): number {
    // Registered on first use, not at load: the addon's watch set may not
    // exist yet (EMFILE when it loaded), and then this is where that is said.
    this.#events ??= this.#addon.watchDispatch((count) => this.#dispatch(count));
    const id = this.#addon.watch(fd, reap);
    this.#listeners.set(id, listener);
    return id;
  }

  /** Stops a watch that has not been reported (the fd may be closed after); unknown ids are ignored. */
  unwatch(id: number): void {
    this.#listeners.delete(id);
    this.#addon.unwatch(id);
  }

  /** Whether a pending watch keeps the loop alive. */
  ref(id: number, on: boolean): void {
    this.#addon.watchRef(id, on);
  }

  #dispatch(count: number): void {
    // Set before the first watch, so before any batch can be dispatched.
    const events = this.#events as Int32Array;
    let failure: { error: unknown } | undefined;
    for (let i = 0; i < count * EXIT_EVENT_SLOTS; i += EXIT_EVENT_SLOTS) {
      const id = events[i] ?? 0;
      const listener = this.#listeners.get(id);
      // Unwatched by an earlier listener of this batch.
      if (!listener) continue;
      this.#listeners.delete(id);
      try {
        listener.exitReported(events[i + 1] ?? 0, events[i + 2] ?? 0);
      } catch (error) {
        // The rest of the batch is still told; the first failure surfaces after, as an uncaught exception.
        failure ??= { error };
      }
    }
    if (failure) throw failure.error;
  }
}

/**
 * Where an addon's ExitWatches is kept: on the addon object itself, under a
 * registered symbol. The ESM and CommonJS builds loaded in one process are two
 * copies of this module but load one addon (one require cache), which has one
 * dispatcher: a table per copy would leave the first copy's pins never told.
 */
const EXIT_WATCHES = Symbol.for('custody.exitWatches');

/** The addon's one ExitWatches, made on first use. */
export function exitWatchesOf(addon: NativeAddon): ExitWatches {
  const holder = addon as NativeAddon & { [EXIT_WATCHES]?: ExitWatches };
  holder[EXIT_WATCHES] ??= new ExitWatches(addon);
  return holder[EXIT_WATCHES];
}
