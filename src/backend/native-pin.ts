/**
 * A native pin: one pidfd, the exit watch on it, and the reaping rules of
 * where it came from (spawned here, adopted, another's). Apart from the
 * backend because it is the one place a pidfd's lifetime is decided: spawn,
 * inspection and notify senders all hand their pidfds to it.
 */
import { decodeWaitStatus, UNKNOWN_EXIT } from '../process/signals.js';
import { processWide } from '../process/processwide.js';
import { backoff } from '../timing.js';
import type { ExitStatus } from '../types.js';
import type { NativeAddon } from './addon.js';
import { type ExitListener, type ExitWatches, exitWatchesOf } from './native-watch.js';
import type { PidRef } from './types.js';

// siginfo si_code values for a child's end (CLD_*).
const CLD_EXITED = 1;
const CLD_DUMPED = 3;

export type Origin = 'spawned' | 'adopted' | 'other';

/**
 * What every pin on one addon shares, held once rather than by each pin: a
 * supervisor may hold thousands of them.
 */
export interface PinContext {
  readonly addon: NativeAddon;
  readonly watches: ExitWatches;
  /** PIDFD_INFO_EXIT works: a non-child's status can be read once its parent reaps it. */
  readonly exitInfo: boolean;
  /** Closes the pidfd of a pin dropped without close(); the held value is the fd (a small integer, no object). */
  readonly finalizer: FinalizationRegistry<number>;
}

export function pinContext(addon: NativeAddon, exitInfo: boolean): PinContext {
  const finalizer = new FinalizationRegistry<number>((fd) => {
    try {
      addon.close(fd);
    } catch {
      // already closed with the environment
    }
  });
  return { addon, watches: exitWatchesOf(addon), exitInfo, finalizer };
}

/**
 * Children a native spawn made and has not reaped yet: their own watchers
 * reap them, nobody else may. Process-wide: another copy of custody here
 * reaps orphans for its instances and must leave these to their watchers.
 */
export const spawnedPids = processWide('spawnedPids', () => new Set<number>());

/** How long to wait, after a non-child's pidfd turns readable, for its parent to reap it so the kernel has its status. */
const EXIT_INFO_WAIT_MS = 1000;

/** The longest a held zombie (holdExit) waits for releaseExit() before it is reaped anyway. */
const HOLD_EXIT_MAX_MS = 2000;

/**
 * The status a waitid() siginfo describes (si_code, si_status): its code for a normal exit, else the signal,
 * with the core the kernel wrote for it (CLD_DUMPED; a wait status's WCOREDUMP bit).
 */
function fromSiginfo(code: number, status: number): ExitStatus {
  if (code === CLD_EXITED) return { code: status, signal: null };
  return decodeWaitStatus((status & 0x7f) | (code === CLD_DUMPED ? 0x80 : 0));
}

/**
 * A pidfd, and the exit it will see. Its promises exist only once someone
 * asks for them (`exited`, `gone`): a pin nobody waits on costs its fields
 * and its watcher, nothing more.
 */
export class NativePidRef implements PidRef, ExitListener {
  readonly pid: number;
  #fd: number;
  readonly #ctx: PinContext;
  readonly #origin: Origin;
  #watcher = 0;
  /** The exit was seen (the pidfd turned readable); its status may come later. */
  #seen = false;
  #status: ExitStatus | undefined;
  #closed = false;
  #refed = true;
  #exited: Promise<ExitStatus> | undefined;
  #resolveExited: ((s: ExitStatus) => void) | undefined;
  #gone: Promise<void> | undefined;
  #resolveGone: (() => void) | undefined;
  /** holdExit(): the watch does not reap; a seen exit is told to #onHeld and waits for releaseExit() or #holdTimer. */
  #holding = false;
  #onHeld: (() => void) | undefined;
  #holdTimer: NodeJS.Timeout | undefined;

  constructor(ctx: PinContext, pid: number, fd: number, origin: Origin) {
    this.#ctx = ctx;
    this.pid = pid;
    this.#fd = fd;
    this.#origin = origin;
    // A handle dropped without close() must not keep its pidfd forever. Not
    // needed for our own children: their watcher holds the pin until the
    // exit, which releases the pidfd (and a register costs on every spawn).
    if (origin !== 'spawned') ctx.finalizer.register(this, fd, this);
    // Our own children are always watched: they must be reaped even if
    // nobody ever asks how they ended.
    if (origin === 'spawned') {
      spawnedPids.add(pid);
      this.#watch();
    }
  }

