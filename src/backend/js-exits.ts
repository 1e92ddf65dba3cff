/**
 * How the js backend learns that a non-child has gone: it has no pidfd to
 * wait on, so one shared timer re-reads each pinned (pid, start ticks) pair.
 * Apart from the backend because the poller's budget and its pins' ref
 * counting are one mechanism, tested on its own (test/backend/exit-watch).
 */
import { UNKNOWN_EXIT } from '../process/signals.js';
import type { ExitStatus } from '../types.js';
import { readStartTicks } from './js-proc.js';
import type { PidRef } from './types.js';

/** What the exit poller watches: a process pinned by (pid, start ticks), told once it is gone. */
export interface PolledExit {
  readonly pid: number;
  readonly startTicks: number;
  markExited(status: ExitStatus): void;
}

/**
 * One shared timer polls every watched non-child: no per-process timers. A
 * pass over the watched pids may span ticks: each tick reads for at most
 * `budgetMs` and the next one resumes where it stopped, so a supervisor
 * holding thousands of adopted instances keeps its event loop. Reading all
 * of 5 000 every 50 ms took ~150 ms per tick: three quarters of the thread,
 * for ever, and a third of what recovery spent. Now a pass over N takes
 * about N × 15 µs (one stat read) / budgetMs ticks, and an exit is seen
 * within one pass (within one tick up to a few hundred watched). A pid
 * custody has just signalled is read at every tick, ahead of the pass and
 * whatever the budget, until it is seen gone: a stop waits for that exit,
 * and must not wait out a pass (or escalate to KILL meanwhile).
 * @internal exported for its tests
 */
export class ExitPoller {
  readonly #intervalMs: number;
  readonly #budgetMs: number;
  #watched = new Map<number, Set<PolledExit>>();
  /** The pass under way: the pids it still has to read from #next on (one added since waits for the next pass). */
  #pass: number[] = [];
  #next = 0;
  /** Watched pids a signal was sent to (see expedite). */
  #signalled = new Set<number>();
  #timer: NodeJS.Timeout | undefined;
  #refs = 0;

  constructor({ intervalMs = 50, budgetMs = 5 } = {}) {
    this.#intervalMs = intervalMs;
    this.#budgetMs = budgetMs;
  }

