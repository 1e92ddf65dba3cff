/**
 * The one interface both backends implement. `native` is the addon (pidfds,
 * clone with CLONE_PIDFD, /proc read in C); `js` is child_process,
 * process.kill and fs reads of /proc. Policy never lives here.
 */
import type { Readable, Writable } from 'node:stream';
import type { StatFields } from '../process/proc.js';
import type { Capabilities, ExitStatus } from '../types.js';

/**
 * Where a process that showed `image` (a fork of the process with that
 * layout) is in its exec: still the fork ('fork'); inside execve ('exec':
 * between the switch to the new memory and the new argv, /proc shows a
 * layout of zeros and an empty cmdline, for as long as the kernel takes,
 * which under load is milliseconds); past it ('done': a new layout and an
 * argv, or a pid that names another process now); or gone (exited: a
 * zombie, or no such pid).
 */
export type ExecStage = 'fork' | 'exec' | 'done' | 'gone';

/** What one inspection of /proc/<pid> yields, before policy adds the boot id. */
export interface RawIdentity {
  state: string;
  ppid: number;
  /** Session id: the members of a session we created with setsid are ours. */
  session: number;
  startTicks: number;
  argv: string[];
  uid: number;
  exe: { dev: number; ino: number } | null;
  pidfsId: string | null;
  /** The pid namespace the process lives in (see ProcessIdentity.processPidNs). */
  processPidNs: number | null;
}

/** One row of a process-table scan. Not proof of anything: a candidate to inspect. */
export interface ProcEntry {
  pid: number;
  ppid: number;
  pgrp: number;
  session: number;
  /**
   * The owner of /proc/<pid>: the effective uid, or root for a process that
   * is not dumpable. A hint to narrow a scan, never grounds to act or to
   * exclude: the real uid is read under a pidfd.
   */
  uid: number;
  state: string;
  startTicks: number;
  argv: string[];
  /** Set only by a scan asked for images: the one of them this process's address-space layout equals. */
  image?: string;
  /** Set (true) only by a scan asked for images, for a kernel thread: no argv, no layout, never in an exec. */
  kernelThread?: boolean;
}

/**
 * A reference pinned to one process. On the native backend it holds a pidfd,
 * so a signal can never reach a later owner of the pid; on the js backend it
 * re-checks the start time before each signal (best effort: there is a window).
 */
export interface PidRef {
  readonly pid: number;
  /** Sends signo (0 probes). false when the process is gone; never throws for that. */
  signal(signo: number): boolean;
  /** Settles once the process has exited (and, for a child we spawned, been reaped). Never rejects. */
  readonly exited: Promise<ExitStatus>;
  /** Set once the exit status is known (or known to be unknowable). */
  readonly exitStatus: ExitStatus | undefined;
  /** Settles the moment the exit is seen, before its status may be known (a non-child's parent may reap it later). */
  readonly gone: Promise<void>;
  /** Whether the exit has been seen. */
  readonly hasExited: boolean;
  ref(): void;
  unref(): void;
  /** Releases the pin. A child we spawned is still reaped when it exits. */
  close(): void;
  /**
   * From now on, once the exit is seen (`gone`), keep the zombie of this child of ours instead of reaping it,
   * until releaseExit() (or a bound), and call `onHeld` then: while it is unreaped, its pid (and so the
   * session it leads) can be no one else's. false where that cannot be (the js backend: libuv reaps; not our
   * child; already gone).
   */
  holdExit?(onHeld?: () => void): boolean;
  /** Ends holdExit(): reaps the zombie now if the exit was seen, else reaps as usual when it comes. */
  releaseExit?(): void;
  /** Whether holdExit() holds now: the process, alive or a zombie, has not been reaped, so its pid is taken. */
  exitHeld?(): boolean;
}

export type StdioTarget = 'ignore' | 'inherit' | 'pipe' | { fd: number };

