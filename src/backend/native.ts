/**
 * The native backend: every process reference is a pidfd; exits are seen by
 * polling pidfds on the libuv loop (one epoll registration each, O(1) per
 * exit); children come from clone(CLONE_PIDFD | CLONE_VFORK | CLONE_VM).
 */
import { openSync, closeSync, constants as fsc, readFileSync } from 'node:fs';
import { availableParallelism } from 'node:os';
import { join } from 'node:path';
import { Socket } from 'node:net';
import type { Readable, Writable } from 'node:stream';
import { NotAProcessError } from '../errors.js';
import { parseStatusField } from '../proc.js';
import { decodeWaitStatus, UNKNOWN_EXIT } from '../signals.js';
import { backoff } from '../timing.js';
import { assertOwnProc, ProcReads } from './procview.js';
import type { Capabilities, ExitStatus } from '../types.js';
import type { AddonInspect, NativeAddon } from './addon.js';
import type {
  Backend,
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
  return { addon, exitInfo, finalizer };
}

/** Children this addon spawned and has not reaped yet: their own watchers reap them, nobody else may. */
const spawnedPids = new Set<number>();

/** At most this many threadpool threads share one argv-first scan (libuv's pool has four by default). */
const MATCH_SHARDS = 2;

/** How long to wait, after a non-child's pidfd turns readable, for its parent to reap it so the kernel has its status. */
const EXIT_INFO_WAIT_MS = 1000;

/** The status a waitid() siginfo describes: its code for a normal exit, else the signal. */
function fromSiginfo(info: { code: number; status: number }): ExitStatus {
  return info.code === CLD_EXITED ? { code: info.status, signal: null } : decodeWaitStatus(info.status & 0x7f);
}

/**
 * A pidfd, and the exit it will see. Its promises exist only once someone
 * asks for them (`exited`, `gone`): a pin nobody waits on costs its fields
 * and its watcher, nothing more.
 */
export class NativePidRef implements PidRef {
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
    if (this.#watcher) this.#ctx.addon.watchRef(this.#watcher, true);
  }

