/**
 * Fds held (on /dev/null) so that undoing a launch can run when the fd
 * table is otherwise full: a launch that failed for want of fds (EMFILE)
 * must still be able to scan and pin what it started, to end it.
 */
import { closeSync, openSync } from 'node:fs';

/** Enough for a process-table scan and a pin (a dir, a stat, a cmdline, a pidfd). */
export const RESERVE_FDS = 4;

export class FdReserve {
  #fds: number[] = [];
  readonly #size: number;
  /** Undos running now: the reserve is handed out with the first and taken back after the last. */
  #users = 0;

  constructor(size = RESERVE_FDS) {
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

  /** Runs `undo` with the reserve's fds free; refilled after the last one ends, unless `closed` says not to. */
  async lend<T>(undo: () => Promise<T>, closed: () => boolean): Promise<T> {
    if (this.#users++ === 0) this.release();
    try {
      return await undo();
    } finally {
      // Not after close(): the reserve would outlive the supervisor.
      if (--this.#users === 0 && !closed()) this.refill();
    }
  }
}