/** A resource limit's name in `rlimits`: RLIMIT_NOFILE is `nofile`, RLIMIT_AS is `as`... */
export type RlimitName = 'nofile' | 'memlock' | 'core' | 'nproc' | 'as' | 'fsize' | 'stack' | 'cpu';
/** The resource limits a spawn may set, in the order the child sets them. */
export const RLIMIT_NAMES: readonly RlimitName[] = [
  'nofile',
  'memlock',
  'core',
  'nproc',
  'as',
  'fsize',
  'stack',
  'cpu',
];

/**
 * What the child is given between clone and exec, checked by src/process/exec-attrs.ts: its credentials,
 * resource limits (Infinity: RLIM_INFINITY), oom_score_adj, umask and no_new_privs. null or absent fields: as
 * the parent has them.
 */
export interface ExecAttrs {
  runAs: { uid: number; gid: number; groups: readonly number[] } | null;
  umask: number | null;
  rlimits: ReadonlyArray<{ name: RlimitName; soft: number; hard: number }>;
  oomScoreAdj: number | null;
  noNewPrivileges: boolean;
}

export interface SpawnRequest {
  /** Resolved path of the executable (PATH search is done by the caller). */
  file: string;
  /** Full argv, argv[0] included. */
  argv: string[];
  /** "KEY=value" strings; null for this process's own environment. */
  env: string[] | null;
  cwd: string | undefined;
  stdio: [StdioTarget, StdioTarget, StdioTarget];
  /** setsid(): a detached long-lived process outlives our session and terminal. */
  newSession: boolean;
  /** setpgid(0, 0): its own process group, for group signals. */
  newGroup: boolean;
  /**
   * A cgroup v2 directory the child enters before it execs (so everything it
   * forks starts there too): the native child writes itself into its
   * cgroup.procs; the js backend execs through a shell that does. null: ours.
   */
  cgroup?: string | null;
  /** Credentials, limits, oom_score_adj, umask, no_new_privs for the child; null: none (the parent's). */
  exec?: ExecAttrs | null;
}

export interface SpawnedChild {
  ref: PidRef;
  stdin: Writable | null;
  stdout: Readable | null;
  stderr: Readable | null;
}

/** One sd_notify datagram as the kernel delivered it. Nothing here is proof: the sender is judged by src/lifecycle/notify.ts. */
export interface NotifyDatagram {
  data: Buffer;
  /** Longer than a notification may be (4096 bytes): never parsed. */
  truncated: boolean;
  /**
   * It carried more control data than the receiver takes (MSG_CTRUNC): in practice more fds than the few a
   * notification may pass. The kernel closed the fds that did not fit; those that did were closed too.
   */
  controlTruncated: boolean;
  /** SCM_RIGHTS fds that arrived with it. None is kept: each is closed once the datagram is handled. */
  fds: number;
  /** The sender's pid and real uid from SCM_CREDENTIALS at send time; pid 0 when none came. */
  pid: number;
  uid: number;
  /**
   * The sender pinned by the kernel (SCM_PIDFD, Linux 6.5), for the receiver to check and close; null where
   * the kernel has no SO_PASSPIDFD; 'gone' when the sender had exited before the datagram was read.
   */
  sender: PidRef | null | 'gone';
  /** The pidfs id of that pidfd (Linux 6.9): names the sender exactly, even once it has exited and been reaped. */
  senderId: string | null;
}

/** A bound notification socket. It keeps the event loop alive until closed or unref'd. */
export interface NotifyListener {
  /** The value for NOTIFY_SOCKET: '@' and the abstract name. */
  readonly address: string;
  /** Whether datagrams carry a pidfd on their sender (NotifyDatagram.sender). */
  readonly pinsSenders: boolean;
  /** The socket no longer keeps the event loop alive. */
  unref(): void;
  /** Stops reading and closes the socket. Idempotent. */
  close(): void;
}

