/**
 * Pinning: the one way to take hold of an existing process. pin(pid) opens
 * the pin (a pidfd on the native backend), reads the identity under it and
 * returns both as a ProcessHandle; null means gone, and only that: no
 * process at the pid, which pidfd_open and every read under the pin report
 * as ESRCH or ENOENT (isNoProcess). The identity is the pinned process's,
 * never a later owner's of the pid: the backend checks the pin after its
 * reads (as systemd's pidref_verify does after each procfs read). Whatever
 * else fails is thrown: exhaustion (EMFILE, ENFILE, ENOMEM) is the kernel
 * unable to answer, and read as "gone" it would let a live process go
 * unsignalled or its state be deleted.
 *
 * A zombie is pinned like a live process (its state says `Z`): it still
 * holds its pid, and a pin with reapIfChild is what reaps it.
 */
import type { Readable, Writable } from 'node:stream';
import { backend } from '../backend/index.js';
import type { PidRef, RawIdentity } from '../backend/types.js';
import { NotAProcessError } from '../errors.js';
import { isNoProcess, toIdentity } from './identity.js';
import { ENVIRON_MAX_BYTES, type EnvironReader } from './ownership.js';
import { signalNumber } from './signals.js';
import type { ExitStatus, ProcessIdentity } from '../types.js';

/** The pin behind a handle, for this package's own modules only (see holdExit). */
let refOf: (h: ProcessHandle) => PidRef;

/** A process pinned by a pidfd (native) or its recorded start time (js): signals reach it or nobody, never a later owner of its pid. From `spawn()`, `open()` and an Instance. */
export class ProcessHandle {
  static {
    refOf = (h) => h.#ref;
  }

  readonly pid: number;
  /** The identity proven when the handle was opened (open()); null for a fresh spawn until it is inspected. */
  readonly identity: ProcessIdentity | null;
  readonly stdin: Writable | null;
  readonly stdout: Readable | null;
  readonly stderr: Readable | null;
  readonly #ref: PidRef;

  /** @internal */
  constructor(
    ref: PidRef,
    init: {
      identity: ProcessIdentity | null;
      stdin?: Writable | null;
      stdout?: Readable | null;
      stderr?: Readable | null;
    },
  ) {
    this.#ref = ref;
    this.pid = ref.pid;
    this.identity = init.identity;
    this.stdin = init.stdin ?? null;
    this.stdout = init.stdout ?? null;
    this.stderr = init.stderr ?? null;
  }

  /**
   * Sends a signal through the pin (a pidfd on the native backend). Returns
   * false when the process is already gone; never throws for that.
   */
  signal(sig: NodeJS.Signals | number = 'SIGTERM'): boolean {
    return this.#ref.signal(signalNumber(sig));
  }

  /** Whether the process still runs (signal 0 through the pin). */
  isAlive(): boolean {
    return this.#ref.signal(0);
  }

  /** Settles with { code, signal } once the process has exited; both null where the kernel cannot say. */
  get exited(): Promise<ExitStatus> {
    return this.#ref.exited;
  }

  /** The exit status once known, else undefined. */
  get exitStatus(): ExitStatus | undefined {
    return this.#ref.exitStatus;
  }

  /** Settles the moment the exit is seen; `exited` may settle later, once the status is known. */
  get gone(): Promise<void> {
    return this.#ref.gone;
  }

  /** Whether the exit has been seen. */
  get hasExited(): boolean {
    return this.#ref.hasExited;
  }

  /** Keep the event loop alive while waiting for this process's exit (the default). */
  ref(): this {
    this.#ref.ref();
    return this;
  }

  /** Let the event loop end while this process runs. */
  unref(): this {
    this.#ref.unref();
    return this;
  }

  /** Releases the pidfd. A spawned child is still reaped when it exits, so it never lingers as a zombie. */
  close(): void {
    this.#ref.close();
  }

  [Symbol.for('nodejs.dispose')](): void {
    this.close();
  }
}

/**
 * @internal Keeps the zombie of this child of ours, once it exits, until releaseExit() (or a bound): `gone`
 * settles and `onHeld` is called at the exit, `exited` only once it is reaped. While unreaped, its pid, and the
 * session it leads, can be no one else's. false where the backend cannot (js: libuv reaps) or it is not our child.
 */
export function holdExit(h: ProcessHandle, onHeld?: () => void): boolean {
  return refOf(h).holdExit?.(onHeld) ?? false;
}

/** @internal Ends holdExit(): the zombie is reaped now, or as usual when the exit comes. */
export function releaseExit(h: ProcessHandle): void {
  refOf(h).releaseExit?.();
}

/** @internal Whether holdExit() holds now: the process, alive or a zombie, is unreaped, so its pid is no one else's. */
export function exitHeld(h: ProcessHandle): boolean {
  return refOf(h).exitHeld?.() ?? false;
}
export interface PinOptions {
  /**
   * Reap it when it exits if it is, or becomes, our child (re-parented to us as a subreaper). Only for
   * processes custody launched or adopted: never one Node's child_process may own (its owner reaps it).
   */
  reapIfChild?: boolean;
  /**
   * What the id of a thread that is not a thread-group leader means. 'gone' (the default) for a pid a
   * listing, a scan or a sender's credentials named: it was a process then, and a thread has the number
   * now. 'refuse' for a pid someone handed us as a process (a pidfile's, a pid function's, open()'s):
   * ERR_CUSTODY_NOT_A_PROCESS, since it names the wrong thing and waiting will not change that.
   */
  thread?: 'gone' | 'refuse';
}

/** A process pinned, with the identity read under that pin. */
export interface Pinned {
  identity: ProcessIdentity;
  /** Carries `identity`; the caller closes it (or hands it on). */
  handle: ProcessHandle;
  /** Its environment, read by path and then checked against the pin: for a judgement of an env-mode token. */
  environ: EnvironReader;
}

/**
 * Pins pid and reads its identity under the pin. null when there is no process at pid (gone); a zombie is
 * pinned. Throws NotAProcessError for a thread with `thread: 'refuse'`, and every error that is not about
 * the process being gone (EMFILE, ENFILE, ENOMEM, EAGAIN...), with nothing left open.
 */
export function pin(pid: number, options: PinOptions = {}): Pinned | null {
  let pinned: ReturnType<typeof backend.inspectPinned>;
  try {
    pinned = backend.inspectPinned(pid, { reapIfChild: options.reapIfChild === true });
  } catch (err) {
    if (options.thread === 'refuse' && err instanceof NotAProcessError) throw err;
    if (isNoProcess(err)) return null;
    throw err;
  }
  return pinnedFrom(pid, pinned);
}

/** The Pinned for a pin the backend took (one by one, or ahead in a batch); the pin is closed if its identity cannot be made. */
export function pinnedFrom(pid: number, { raw, ref }: { raw: RawIdentity; ref: PidRef }): Pinned {
  try {
    const identity = toIdentity(pid, raw, backend.bootId());
    return {
      identity,
      handle: new ProcessHandle(ref, { identity }),
      environ: () => backend.readEnviron(ref, ENVIRON_MAX_BYTES),
    };
  } catch (err) {
    ref.close();
    throw err;
  }
}