  add(ref: PolledExit): void {
    let set = this.#watched.get(ref.pid);
    if (!set) {
      set = new Set();
      this.#watched.set(ref.pid, set);
    }
    set.add(ref);
    if (!this.#timer) {
      this.#timer = setInterval(() => this.tick(), this.#intervalMs);
      if (this.#refs === 0) this.#timer.unref();
    }
  }

  delete(ref: PolledExit): void {
    const set = this.#watched.get(ref.pid);
    if (!set) return;
    set.delete(ref);
    if (set.size === 0) {
      this.#watched.delete(ref.pid);
      this.#signalled.delete(ref.pid);
    }
    if (this.#watched.size === 0 && this.#timer) {
      clearInterval(this.#timer);
      this.#timer = undefined;
      this.#pass = [];
      this.#next = 0;
    }
  }

  /** pid was just signalled: read it at every tick until it is gone or no longer watched. */
  expedite(pid: number): void {
    if (this.#watched.has(pid)) this.#signalled.add(pid);
  }

  adjustRefs(delta: number): void {
    this.#refs += delta;
    if (!this.#timer) return;
    if (this.#refs > 0) this.#timer.ref();
    else this.#timer.unref();
  }

  /**
   * Reads every signalled pid, then the next pids of the pass until the
   * budget is spent (at least one, whatever the clock says), and tells the
   * ones gone or reused. A tick begins a pass only when the last one is done
   * and never runs past its end, so it reads no pid twice. Returns how many
   * pids it read.
   */
  tick(): number {
    const stop = performance.now() + this.#budgetMs;
    let read = 0;
    for (const pid of [...this.#signalled]) {
      const set = this.#watched.get(pid);
      if (set) {
        read++;
        this.#check(pid, set);
      }
    }
    if (this.#next >= this.#pass.length) {
      this.#pass = [...this.#watched.keys()];
      this.#next = 0;
    }
    let inPass = 0;
    // delete() ends the pass (#pass emptied) when the last watch goes, even from a markExited below.
    while (this.#next < this.#pass.length && (inPass === 0 || performance.now() < stop)) {
      const pid = this.#pass[this.#next++] as number;
      const set = this.#watched.get(pid);
      // Unwatched since the pass began, or read above.
      if (!set || this.#signalled.has(pid)) continue;
      inPass++;
      this.#check(pid, set);
    }
    return read + inPass;
  }

  /** One read of pid for every pin on it. */
  #check(pid: number, set: Set<PolledExit>): void {
    let ticks: number | null;
    try {
      ticks = readStartTicks(pid, '/proc');
    } catch {
      // Unreadable now (EMFILE): it is read again at the next tick.
      return;
    }
    for (const ref of [...set]) {
      if (ticks !== ref.startTicks) ref.markExited(UNKNOWN_EXIT);
    }
  }
}

const poller = new ExitPoller();

/** A non-child, pinned by (pid, start ticks). */
export class JsPidRef implements PidRef, PolledExit {
  readonly pid: number;
  readonly startTicks: number;
  #exited: Promise<ExitStatus> | undefined;
  #resolve: ((s: ExitStatus) => void) | undefined;
  #status: ExitStatus | undefined;
  #refed = true;
  #polling = false;
  /** A signal other than 0 was sent through this pin. */
  #signalled = false;
  #countsRef = false;
  #gone: Promise<void> | undefined;

  constructor(pid: number, startTicks: number) {
    this.pid = pid;
    this.startTicks = startTicks;
  }

  get exited(): Promise<ExitStatus> {
    if (!this.#exited) {
      const status = this.#status;
      this.#exited = status
        ? Promise.resolve(status)
        : new Promise((resolve) => {
            this.#resolve = resolve;
          });
      if (!status) {
        poller.add(this);
        if (this.#signalled) poller.expedite(this.pid);
        this.#polling = true;
        this.#syncRef();
      }
    }
    return this.#exited;
  }

  get exitStatus(): ExitStatus | undefined {
    return this.#status;
  }

  get gone(): Promise<void> {
    this.#gone ??= this.exited.then(() => undefined);
    return this.#gone;
  }

  get hasExited(): boolean {
    return this.#status !== undefined;
  }

  signal(signo: number): boolean {
    if (this.#status) return false;
    // The window this backend cannot close: the pid could be reused between
    // this check and the kill.
    if (readStartTicks(this.pid, '/proc') !== this.startTicks) {
      this.markExited(UNKNOWN_EXIT);
      return false;
    }
    try {
      process.kill(this.pid, signo);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ESRCH') return false;
      throw err;
    }
    // Its exit is now expected: the poller reads it at every tick (see ExitPoller).
    if (signo !== 0) {
      this.#signalled = true;
      if (this.#polling) poller.expedite(this.pid);
    }
    return true;
  }

  markExited(status: ExitStatus): void {
    if (this.#status) return;
    this.#status = status;
    this.#stopPolling();
    this.#resolve?.(status);
  }

  ref(): void {
    this.#refed = true;
    this.#syncRef();
  }

  unref(): void {
    this.#refed = false;
    this.#syncRef();
  }

  close(): void {
    this.#stopPolling();
  }

  #stopPolling(): void {
    if (!this.#polling) return;
    poller.delete(this);
    this.#polling = false;
    this.#syncRef();
  }

  /** The shared timer holds the loop open while any polling reference is ref'd. */
  #syncRef(): void {
    const want = this.#polling && this.#refed;
    if (want !== this.#countsRef) {
      poller.adjustRefs(want ? 1 : -1);
      this.#countsRef = want;
    }
  }
}
