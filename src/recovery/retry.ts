/**
 * A deferred instance is one recovery could not decide yet (EMFILE while
 * pinning it, a launch child that had not exec'd within the confirm bound).
 * Nothing about it is wrong; it only needs another look. The supervisor
 * takes that look itself: a recover() 1 s after a deferral, the wait
 * doubling to 60 s while any id stays deferred, back to 1 s once none is —
 * the way systemd spaces a unit's restarts, so a host short of fds is not
 * hammered and one that recovers is noticed soon.
 *
 * One retry runs at a time, and never two timers. A recover() the caller
 * makes meanwhile is as good as a retry: what it decides is no longer
 * deferred, and the schedule only looks at what still is.
 */

/** The first wait after a deferral, and the longest. */
export const RETRY_FIRST_MS = 1000;
export const RETRY_MAX_MS = 60_000;

export interface RetryHost {
  /** Whether any id is deferred now. */
  pending(): boolean;
  /** One recover() of the supervisor's; its rejection is reported by `failed`. */
  recover(): Promise<unknown>;
  failed(err: Error, nextMs: number): void;
  /** Whether the timer holds the event loop (a supervisor whose instances do). */
  ref: boolean;
}

export class DeferredRetry {
  readonly #host: RetryHost;
  #waitMs = RETRY_FIRST_MS;
  #timer: NodeJS.Timeout | null = null;
  #running = false;
  #closed = false;

  constructor(host: RetryHost) {
    this.#host = host;
  }

  /** The wait before the next retry (what a test or a status line may show). */
  get waitMs(): number {
    return this.#waitMs;
  }

  /** Called after anything that may have deferred an id or decided one: schedules, or resets the wait. */
  poke(): void {
    if (this.#closed || this.#running || this.#timer) return;
    if (!this.#host.pending()) {
      this.#waitMs = RETRY_FIRST_MS;
      return;
    }
    this.#timer = setTimeout(() => this.#fire(), this.#waitMs);
    if (!this.#host.ref) this.#timer.unref();
  }

  #fire(): void {
    this.#timer = null;
    if (this.#closed) return;
    this.#running = true;
    const next = Math.min(this.#waitMs * 2, RETRY_MAX_MS);
    this.#host
      .recover()
      .catch((err: Error) => {
        if (!this.#closed) this.#host.failed(err, next);
      })
      .finally(() => {
        this.#running = false;
        this.#waitMs = next;
        this.poke();
      });
  }

  /** No retry after this; one already running finishes (close() waits for it as for any recover()). */
  close(): void {
    this.#closed = true;
    if (this.#timer) clearTimeout(this.#timer);
    this.#timer = null;
  }
}
