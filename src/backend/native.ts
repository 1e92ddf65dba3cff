/**
 * The native backend: every process reference is a pidfd; exits are seen by
 * polling pidfds on the libuv loop (one epoll registration each, O(1) per
 * exit); children come from clone(CLONE_PIDFD | CLONE_VFORK | CLONE_VM).
 */
import { openSync, closeSync, constants as fsc, readFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { Socket } from 'node:net';
import { NotAProcessError } from '../errors.js';
import { PF_KTHREAD, parseStatusField } from '../process/proc.js';
import { decodeWaitStatus, UNKNOWN_EXIT } from '../process/signals.js';
import { backoff } from '../timing.js';
import { processWide } from '../process/processwide.js';
import { assertOwnProc, ownPidNs, ProcReads } from './procview.js';
import type { Capabilities, ExitStatus } from '../types.js';
import { type AddonInspect, type NativeAddon, spawnedChild } from './addon.js';
import type {
  Backend,
  FileRead,
  NotifyDatagram,
  NotifyListener,
  PidRef,
  ProcEntry,
  RawIdentity,
  SpawnedChild,
  SpawnRequest,
} from './types.js';

// siginfo si_code values for a child's end (CLD_*).
const CLD_EXITED = 1;

type Origin = 'spawned' | 'adopted' | 'other';

/**
 * What every pin on one addon shares, held once rather than by each pin: a
 * supervisor may hold thousands of them.
 */
interface PinContext {
  readonly addon: NativeAddon;
  readonly watches: ExitWatches;
  /** PIDFD_INFO_EXIT works: a non-child's status can be read once its parent reaps it. */
  readonly exitInfo: boolean;
  /** Closes the pidfd of a pin dropped without close(); the held value is the fd (a small integer, no object). */
  readonly finalizer: FinalizationRegistry<number>;
}

function pinContext(addon: NativeAddon, exitInfo: boolean): PinContext {
  const finalizer = new FinalizationRegistry<number>((fd) => {
    try {
      addon.close(fd);
    } catch {
      // already closed with the environment
    }
  });
  return { addon, watches: exitWatchesOf(addon), exitInfo, finalizer };
}

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

/**
 * Children a native spawn made and has not reaped yet: their own watchers
 * reap them, nobody else may. Process-wide: another copy of custody here
 * reaps orphans for its instances and must leave these to their watchers.
 */
const spawnedPids = processWide('spawnedPids', () => new Set<number>());

/** At most this many threadpool threads share one argv-first scan (libuv's pool has four by default). */
const MATCH_SHARDS = 2;

/** How long to wait, after a non-child's pidfd turns readable, for its parent to reap it so the kernel has its status. */
const EXIT_INFO_WAIT_MS = 1000;

/** The longest a held zombie (holdExit) waits for releaseExit() before it is reaped anyway. */
const HOLD_EXIT_MAX_MS = 2000;

/** The status a waitid() siginfo describes (si_code, si_status): its code for a normal exit, else the signal. */
function fromSiginfo(code: number, status: number): ExitStatus {
  return code === CLD_EXITED ? { code: status, signal: null } : decodeWaitStatus(status & 0x7f);
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
function pidfsIdOf(addon: NativeAddon, fd: number): string | null {
  try {
    return addon.pidfsId(fd);
  } catch {
    return null;
  }
}

/** For the message only: whose thread a TID is. */
function tgidOf(pid: number, procRoot = '/proc'): number | null {
  try {
    return parseStatusField(readFileSync(`${procRoot}/${pid}/status`, 'latin1'), 'Tgid');
  } catch {
    return null;
  }
}

function fromAddon(r: AddonInspect): RawIdentity {
  return {
    state: r[0],
    ppid: r[1],
    startTicks: r[2],
    uid: r[3],
    exe: r[4] < 0 ? null : { dev: r[4], ino: r[5] },
    pidfsId: r[6],
    session: r[8],
    // 0: the /proc's own namespace, whose inode the addon did not read (the reader's: assertOwnProc).
    processPidNs: r[9] > 0 ? r[9] : r[9] === 0 ? ownPidNs() : null,
    argv: r.slice(10) as string[],
  };
}

/**
 * What a failed inspection of pid throws: the addon's errno error, except
 * that pidfd_open refuses a thread that is not a thread-group leader
 * (EINVAL before Linux 6.9, ENOENT since, where PIDFD_THREAD can name
 * threads), which is a TID, not a process.
 */
function inspectFailure(pid: number, procRoot: string | undefined, err: Error): Error {
  const { code, syscall } = err as NodeJS.ErrnoException;
  if ((code === 'EINVAL' || code === 'ENOENT') && syscall === 'pidfd_open') {
    const tgid = tgidOf(pid, procRoot);
    if (tgid !== null && tgid !== pid) return new NotAProcessError(pid, tgid);
  }
  return err;
}

export class NativeBackend extends ProcReads implements Backend {
  readonly name = 'native' as const;
  /** The vfork-style child writes itself into the target's cgroup.procs before execve (native/child.cc). */
  readonly cgroupPlacement = 'child-write' as const;
  #addon: NativeAddon;
  #caps: Capabilities;
  #pins: PinContext;
  #bootId: string | undefined;

  constructor(addon: NativeAddon, caps: Capabilities) {
    super();
    this.#addon = addon;
    this.#caps = caps;
    this.#pins = pinContext(addon, caps.exitInfoOfNonChildren);
  }

  get addon(): NativeAddon {
    return this.#addon;
  }

  capabilities(): Capabilities {
    return this.#caps;
  }

  inspect(pid: number, procRoot?: string): RawIdentity {
    return fromAddon(this.#inspect(pid, procRoot, false));
  }

  inspectPinned(pid: number, options: { reapIfChild?: boolean } = {}): { raw: RawIdentity; ref: PidRef } {
    const r = this.#inspect(pid, undefined, true);
    const origin: Origin = options.reapIfChild ? 'adopted' : 'other';
    return {
      raw: fromAddon(r),
      ref: new NativePidRef(this.#pins, pid, r[7], origin),
    };
  }

  async inspectPinnedMany(
    pids: readonly number[],
    options: { reapIfChild?: boolean } = {},
  ): Promise<Array<{ raw: RawIdentity; ref: PidRef } | Error>> {
    assertOwnProc(undefined);
    const origin: Origin = options.reapIfChild ? 'adopted' : 'other';
    const rows = await this.#addon.inspectPinnedMany([...pids]);
    return rows.map((r, k) => {
      const pid = pids[k] as number;
      if (r instanceof Error) return inspectFailure(pid, undefined, r);
      // The pin first: from here on its pidfd is owned (closed by close() or the finalizer).
      const ref = new NativePidRef(this.#pins, pid, r[7], origin);
      return { raw: fromAddon(r), ref };
    });
  }

  readFilesAt(
    dirFd: number,
    names: readonly string[],
    leaf: string,
    maxBytes: number,
  ): Promise<Array<FileRead | null>> {
    return this.#addon.readFilesAt(dirFd, [...names], leaf, maxBytes);
  }

  #inspect(pid: number, procRoot: string | undefined, keepPidfd: boolean): AddonInspect {
    assertOwnProc(procRoot);
    try {
      return this.#addon.inspect(pid, procRoot, keepPidfd);
    } catch (err) {
      throw inspectFailure(pid, procRoot, err as Error);
    }
  }

  spawnedHere(pid: number): boolean {
    return spawnedPids.has(pid);
  }

  reapZombie(pid: number, pidfsId?: string): boolean {
    return this.#onPidfd(pid, false, (fd) => {
      if (pidfsId !== undefined && pidfsIdOf(this.#addon, fd) !== pidfsId) return false;
      try {
        const c = this.#addon.constants;
        return this.#addon.waitid(fd, c.WEXITED | c.WNOHANG) !== null;
      } catch {
        // ECHILD: not ours to reap after all
        return false;
      }
    });
  }

  pidfsIdOf(pid: number): string | null {
    // pidfd_open takes a zombie too: its task is there until it is reaped.
    return this.#onPidfd(pid, null, (fd) => pidfsIdOf(this.#addon, fd));
  }

  /** `use` of a pidfd on pid, closed after; `none` where there is no such process (or no fd to open it with). */
  #onPidfd<T>(pid: number, none: T, use: (fd: number) => T): T {
    let fd: number;
    try {
      fd = this.#addon.pidfdOpen(pid);
    } catch {
      return none;
    }
    try {
      return use(fd);
    } finally {
      this.#addon.close(fd);
    }
  }

  childSubreaper(): boolean {
    return this.#addon.getChildSubreaper();
  }

  setChildSubreaper(on: boolean): boolean {
    this.#addon.setChildSubreaper(on);
    return true;
  }

  probeCloneIntoCgroup(): string {
    return this.#addon.probeCloneIntoCgroup();
  }

  bootId(): string {
    // The boot id cannot change while we run.
    this.#bootId ??= this.#addon.readBootId();
    return this.#bootId;
  }

  protected override async listSessions(): Promise<Int32Array> {
    assertOwnProc('/proc');
    return this.#addon.listSessions('/proc');
  }

  async matchArgv(argv: readonly string[], procRoot?: string): Promise<number[]> {
    assertOwnProc(procRoot);
    // Split by pid across threadpool threads, one per CPU up to MATCH_SHARDS: reading cmdline is all
    // kernel time, and two CPUs read a table of thousands in half the time one does.
    const shards = Math.max(1, Math.min(MATCH_SHARDS, availableParallelism()));
    const parts = await Promise.all(
      Array.from({ length: shards }, (_, k) => this.#addon.matchArgv(procRoot, argv, k, shards)),
    );
    return parts.flat().sort((a, b) => a - b);
  }

  async listProcesses(procRoot?: string, images?: readonly string[]): Promise<ProcEntry[]> {
    assertOwnProc(procRoot);
    const asked = images !== undefined;
    const flat = await this.#addon.listProcesses(procRoot, images);
    const out: ProcEntry[] = [];
    for (let i = 0; i < flat.length; ) {
      const pid = flat[i] as number;
      const ppid = flat[i + 1] as number;
      const pgrp = flat[i + 2] as number;
      const session = flat[i + 3] as number;
      const uid = flat[i + 4] as number;
      const startTicks = flat[i + 5] as number;
      const state = flat[i + 6] as string;
      // With images, two more slots: the index of the image the process shows (or -1), and its flags.
      const image = asked ? images[flat[i + 7] as number] : undefined;
      const at = asked ? i + 9 : i + 7;
      const argc = flat[at] as number;
      const argv = flat.slice(at + 1, at + 1 + argc) as string[];
      i = at + 1 + argc;
      const row: ProcEntry = { pid, ppid, pgrp, session, uid, startTicks, state, argv };
      if (image !== undefined) row.image = image;
      if (asked && ((flat[at - 1] as number) & PF_KTHREAD) !== 0) row.kernelThread = true;
      out.push(row);
    }
    return out;
  }

  openNotify(name: string, onBatch: (batch: NotifyDatagram[], error: Error | null) => void): NotifyListener {
    const addon = this.#addon;
    const pins = this.#pins;
    let open = true;
    const { id, passPidfd } = addon.notifyOpen(name, (error, flat) => {
      const batch: NotifyDatagram[] = [];
      for (let i = 0; i + 4 < flat.length; i += 5) {
        const pid = flat[i + 2] as number;
        const fd = flat[i + 4] as number;
        // The pidfd is ours from here: a PidRef closes it (or its finalizer does).
        const sender = fd >= 0 ? new NativePidRef(pins, pid, fd, 'other') : fd === -2 ? 'gone' : null;
        const [data, truncated, uid] = [flat[i] as Buffer, flat[i + 1] as boolean, flat[i + 3] as number];
        batch.push({ data, truncated, pid, uid, sender, senderId: fd >= 0 ? pidfsIdOf(addon, fd) : null });
      }
      if (!open) {
        for (const d of batch) if (d.sender && d.sender !== 'gone') d.sender.close();
        return;
      }
      onBatch(batch, error);
    });
    return {
      address: `@${name}`,
      pinsSenders: passPidfd,
      unref: () => {
        if (open) addon.notifyUnref(id);
      },
      close: () => {
        if (!open) return;
        open = false;
        addon.notifyClose(id);
      },
    };
  }

  tryLock(fd: number): boolean {
    const c = this.#addon.constants;
    try {
      this.#addon.flock(fd, c.LOCK_EX | c.LOCK_NB);
      return true;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'EWOULDBLOCK' || (err as NodeJS.ErrnoException).code === 'EAGAIN') {
        return false;
      }
      throw err;
    }
  }

  spawn(req: SpawnRequest): SpawnedChild {
    const addon = this.#addon;
    const c = addon.constants;
    // The child's 0..2; -1: the addon's own /dev/null, already where the child can take it without a dup.
    const fds = [-1, -1, -1];
    // Our end of each pipe, until its stream owns it.
    const ours: Array<number | null> = [null, null, null];
    try {
      for (let i = 0; i < 3; i++) {
        const target = req.stdio[i];
        if (target === 'ignore' || target === undefined) continue;
        if (target === 'inherit') fds[i] = i;
        else if (target === 'pipe') {
          const [r, w] = addon.pipe();
          fds[i] = i === 0 ? r : w;
          ours[i] = i === 0 ? w : r;
        } else fds[i] = target.fd;
      }
      const flags = (req.newSession ? c.SPAWN_NEW_SESSION : 0) | (req.newGroup ? c.SPAWN_NEW_GROUP : 0);
      // Opened here, written by the child: it allocates nothing and opens nothing.
      const procs = req.cgroup ? openSync(join(req.cgroup, 'cgroup.procs'), fsc.O_WRONLY) : -1;
      let packed: number;
      try {
        packed = addon.spawn(
          req.file,
          req.argv,
          req.env,
          req.cwd ?? null,
          fds[0] ?? -1,
          fds[1] ?? -1,
          fds[2] ?? -1,
          flags,
          procs,
        );
      } finally {
        if (procs >= 0) closeSync(procs);
      }
      const { pid, pidfd } = spawnedChild(addon, packed);
      const ref = new NativePidRef(this.#pins, pid, pidfd, 'spawned');
      const stream = (i: number): Socket | null => {
        const fd = ours[i];
        if (fd === null || fd === undefined) return null;
        ours[i] = null;
        return new Socket({ fd, readable: i !== 0, writable: i === 0 });
      };
      return { ref, stdin: stream(0), stdout: stream(1), stderr: stream(2) };
    } finally {
      // The child's ends of the pipes (it holds its own copies now, or never ran), and ours if no stream took them.
      for (let i = 0; i < 3; i++) {
        const child = fds[i] ?? -1;
        if (req.stdio[i] === 'pipe' && child >= 0) closeSync(child);
        const parent = ours[i];
        if (parent !== null && parent !== undefined) closeSync(parent);
      }
    }
  }
}
