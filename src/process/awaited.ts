/**
 * An instance's `exited` that holds the event loop for whoever waits on it.
 *
 * A supervisor's watch on its instances does not hold the loop (they are
 * daemons; the agent may end while they run), so a script whose only work
 * left was `await instance.exited` ended with its top-level await unsettled:
 * exit code 13, no message. This promise refs the handle's exit watch (a
 * pidfd, a poll, a child) the first time anyone waits on it (await, then,
 * catch, finally), so the loop lives until the exit is seen and the promise
 * settles; an instance nobody waits on holds nothing. The watch ends at the
 * exit, and with it the hold; a closed handle (Supervisor.close) holds nothing.
 */
import type { ExitStatus } from '../types.js';
import type { ProcessHandle } from './handle.js';

class ExitPromise extends Promise<ExitStatus> {
  // What then() derives is a plain promise: only waiting on this one refs the watch.
  static override get [Symbol.species]() {
    return Promise;
  }

  readonly #handle: ProcessHandle;
  #waitedOn = false;

  constructor(handle: ProcessHandle) {
    let settle!: (status: ExitStatus) => void;
    super((resolve) => {
      settle = resolve;
    });
    this.#handle = handle;
    // The watch's promise never rejects (an unknowable status is both fields null).
    void handle.exited.then(settle);
  }

  // biome-ignore lint/suspicious/noThenProperty: waiting on the promise is what must hold the loop; await calls then() because the constructor is not Promise.
  override then<A = ExitStatus, B = never>(
    onFulfilled?: ((status: ExitStatus) => A | PromiseLike<A>) | null,
    onRejected?: ((reason: unknown) => B | PromiseLike<B>) | null,
  ): Promise<A | B> {
    if (!this.#waitedOn) {
      this.#waitedOn = true;
      this.#handle.ref();
    }
    return super.then(onFulfilled, onRejected);
  }
}

/** handle.exited, holding the loop once someone waits on it (see above). */
export function awaitedExit(handle: ProcessHandle): Promise<ExitStatus> {
  return new ExitPromise(handle);
}

/** The longest timer Node keeps as asked (2^31 − 1 ms); a hold re-arms nothing, it only keeps the loop alive. */
const HOLD_MS = 2 ** 31 - 1;

/**
 * A promise settled by its owner that, like an instance's `exited` above,
 * holds the event loop once someone waits on it, until it settles or the
 * owner lets go. It is the `exited` of an instance with a restart policy,
 * which outlives any one process's watch: between runs (a backoff's timer
 * does not hold the loop) nothing else would keep `await inst.exited` alive.
 */
export interface AwaitedSettle {
  promise: Promise<ExitStatus>;
  settle: (status: ExitStatus) => void;
  /** Stops holding the loop without settling (Supervisor.close: the instance runs on, unwatched). */
  letGo: () => void;
}

class HeldPromise extends Promise<ExitStatus> {
  static override get [Symbol.species]() {
    return Promise;
  }

  #hold: (() => void) | null = null;

  static make(): AwaitedSettle {
    let resolve!: (status: ExitStatus) => void;
    const promise = new HeldPromise((r) => {
      resolve = r;
    });
    let timer: NodeJS.Timeout | null = null;
    let done = false;
    const letGo = () => {
      done = true;
      if (timer) clearInterval(timer);
      timer = null;
    };
    promise.#hold = () => {
      if (!done && !timer) timer = setInterval(() => {}, HOLD_MS);
    };
    return {
      promise,
      settle: (status) => {
        letGo();
        resolve(status);
      },
      letGo,
    };
  }

  // biome-ignore lint/suspicious/noThenProperty: waiting on the promise is what must hold the loop (see ExitPromise).
  override then<A = ExitStatus, B = never>(
    onFulfilled?: ((status: ExitStatus) => A | PromiseLike<A>) | null,
    onRejected?: ((reason: unknown) => B | PromiseLike<B>) | null,
  ): Promise<A | B> {
    this.#hold?.();
    this.#hold = null;
    return super.then(onFulfilled, onRejected);
  }
}

/** A settle-once `exited` that holds the loop while waited on (see AwaitedSettle). */
export function awaitedSettle(): AwaitedSettle {
  return HeldPromise.make();
}
