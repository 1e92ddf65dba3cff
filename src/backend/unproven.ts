/**
 * A reference to a process whose identity cannot be proven (a platform
 * without /proc or pidfds, adopted under allowUnprovable): signals go by pid,
 * and liveness is polled with signal 0, so `gone` and `exited` do settle and
 * a stop returns once the process is gone instead of waiting out its grace.
 */
import { UNKNOWN_EXIT } from '../process/signals.js';
import type { ExitStatus } from '../types.js';
import type { PidRef } from './types.js';

const POLL_MS = 50;

export class UnprovenPidRef implements PidRef {
  readonly pid: number;
  readonly exited: Promise<ExitStatus>;
  readonly gone: Promise<void>;
  #status: ExitStatus | undefined;
  #timer: NodeJS.Timeout;
  #resolve!: (s: ExitStatus) => void;

  constructor(pid: number) {
    this.pid = pid;
    this.exited = new Promise((resolve) => (this.#resolve = resolve));
    this.gone = this.exited.then(() => undefined);
    this.#timer = setInterval(() => {
      if (!this.#alive()) this.#settle();
    }, POLL_MS);
  }

  get exitStatus(): ExitStatus | undefined {
    return this.#status;
  }

  get hasExited(): boolean {
    return this.#status !== undefined;
  }

  #alive(): boolean {
    try {
      process.kill(this.pid, 0);
      return true;
    } catch (err) {
      return (err as NodeJS.ErrnoException).code === 'EPERM';
    }
  }

  #settle(): void {
    if (this.#status) return;
    clearInterval(this.#timer);
    this.#status = UNKNOWN_EXIT;
    this.#resolve(UNKNOWN_EXIT);
  }

  signal(signo: number): boolean {
    if (this.#status) return false;
    try {
      process.kill(this.pid, signo);
      return true;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ESRCH') {
        this.#settle();
        return false;
      }
      throw err;
    }
  }

  ref(): void {
    this.#timer.ref();
  }

  unref(): void {
    this.#timer.unref();
  }

  close(): void {
    clearInterval(this.#timer);
  }
}