  get exited(): Promise<ExitStatus> {
    if (this.#exited) return this.#exited;
    this.#watch();
    const status = this.#status;
    this.#exited = status ? Promise.resolve(status) : new Promise((resolve) => (this.#resolveExited = resolve));
    return this.#exited;
  }

  get exitStatus(): ExitStatus | undefined {
    return this.#status;
  }

  get gone(): Promise<void> {
    if (this.#gone) return this.#gone;
    this.#watch();
    this.#gone = this.#seen ? Promise.resolve() : new Promise((resolve) => (this.#resolveGone = resolve));
    return this.#gone;
  }

  get hasExited(): boolean {
    return this.#seen || this.#status !== undefined;
  }

  signal(signo: number): boolean {
    if (this.#seen || this.#status || this.#fd < 0) return false;
    try {
      this.#ctx.addon.pidfdSendSignal(this.#fd, signo);
      return true;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ESRCH') return false;
      throw err;
    }
  }

  ref(): void {
    this.#refed = true;
    if (this.#watcher) this.#ctx.watches.ref(this.#watcher, true);
  }

  unref(): void {
    this.#refed = false;
    if (this.#watcher) this.#ctx.watches.ref(this.#watcher, false);
  }

  holdExit(onHeld?: () => void): boolean {
    // Only a child of ours can be kept a zombie: another's parent reaps it whenever it likes.
    if (this.#origin === 'other' || this.#holding || this.#seen || this.#status || this.#fd < 0) return false;
    this.#holding = true;
    this.#onHeld = onHeld;
    this.#rewatch();
    return true;
  }

  releaseExit(): void {
    if (!this.#holding) return;
    this.#holding = false;
    this.#onHeld = undefined;
    clearTimeout(this.#holdTimer);
    this.#holdTimer = undefined;
    if (!this.#seen) {
      this.#rewatch();
      return;
    }
    let reaped: { code: number; status: number } | null;
    try {
      const c = this.#ctx.addon.constants;
      reaped = this.#ctx.addon.waitid(this.#fd, c.WEXITED | c.WNOHANG);
    } catch {
      // ECHILD: reaped by someone else meanwhile (another pin of ours that reaps, a stray waitpid(-1)).
      this.#notReaped();
      return;
    }
    if (reaped) this.#settle(fromSiginfo(reaped.code, reaped.status));
    // Readable yet not reapable cannot last: a watch that reaps settles it when it can.
    else this.#watcher = this.#ctx.watches.watch(this.#fd, true, this);
  }

  exitHeld(): boolean {
    return this.#holding && this.#status === undefined;
  }

  /** The watch again, reaping or not as #holding now says (the exit, if it came meanwhile, is reported at once). */
  #rewatch(): void {
    if (this.#watcher !== 0) this.#ctx.watches.unwatch(this.#watcher);
    this.#watcher = 0;
    this.#watch();
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    // A held zombie is reaped now (or, not seen yet, as usual when it comes): nobody is left to release it.
    this.releaseExit();
    if (this.#origin === 'spawned' && !this.#status) {
      // Keep watching, without holding the loop open, until it can be reaped.
      this.unref();
      return;
    }
    this.#release();
  }

  #release(): void {
    if (this.#origin !== 'spawned') this.#ctx.finalizer.unregister(this);
    if (this.#watcher) {
      this.#ctx.watches.unwatch(this.#watcher);
      this.#watcher = 0;
    }
    if (this.#fd >= 0) {
      this.#ctx.addon.close(this.#fd);
      this.#fd = -1;
    }
  }

  /** Starts the exit watch, once: not again while it runs, nor after it fired. */
  #watch(): void {
    if (this.#watcher !== 0 || this.#seen || this.#status) return;
    if (this.#fd < 0) {
      this.#settle(UNKNOWN_EXIT);
      return;
    }
    // Our own children and adopted ones (re-parented to us, a subreaper) are
    // reaped by the watch as their exit is reported; another's child is not
    // ours to reap (ECHILD), so its watch does not try.
    this.#watcher = this.#ctx.watches.watch(this.#fd, this.#origin !== 'other' && !this.#holding, this);
    if (!this.#refed) this.#ctx.watches.ref(this.#watcher, false);
  }

  /** @internal The watch set's report: the watch fired once and is gone. */
  exitReported(code: number, status: number): void {
    this.#watcher = 0;
    this.#seen = true;
    this.#resolveGone?.();
    this.#resolveGone = undefined;
    if (this.#holding) {
      // Unref'd: a held zombie never keeps the loop alive; released (reaped) within the bound whatever happens.
      this.#holdTimer = setTimeout(() => this.releaseExit(), HOLD_EXIT_MAX_MS).unref();
      this.#onHeld?.();
      return;
    }
    if (code > 0) {
      this.#settle(fromSiginfo(code, status));
      return;
    }
    this.#notReaped();
  }

  /** Gone, and not reaped by this pin: its status is someone else's to take. */
  #notReaped(): void {
    if (this.#origin === 'spawned') {
      // ECHILD: something else reaped our child (a SIG_IGN'd SIGCHLD, a
      // stray waitpid(-1)). It is gone all the same; its status is lost.
      this.#settle(UNKNOWN_EXIT);
      return;
    }
    // Adopted but someone else's child after all, or never ours: its status
    // exists once its own parent reaps it (PIDFD_INFO_EXIT).
    void this.#awaitExitInfo().then((s) => this.#settle(s));
  }

  /** A non-child's status exists only once its own parent has reaped it (PIDFD_INFO_EXIT, Linux >= 6.15). */
  async #awaitExitInfo(): Promise<ExitStatus> {
    if (!this.#ctx.exitInfo) return UNKNOWN_EXIT;
    // Unref'd: nobody must be kept waiting for a status the kernel may never have.
    for await (const _ of backoff({ maxMs: 50, timeoutMs: EXIT_INFO_WAIT_MS, unref: true })) {
      if (this.#fd < 0) return UNKNOWN_EXIT;
      try {
        const raw = this.#ctx.addon.pidfdGetExitInfo(this.#fd);
        if (raw !== null) return decodeWaitStatus(raw);
      } catch {
        return UNKNOWN_EXIT;
      }
    }
    return UNKNOWN_EXIT;
  }

  #settle(status: ExitStatus): void {
    if (this.#status) return;
    if (this.#origin === 'spawned') spawnedPids.delete(this.pid);
    this.#status = status;
    this.#seen = true;
    this.#resolveGone?.();
    this.#resolveGone = undefined;
    // Exited (and reaped, if ours): the pidfd has nothing left to give.
    this.#release();
    this.#resolveExited?.(status);
    this.#resolveExited = undefined;
  }
}

/** A pidfd's pidfs id, or null off pidfs (before Linux 6.9) or where it cannot be read. */
export function pidfsIdOf(addon: NativeAddon, fd: number): string | null {
  try {
    return addon.pidfsId(fd);
  } catch {
    return null;
  }
}