  unref(): void {
    this.#refed = false;
    if (this.#watcher) this.#ctx.addon.watchRef(this.#watcher, false);
  }

  close(): void {
    if (this.#closed) return;
    this.#closed = true;
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
      this.#ctx.addon.unwatch(this.#watcher);
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
    // Bound, not an arrow: no closure context per pin.
    this.#watcher = this.#ctx.addon.watch(this.#fd, this.#onReadable.bind(this));
    if (!this.#refed) this.#ctx.addon.watchRef(this.#watcher, false);
  }

  #onReadable(): void {
    // The watcher fired once and stopped itself.
    this.#watcher = 0;
    this.#seen = true;
    this.#resolveGone?.();
    this.#resolveGone = undefined;
    const { addon } = this.#ctx;
    const flags = addon.constants.WEXITED | addon.constants.WNOHANG;
    if (this.#origin === 'spawned') {
      // Our child: reap it through its pidfd. Nobody else can (libuv only
      // waits for the pids it spawned), so WNOHANG finds it.
      let info: ReturnType<NativeAddon['waitid']> = null;
      try {
        info = addon.waitid(this.#fd, flags);
      } catch {
        // ECHILD: something else reaped our child (a SIG_IGN'd SIGCHLD, a
        // stray waitpid(-1)). It is gone all the same; its status is lost.
      }
      this.#settle(info ? fromSiginfo(info) : UNKNOWN_EXIT);
      return;
    }
    if (this.#origin === 'adopted') {
      // Re-parented to us (we are a subreaper): ours to reap now, or it
      // stays a zombie. ECHILD: someone else's child; its parent reaps it.
      try {
        const info = addon.waitid(this.#fd, flags);
        if (info) {
          this.#settle(fromSiginfo(info));
          return;
        }
      } catch {
        // not our child
      }
    }
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
    argv: r.slice(9) as string[],
  };
}

export class NativeBackend extends ProcReads implements Backend {
  readonly name = 'native' as const;
  /** The vfork-style child writes itself into the target's cgroup.procs before execve (native/spawn.cc). */
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

  #inspect(pid: number, procRoot: string | undefined, keepPidfd: boolean): AddonInspect {
    assertOwnProc(procRoot);
    try {
      return this.#addon.inspect(pid, procRoot, keepPidfd);
    } catch (err) {
      // pidfd_open refuses a thread that is not a thread-group leader:
      // EINVAL before Linux 6.9, ENOENT since (PIDFD_THREAD can name threads).
      const { code, syscall } = err as NodeJS.ErrnoException;
      if ((code === 'EINVAL' || code === 'ENOENT') && syscall === 'pidfd_open') {
        const tgid = tgidOf(pid, procRoot);
        if (tgid !== null && tgid !== pid) throw new NotAProcessError(pid, tgid);
      }
      throw err;
    }
  }

  spawnedHere(pid: number): boolean {
    return spawnedPids.has(pid);
  }

  reapZombie(pid: number): boolean {
    let fd: number;
    try {
      fd = this.#addon.pidfdOpen(pid);
    } catch {
      return false;
    }
    try {
      const c = this.#addon.constants;
      return this.#addon.waitid(fd, c.WEXITED | c.WNOHANG) !== null;
    } catch {
      // ECHILD: not ours to reap after all
      return false;
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

  async listProcesses(procRoot?: string): Promise<ProcEntry[]> {
    assertOwnProc(procRoot);
    const flat = await this.#addon.listProcesses(procRoot);
    const out: ProcEntry[] = [];
    for (let i = 0; i < flat.length; ) {
      const pid = flat[i] as number;
      const ppid = flat[i + 1] as number;
      const pgrp = flat[i + 2] as number;
      const session = flat[i + 3] as number;
      const uid = flat[i + 4] as number;
      const startTicks = flat[i + 5] as number;
      const state = flat[i + 6] as string;
      const argc = flat[i + 7] as number;
      const argv = flat.slice(i + 8, i + 8 + argc) as string[];
      i += 8 + argc;
      out.push({ pid, ppid, pgrp, session, uid, startTicks, state, argv });
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
    const fds: [number, number, number] = [-1, -1, -1];
    const parentEnds: Array<number | null> = [null, null, null];
    const toClose: number[] = [];
    try {
      req.stdio.forEach((target, i) => {
        if (target === 'inherit') fds[i] = i;
        // -1: the addon's own /dev/null, already where the child can take it without a dup.
        else if (target === 'ignore') fds[i] = -1;
        else if (target === 'pipe') {
          const [r, w] = this.#addon.pipe();
          const childEnd = i === 0 ? r : w;
          fds[i] = childEnd;
          parentEnds[i] = i === 0 ? w : r;
          toClose.push(childEnd);
        } else fds[i] = target.fd;
      });
      // Opened here, written by the child: it allocates nothing and opens nothing.
      const procs = req.cgroup ? openSync(join(req.cgroup, 'cgroup.procs'), fsc.O_WRONLY) : null;
      let spawned: { pid: number; pidfd: number };
      try {
        spawned = this.#addon.spawn(req.file, req.argv, req.env, {
          cwd: req.cwd,
          stdio: fds,
          newSession: req.newSession,
          newGroup: req.newGroup,
          ...(procs !== null ? { cgroupProcs: procs } : {}),
        });
      } finally {
        if (procs !== null) closeSync(procs);
      }
      const { pid, pidfd } = spawned;
      const ref = new NativePidRef(this.#pins, pid, pidfd, 'spawned');
      const streams = parentEnds.map((fd, i) => {
        if (fd === null) return null;
        parentEnds[i] = null;
        return new Socket({ fd, readable: i !== 0, writable: i === 0 });
      });
      return {
        ref,
        stdin: (streams[0] as Writable | null) ?? null,
        stdout: (streams[1] as Readable | null) ?? null,
        stderr: (streams[2] as Readable | null) ?? null,
      };
    } finally {
      for (const fd of toClose) closeSync(fd);
      for (const fd of parentEnds) if (fd !== null) closeSync(fd);
    }
  }
}
