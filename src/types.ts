/** A process's identity as custody records and proves it. */
export interface ProcessIdentity {
  pid: number;
  /** /proc/sys/kernel/random/boot_id when the identity was read. */
  bootId: string;
  /** Start time in clock ticks since boot (field 22 of /proc/<pid>/stat). */
  startTicks: number;
  /** The executable's device and inode, or null where it cannot be read (kernel threads, other users). */
  exe: { dev: number; ino: number } | null;
  /** The pidfs inode number of a pidfd on the process (Linux >= 6.9, native backend), unique per boot. */
  pidfsId: string | null;
  /**
   * argv as bytes, each argument in custody's lossless string form: valid
   * UTF-8 as itself, every other byte as the lone surrogate U+DC00 + byte.
   * Compare these strings, not their display (see displayArg).
   */
  argv: string[];
  /** Real uid. */
  uid: number;
  ppid: number;
  /** Session id (field 6 of stat): custody's detached launches lead a session of their own, which every member stays in unless it calls setsid. */
  session: number;
  /**
   * One-letter state from /proc/<pid>/stat: R, S, D, Z, T... For a process
   * whose main thread exited while others run, a live thread's state (such a
   * process is alive, though its leader shows Z).
   */
  state: string;
  /**
   * The pid namespace the pid is numbered in (the inode of the reader's
   * /proc/self/ns/pid), or null where it cannot be read. A record from
   * another namespace names some other process here: unprovable, never gone.
   */
  pidNs: number | null;
  /**
   * The pid namespace the process itself lives in (the inode of
   * /proc/<pid>/ns/pid): pidNs for a process of the reader's namespace,
   * another for one in a child namespace (`unshare --pid`, a container),
   * whose token and argv prove nothing here. Where the link may not be
   * followed (another uid, a process that is not dumpable), status's NSpid
   * still tells the reader's own; null where it cannot be told, or for one
   * of a child namespace seen that way.
   */
  processPidNs: number | null;
}

/** How a process ended. Both null: the kernel could not say (not our child, no PIDFD_INFO_EXIT). */
export interface ExitStatus {
  /** The exit code, or null when it ended by a signal or its status is unknown. */
  code: number | null;
  /** The signal that ended it, or null. */
  signal: NodeJS.Signals | null;
  /** Present (true) where the kernel said the signal wrote a core (CLD_DUMPED); native backend only. */
  coreDumped?: true;
}

/**
 * Why an instance ended, as systemd's `Result=` says it: `success` (exit 0), `exit-code` (another code),
 * `signal` (killed by a signal), `core-dump` (killed, and the kernel wrote a core), `oom-kill` (killed, and the
 * instance cgroup's memory.events counted an OOM kill), `health` (its health probe failed `failures` times in
 * a row and custody stopped it), `watchdog` (no WATCHDOG=1 within watchdogMs, or WATCHDOG=trigger), `stopped`
 * (stop() ended it), `unknown` (the status
 * cannot be known: a non-child whose parent did not reap it within 1 s, or a kernel without PIDFD_INFO_EXIT).
 */
export type ExitResult =
  | 'success'
  | 'exit-code'
  | 'signal'
  | 'core-dump'
  | 'oom-kill'
  | 'health'
  | 'watchdog'
  | 'stopped'
  | 'unknown';

/** An instance's last end: its status and why it ended. */
export interface LastExit extends ExitStatus {
  result: ExitResult;
}

/** What LaunchSpec.afterExit is told of an end: whose run (its pid and token), how and why it ended. */
export interface AfterExitEnd {
  id: string;
  /** The run's main process; null where a launch attempt ended before it had one. */
  pid: number | null;
  token: string;
  code: number | null;
  signal: NodeJS.Signals | null;
  result: ExitResult;
  /** Its restart policy restarts it once the hook has returned. */
  restarting: boolean;
}

/**
 * The last output of a process that ended, each within the same byte bound (2 KiB): from its instance log,
 * a `{ file }` it was given, or a pipe. undefined where there is none to read (nothing written, 'ignore').
 */
export interface OutputTails {
  /** The last lines of the instance's stderr log (or the stderr pipe), for error messages. */
  stderrTail?: string;
  /** For programs that log to stdout (redis, many containers' entrypoints). */
  stdoutTail?: string;
}

/** How a process, or an instance (Supervisor.stop()), was ended: what is known of its main process. */
export interface StopResult {
  /** 'exited': it ended after a signal was sent; 'already-gone': it had ended before. */
  outcome: 'exited' | 'already-gone';
  /** killSignal had to be sent. */
  escalated: boolean;
  /** The main process's exit code, or null (a signal, or unknown). */
  code: number | null;
  /** The signal that ended the main process, or null. */
  signal: NodeJS.Signals | null;
}

/** What Supervisor.stop() resolves with: how the stop went, and why the instance ended (`stopped`, or its own end). */
export interface InstanceStopResult extends StopResult {
  /** Why the instance ended (systemd Result= words): `stopped` for a stop, or its own end when it ended first. */
  result: ExitResult;
}

