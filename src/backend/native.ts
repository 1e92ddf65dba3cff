/**
 * The native backend: every process reference is a pidfd; exits are seen by
 * polling pidfds on the libuv loop (one epoll registration each, O(1) per
 * exit); children come from clone(CLONE_PIDFD | CLONE_VFORK | CLONE_VM).
 *
 * This file is the Backend itself: inspection, scans, notify, locks. Its
 * pins (native-pin.ts), their exit watcher (native-watch.ts), the spawn
 * path (native-spawn.ts) and the reading of the addon's inspection
 * (native-inspect.ts) each have a module of their own.
 */
import { availableParallelism, constants } from 'node:os';
import { errnoError, isErrnoCode } from '../errors.js';
import { PF_KTHREAD } from '../process/proc.js';
import type { Capabilities } from '../types.js';
import type { AddonInspect, NativeAddon } from './addon.js';
import { fromAddon, inspectFailure } from './native-inspect.js';
import { NativePidRef, type Origin, type PinContext, pidfsIdOf, pinContext, spawnedPids } from './native-pin.js';
import { spawnNative } from './native-spawn.js';
import { assertOwnProc, ProcReads } from './procview.js';
import type {
  Backend,
  ExecAttrs,
  FileRead,
  NotifyDatagram,
  NotifyListener,
  PidRef,
  ProcEntry,
  RawIdentity,
  SpawnedChild,
  SpawnRequest,
} from './types.js';

/** At most this many threadpool threads share one argv-first scan (libuv's pool has four by default). */
const MATCH_SHARDS = 2;

/**
 * What SCM_PIDFD's -errno says: the sender had exited before the datagram was read (it cannot be pinned,
 * so it cannot be judged), or this process could not take one more fd (EMFILE...), an error of ours.
 */
function notifySenderUnpinned(negErrno: number): 'gone' | Error {
  const errno = -negErrno;
  if (errno === constants.errno.ESRCH || errno === constants.errno.EINVAL) return 'gone';
  const code = Object.entries(constants.errno).find(([, n]) => n === errno)?.[0];
  return isErrnoCode(code)
    ? errnoError(code, 'recvmsg', undefined, 'SCM_PIDFD: the kernel could not pin the sender of a notification')
    : new Error(`recvmsg: SCM_PIDFD carried errno ${errno}: the kernel could not pin the sender of a notification`);
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

  openNotify(name: string, onDatagram: (d: NotifyDatagram | null, error: Error | null) => void): NotifyListener {
    const addon = this.#addon;
    const pins = this.#pins;
    let open = true;
    const { id, passPidfd } = addon.notifyOpen(name, (error, datagram) => {
      if (!datagram) {
        if (open) onDatagram(null, error);
        return;
      }
      const [data, truncated, controlTruncated, fds, pid, uid, fd] = datagram;
      // The pidfd is ours from here: a PidRef closes it (or its finalizer does).
      const sender = fd === null ? null : fd >= 0 ? new NativePidRef(pins, pid, fd, 'other') : notifySenderUnpinned(fd);
      if (!open) {
        if (sender && sender !== 'gone' && !(sender instanceof Error)) sender.close();
        return;
      }
      // Out of fds, say: the sender is not known, so neither is what the datagram is worth.
      if (sender instanceof Error) {
        onDatagram(null, sender);
        return;
      }
      const senderId = fd !== null && fd >= 0 ? pidfsIdOf(addon, fd) : null;
      onDatagram({ data, truncated, controlTruncated, fds, pid, uid, sender, senderId }, null);
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
    return spawnNative(this.#addon, this.#pins, req);
  }

  /** The child applies every exec attribute; what the kernel refuses is the spawn's errno error. */
  checkExec(_exec: ExecAttrs, _cgroup: boolean): void {}
}