export interface Backend {
  readonly name: 'native' | 'js';
  capabilities(): Capabilities;
  /** How spawn places a child in a cgroup before exec (SpawnRequest.cgroup), or null where it cannot (say why in cgroupPlacementReason). */
  readonly cgroupPlacement: 'child-write' | 'exec-wrapper' | null;
  readonly cgroupPlacementReason?: string;
  /** The errno name clone3(CLONE_INTO_CGROUP) answers ('' where the kernel has it); null where the backend cannot ask. */
  probeCloneIntoCgroup(): string | null;
  /** Reads one process's identity fields. Throws an errno error (code ESRCH) when there is none. */
  inspect(pid: number, procRoot?: string): RawIdentity;
  /**
   * Inspects and keeps the pin the inspection was made under, for signalling
   * the proven process. `reapIfChild`: if the process has become our child
   * (re-parented to us as a subreaper), reap it when it exits. Only for
   * processes custody launched or adopted: never for one Node's
   * child_process may own.
   */
  inspectPinned(pid: number, options?: { reapIfChild?: boolean }): { raw: RawIdentity; ref: PidRef };
  /**
   * inspectPinned of each pid, in order, off the event loop: each entry is
   * the pin, or the error inspectPinned would have thrown for that pid. Only
   * where the backend can read /proc on another thread (native: the
   * threadpool); absent elsewhere. At most 65536 pids; the caller sizes its
   * batches, since each holds a pidfd per live process.
   */
  inspectPinnedMany?(
    pids: readonly number[],
    options?: { reapIfChild?: boolean },
  ): Promise<Array<{ raw: RawIdentity; ref: PidRef } | Error>>;
  /**
   * <name>/<leaf> under the dir held by dirFd, for each name, off the event
   * loop, never following a symlink nor opening what is not a regular file:
   * its bytes; the errno Error of the call that failed (syscall "opendir"
   * for <name> itself, "lstat" or "open" for the leaf); or, for what is not a
   * regular file of at most maxBytes, its mode and size (swapped: replaced
   * between the lstat and the open); or null, unread, once the batch holds
   * 32 MiB (the caller reads those itself). Native only; at most 65536
   * names. The caller keeps dirFd open until the promise settles.
   */
  readFilesAt?(
    dirFd: number,
    names: readonly string[],
    leaf: string,
    maxBytes: number,
  ): Promise<Array<FileRead | null>>;
  /** PR_SET_CHILD_SUBREAPER for this process; false where the backend cannot. */
  setChildSubreaper(on: boolean): boolean;
  /** Whether pid is a child this backend spawned and will reap itself (never to be reaped by anyone else). */
  spawnedHere(pid: number): boolean;
  /**
   * Reaps a zombie child of ours now (waitid WNOHANG through a pidfd); false when it is not one. With
   * `pidfsId`, only the process of that pidfs id (read under the same pidfd): never a later owner of the pid.
   */
  reapZombie(pid: number, pidfsId?: string): boolean;
  /** The pidfs id of the process at pid now (alive or a zombie), read under a pidfd; null where there is none (js, Linux < 6.9). */
  pidfsIdOf(pid: number): string | null;
  /** Whether this process is a child subreaper now; null where the backend cannot tell. */
  childSubreaper(): boolean | null;
  bootId(): string;
  /** /proc/<pid>/stat, parsed; null when there is no such process. A cheap read for display, never proof. */
  stat(pid: number): StatFields | null;
  /** The pids of a process's children ([] when it is gone). A listing, not proof: each is pinned and re-checked. */
  children(pid: number): number[];
  /** The pids in any of these sessions (by stat's session field), from one scan. A listing, not proof: each is pinned and re-checked. */
  sessionMembers(sessions: ReadonlySet<number>): Promise<number[]>;
  /** sessionMembers read now, on this thread (slower, blocks): for when the threadpool cannot serve it in time. */
  sessionMembersNow(sessions: ReadonlySet<number>): number[];
  /** A process's cgroup v2 path (/proc/<pid>/cgroup's `0::` line); null when it is gone or there is no v2 hierarchy. A read, not proof. */
  cgroupOf(pid: number): string | null;
  /** /proc/self/mountinfo, for finding cgroup v2 mounts. */
  mountinfo(): string;
  /**
   * A reference for a process whose identity cannot be proven (off Linux,
   * allowUnprovable): signals by pid, polls liveness by signal 0.
   */
  unproven(pid: number): PidRef;
  spawn(req: SpawnRequest): SpawnedChild;
  /** Throws ERR_CUSTODY_UNSUPPORTED for exec attributes this backend cannot give a child (placed in a cgroup or not). */
  checkExec(exec: ExecAttrs, cgroup: boolean): void;
  /**
   * The pids whose argv is exactly `argv`, compared as bytes, reading only
   * cmdline (off the event loop on the native backend). Candidates, not
   * proof: each is inspected under a pin. Exhaustion is thrown.
   */
  matchArgv(argv: readonly string[], procRoot?: string): Promise<number[]>;
  /**
   * Scans the process table (off the event loop on the native backend). With `images` (layouts as
   * parseImage gives them; none is an answer too), each process whose layout is one of them has it as
   * `image`, and each kernel thread is marked `kernelThread`.
   */
  listProcesses(procRoot?: string, images?: readonly string[]): Promise<ProcEntry[]>;
  /** Where a process that showed `image` (a fork of the process with that layout) is in its exec. */
  execStage(pid: number, image: string): ExecStage;
  /** The inode of our own pid namespace (/proc/self/ns/pid), read once; null where it cannot be read. */
  ownPidNs(): number | null;
  /** Throws ERR_CUSTODY_FOREIGN_PROC unless `<procRoot>/self` is this process: a /proc of another pid namespace. */
  assertOwnProc(procRoot?: string): void;
  /**
   * What a fork of this process shows until it execs: our own address-space layout (as parseImage gives
   * it); null where it would not tell our forks from other processes of our program (no randomization).
   */
  ownForkImage(): string | null;
  /** When this boot began, in ms since the epoch (/proc/stat's btime, whole seconds, moved by clock steps); null where unknown. */
  bootTimeMs(): number | null;
  /**
   * The path /proc/<pid>/exe links to, lossless (custody's string form of bytes), " (deleted)" included. A
   * name for people, never proof: the pid may name another process by the time it returns. null for a
   * kernel thread, a process we may not look at, or none.
   */
  exePath(pid: number): string | null;
  /** Whether a pinned process still exists (signal 0 through its pin; EPERM means it does). */
  pinnedAlive(ref: PidRef): boolean;
  /**
   * /proc/<pid>/environ of the pinned process: at most maxBytes (a prefix beyond). Read, then checked against
   * the pin: ESRCH when its process is gone (the read may have been of a later owner of the pid, and is
   * discarded). EACCES or EPERM when it may not be read (another uid, a process that is not dumpable).
   */
  readEnviron(ref: PidRef, maxBytes: number): Buffer;
  /**
   * Binds a datagram socket to the abstract unix name `name` (at most 107 bytes) that passes its senders'
   * credentials, and calls onBatch on the loop with what arrives. ERR_CUSTODY_UNSUPPORTED on the js backend.
   */
  /**
   * Binds an sd_notify socket. `onDatagram` gets each datagram in the order sent, one at a time (the fds
   * that came with it are closed once it returns), or a receive error with a null datagram.
   */
  openNotify(name: string, onDatagram: (d: NotifyDatagram | null, error: Error | null) => void): NotifyListener;
  /** Takes an exclusive advisory lock on an open fd without blocking; false when another holds it. */
  tryLock(fd: number): boolean | 'unsupported';
}

/** One file read by readFilesAt. */
export type FileRead = Buffer | Error | { mode: number; size: number; swapped: boolean };