/** What `verify()` concludes of a recorded identity, in the order it checks: gone, rebooted, unrecorded, reused, mismatch, else ok (unprovable: no way to tell here). */
export type Verdict = 'ok' | 'gone' | 'rebooted' | 'unprovable' | 'unrecorded' | 'reused' | 'mismatch';

/** The result of `verify()`: the verdict and, for unrecorded and mismatch, the field that decided it. */
export interface VerifyResult {
  verdict: Verdict;
  /** The field that decided, where one did. */
  field?: string;
}

/** What `capabilities()` reports: the backend in use, why (when not native), and which guarantees hold here. */
export interface Capabilities {
  backend: 'native' | 'js';
  /** Why the native backend is not in use, when it is not. */
  reason?: string;
  platform: NodeJS.Platform;
  kernel: string | null;
  /** /proc is readable: identities can be read at all. */
  proc: boolean;
  /** Signals go through pidfds. */
  pidfd: boolean;
  /** Identities carry pidfs ids (Linux >= 6.9), which decide PID reuse even within one clock tick. */
  pidfsId: boolean;
  /** The exit status of processes that are not our children (PIDFD_INFO_EXIT, Linux >= 6.15). */
  exitInfoOfNonChildren: boolean;
  /** A signal can never reach a process that reused the pid. */
  raceFreeSignals: boolean;
  /** inspect() never mixes two processes' fields. */
  raceFreeIdentity: boolean;
  /** Children are created with a pidfd from birth (clone CLONE_PIDFD|CLONE_VFORK). */
  spawnWithPidfd: boolean;
  /** ready: 'notify' (systemd's sd_notify) works: a datagram socket with its senders' credentials (native backend). */
  notify: boolean;
  /**
   * An end by a signal that wrote a core is told apart (`result: 'core-dump'`): the native backend reads the
   * kernel's CLD_DUMPED; the js backend (child_process reports the signal alone) says `signal`.
   */
  coreDump: boolean;
  /**
   * Each notification carries a pidfd on its sender (SO_PASSPIDFD, Linux 6.5), so a sender that exited, and
   * whose pid was reused, before custody read its message is never mistaken for the new owner of the pid.
   */
  notifyPidfd: boolean;
  /** Errno name per probed kernel call ('' when it works), for diagnostics. */
  probe: Record<string, string>;
  /**
   * The exec attributes (spawn() and LaunchSpec: runAs, umask, rlimits, oomScoreAdj, noNewPrivileges) this
   * backend applies, and, where it cannot apply them all, why. What it cannot apply is ERR_CUSTODY_UNSUPPORTED.
   */
  exec: ExecCapabilities;
  /**
   * What cgroup v2 offers for instance cgroups (Supervisor.open's `cgroup`
   * option), described at the mount's root; a supervisor's capabilities()
   * describes its own root. null where there is no cgroup v2 (cgroupReason says why).
   */
  cgroup?: CgroupCapabilities | null;
  /** Why `cgroup` is null. */
  cgroupReason?: string;
}

/** The exec attributes a backend applies (Capabilities.exec). */
export interface ExecCapabilities {
  /** `runAs` (uid, gid, groups) can be given; the js backend takes no groups, and not with a cgroup. */
  runAs: boolean;
  /** `umask` can be given. */
  umask: boolean;
  /** `oomScoreAdj` can be given; the js backend, with runAs, none below the agent's own. */
  oomScoreAdj: boolean;
  /** `noNewPrivileges` can be given (native only: a shell has no prctl). */
  noNewPrivileges: boolean;
  /** The limits (names of LaunchSpec.rlimits) it can set. */
  rlimits: string[];
  /** What it cannot do, and in which combinations. */
  reason?: string;
}

/** Where cgroup v2 is mounted, what the kernel offers, and how this backend places a child in a cgroup. */
export interface CgroupCapabilities {
  /** The cgroup2 mount point, from /proc/self/mountinfo. */
  mount: string;
  /** The directory described: the mount point, or a supervisor's cgroup root. */
  root: string;
  /** The mount is read-only: no cgroup can be made under it. */
  readOnly: boolean;
  /**
   * How this backend places a child in its cgroup before it execs: the native
   * vfork-style child writes itself into cgroup.procs ('child-write'); the js
   * backend execs through /bin/sh, which does ('exec-wrapper'). null: it cannot.
   */
  placement: 'child-write' | 'exec-wrapper' | null;
  /** clone3 knows CLONE_INTO_CGROUP (Linux 5.7). A fact about the kernel; placement says what custody uses. */
  cloneIntoCgroup: boolean;
  /** cgroup.kill (Linux 5.14); without it stop kills every member through its own pidfd. */
  kill: boolean;
  /** cgroup.freeze (Linux 5.2): freeze() and thaw(). */
  freeze: boolean;
  /** The root's cgroup.controllers: what it could give its children. */
  controllers: string[];
  /** Controllers turned on for the cgroups below the root (limits and memory usage need them). */
  enabled: string[];
}
