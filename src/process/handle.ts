/**
 * open() and spawn(): the two ways to a ProcessHandle. open() pins an
 * existing process (pin.ts) after proving it is the expected one; spawn()
 * pins a new child from birth.
 */
import { accessSync, closeSync, constants as fsConstants, openSync, readSync, statSync } from 'node:fs';
import * as path from 'node:path';
import type { Readable, Writable } from 'node:stream';
import { fsPath } from '../bytes.js';
import { backend } from '../backend/index.js';
import type { StdioTarget } from '../backend/types.js';
import {
  errnoError,
  BadCgroupError,
  IdentityMismatchError,
  IdentityUnrecordedError,
  InvalidArgError,
  UnsupportedError,
} from '../errors.js';
import { type ExecAttributes, execAttrs } from './exec-attrs.js';
import { verify } from './identity.js';
import { pin, ProcessHandle } from './pin.js';
import { openAppend } from '../state/logs.js';
import { UNKNOWN_EXIT } from './signals.js';
import { TIMED_OUT, within } from '../timing.js';
import type { ExitStatus, ProcessIdentity } from '../types.js';
import { assertCwd, assertEnv, assertFlag, assertPid, assertStringArray } from '../validate.js';

export { ProcessHandle } from './pin.js';
/** @internal The exit hold, for this package's own modules (stripped from the published types, as in pin.ts). */
export { exitHeld, holdExit, releaseExit } from './pin.js';

/**
 * Opens a handle on an existing process. With `expected`, the live process
 * must verify against it, and the pidfd the proof was read under is the one
 * every later signal goes through.
 */
export function open(pid: number, expected?: Partial<ProcessIdentity>): ProcessHandle {
  assertPid(pid);
  const pinned = pin(pid, { thread: 'refuse' });
  if (!pinned) throw errnoError('ESRCH', 'pidfd_open', undefined, `pid ${pid}`);
  const { identity, handle } = pinned;
  if (expected !== undefined) {
    const result = verify({ ...expected, pid }, identity);
    if (result.verdict !== 'ok') {
      handle.close();
      if (result.verdict === 'unrecorded') throw new IdentityUnrecordedError(pid, result.field ?? 'identity');
      throw new IdentityMismatchError(pid, result.verdict, result.field);
    }
  }
  return handle;
}

/** One stdio slot of a spawned process: `/dev/null`, this process's own, a pipe (the handle's `stdin`/`stdout`/`stderr`), a file opened to append, or an fd of this process. */
export type StdioOption = 'ignore' | 'inherit' | 'pipe' | { file: string } | { fd: number };

/**
 * Options of `spawn()`. Also the exec attributes (ExecAttributes: runAs, umask, rlimits, oomScoreAdj,
 * noNewPrivileges), applied in the child before it execs; a step the kernel refuses is the spawn's errno error
 * (`syscall` names it, e.g. `prlimit64`, `setresuid`), and the program never runs. The js backend applies what
 * it can (capabilities().exec); the rest is ERR_CUSTODY_UNSUPPORTED.
 */
export interface SpawnOptions extends ExecAttributes {
  /**
   * One value for all three, or [stdin, stdout, stderr]. 'ignore' by default. `{ file }` appends to a regular
   * file (created 0600; a symlink, FIFO or device there is ERR_CUSTODY_BAD_LOG).
   */
  stdio?: StdioOption | [StdioOption, StdioOption, StdioOption];
  /** The child's environment; process.env by default. */
  env?: Record<string, string | undefined>;
  cwd?: string;
  /** A new session (setsid): for long-lived processes that must not share our terminal or process group. */
  detached?: boolean;
  /** A new process group (setpgid), so the group can be signalled as one. Implied by detached; on the js backend it also means a new session (child_process has no setpgid alone). */
  processGroup?: boolean;
  /** @deprecated Renamed `processGroup`, as LaunchSpec calls it; this alias goes in the next minor version (giving both is ERR_CUSTODY_INVALID_ARG). */
  newGroup?: boolean;
  /** argv[0] as the program sees it; the command by default. */
  argv0?: string;
  /**
   * An absolute cgroup v2 directory the child starts in: it is placed there
   * before it execs, so nothing it forks, double-forks or setsids can start
   * outside (capabilities().cgroup.placement says how). A child that cannot
   * be placed is never run: ERR_CUSTODY_BAD_CGROUP.
   */
  cgroup?: string;
}

/**
 * How a process ended, once its exit has been seen: at once for our own children, within `ms` for one whose
 * parent must reap it first (PIDFD_INFO_EXIT), else unknown. Never longer than `ms`; aborts with `signal`.
 */
export async function exitStatusWithin(h: ProcessHandle, ms: number, signal?: AbortSignal): Promise<ExitStatus> {
  const st = h.exitStatus ?? (await within(h.exited, ms, signal));
  return st === TIMED_OUT ? UNKNOWN_EXIT : st;
}

/** PATH search, done here so both backends fail the same way (ENOENT, EACCES) before any process exists. */
export function resolveExecutable(command: string, env: Record<string, string | undefined>, cwd?: string): string {
  const errno = (code: 'ENOENT' | 'EACCES', p: string) => errnoError(code, 'spawn', p);
  const check = (p: string): string | 'ENOENT' | 'EACCES' => {
    try {
      const st = statSync(fsPath(p));
      if (!st.isFile()) return 'EACCES';
      accessSync(fsPath(p), fsConstants.X_OK);
      return p;
    } catch (err) {
      return (err as NodeJS.ErrnoException).code === 'EACCES' ? 'EACCES' : 'ENOENT';
    }
  };
  if (command.includes('/')) {
    const p = path.resolve(cwd ?? process.cwd(), command);
    const r = check(p);
    if (r === 'ENOENT' || r === 'EACCES') throw errno(r, command);
    return p;
  }
  let sawEacces = false;
  for (const dir of (env.PATH ?? '/usr/local/bin:/usr/bin:/bin').split(':')) {
    if (!dir) continue;
    const r = check(path.resolve(cwd ?? process.cwd(), dir, command));
    if (r === 'EACCES') sawEacces = true;
    else if (r !== 'ENOENT') return r;
  }
  throw errno(sawEacces ? 'EACCES' : 'ENOENT', command);
}

/** The file spawn() would exec for `command` (its dev and ino), found as spawn() finds it; throws as resolveExecutable does. */
export function executableId(
  command: string,
  env: Record<string, string | undefined>,
  cwd?: string,
): { dev: number; ino: number } {
  return spawnedFile(command, env, cwd).id;
}

/**
 * executableId, and whether the file is a script (starts with #!): the
 * kernel then runs its interpreter. A file we may not read (mode 0711) is
 * no script: an interpreter could not read it either.
 */
export function spawnedFile(
  command: string,
  env: Record<string, string | undefined>,
  cwd?: string,
): { id: { dev: number; ino: number }; script: boolean } {
  const file = fsPath(resolveExecutable(command, env, cwd));
  const st = statSync(file);
  const id = { dev: st.dev, ino: st.ino };
  let fd: number;
  try {
    fd = openSync(file, fsConstants.O_RDONLY | fsConstants.O_NONBLOCK);
  } catch {
    return { id, script: false };
  }
  try {
    const head = Buffer.alloc(2);
    return { id, script: readSync(fd, head, 0, 2, 0) === 2 && head[0] === 0x23 && head[1] === 0x21 };
  } finally {
    closeSync(fd);
  }
}

/** Turns spawn options into backend stdio targets; opens `{ file }` targets (the caller closes them). */
export function stdioTargets(stdio: SpawnOptions['stdio'], opened: number[]): [StdioTarget, StdioTarget, StdioTarget] {
  // The default, and the common case of a busy spawner: nothing to open.
  if (stdio === undefined || stdio === 'ignore') return ['ignore', 'ignore', 'ignore'];
  const list = Array.isArray(stdio) ? stdio : [stdio, stdio, stdio];
  if (list.length !== 3) throw new InvalidArgError('stdio must be one value or three');
  return list.map((s, i): StdioTarget => {
    if (s === 'ignore' || s === 'inherit' || s === 'pipe') return s;
    if (s && typeof s === 'object' && 'fd' in s && Number.isInteger(s.fd) && s.fd >= 0) return { fd: s.fd };
    if (s && typeof s === 'object' && 'file' in s && typeof s.file === 'string' && s.file && !s.file.includes('\0')) {
      if (i === 0) throw new InvalidArgError('stdin cannot append to a file');
      // Opened here, closed by the caller right after spawn: only the child
      // keeps it. Never through a symlink, never a FIFO (it would hang us or
      // the child): ERR_CUSTODY_BAD_LOG.
      const fd = openAppend(s.file);
      opened.push(fd);
      return { fd };
    }
    throw new InvalidArgError(`stdio[${i}] must be 'ignore', 'inherit', 'pipe', { file } or { fd }`);
  }) as [StdioTarget, StdioTarget, StdioTarget];
}

/** A spawn that failed to enter its cgroup (opening or writing cgroup.procs) says so; any other failure is its own. */
function placementError(cgroup: string, err: unknown): unknown {
  const e = err as NodeJS.ErrnoException;
  const procs = path.join(cgroup, 'cgroup.procs');
  // The child's write has no path; a write of an exec attribute's (oom_score_adj) names its file.
  if ((e?.syscall === 'write' && e.path === undefined) || (e?.syscall === 'open' && e.path === procs)) {
    return new BadCgroupError(cgroup, `the child could not enter it (${e.syscall} ${e.code}); nothing was run`, {
      cause: err,
    });
  }
  return err;
}

/** An environment as execve's list; spawn() has checked it (assertEnv). */
function envList(env: Record<string, string | undefined>): string[] {
  const out: string[] = [];
  for (const [k, v] of Object.entries(env)) if (v !== undefined) out.push(`${k}=${v}`);
  return out;
}

/** A stream exists exactly where its slot is 'pipe'; a union (a stdio value not known until run time) gives both. */
type PipeOr<S, Stream> = S extends 'pipe' ? Stream : null;
/** Slot I of a stdio option: one value stands for all three. */
type StdioSlot<S, I extends 0 | 1 | 2> = S extends readonly [StdioOption, StdioOption, StdioOption] ? S[I] : S;

/** The handle spawn() returns for the stdio option S: stdin, stdout and stderr typed non-null where S pipes them. */
export type SpawnedHandle<S extends SpawnOptions['stdio']> = ProcessHandle & {
  readonly stdin: PipeOr<StdioSlot<S, 0>, Writable>;
  readonly stdout: PipeOr<StdioSlot<S, 1>, Readable>;
  readonly stderr: PipeOr<StdioSlot<S, 2>, Readable>;
};

/**
 * Spawns a child and returns its handle. On the native backend the pidfd
 * comes with the pid (clone CLONE_PIDFD), the child is created without
 * copying our page tables (CLONE_VM | CLONE_VFORK), and exec failure
 * (ENOENT, EACCES) is thrown synchronously with nothing left behind.
 *
 * With `stdio` written out (`'pipe'`, or `['ignore', 'pipe', 'pipe']`) the
 * handle's streams are typed by it: non-null where piped, null elsewhere.
 */
export function spawn<S extends SpawnOptions['stdio']>(
  command: string,
  args: readonly string[],
  options: SpawnOptions & { stdio: S },
): SpawnedHandle<S>;
export function spawn(command: string, args?: readonly string[], options?: SpawnOptions): ProcessHandle;
export function spawn(command: string, args: readonly string[] = [], options: SpawnOptions = {}): ProcessHandle {
  if (typeof command !== 'string' || command === '' || command.includes('\0')) {
    throw new InvalidArgError('command must be a non-empty string without NUL bytes');
  }
  assertStringArray(args, 'args');
  assertCwd(options.cwd);
  if (options.env !== undefined) assertEnv(options.env);
  assertFlag(options.detached, 'detached');
  assertFlag(options.processGroup, 'processGroup');
  assertFlag(options.newGroup, 'newGroup');
  if (options.processGroup !== undefined && options.newGroup !== undefined)
    throw new InvalidArgError('give processGroup or its deprecated alias newGroup, not both');
  if (options.argv0 !== undefined) {
    // An empty argv[0] is the kernel's to allow; not a string, or a NUL, is nothing execve can carry.
    if (typeof options.argv0 !== 'string') throw new InvalidArgError('argv0 must be a string');
    assertStringArray([options.argv0], 'argv0');
  }
  if (options.cgroup !== undefined) {
    if (typeof options.cgroup !== 'string' || !path.isAbsolute(options.cgroup) || options.cgroup.includes('\0')) {
      throw new InvalidArgError('cgroup must be an absolute path without NUL bytes');
    }
    if (!backend.cgroupPlacement)
      throw new UnsupportedError(
        `cannot place a child in a cgroup: ${backend.cgroupPlacementReason ?? 'this backend cannot'}`,
      );
  }
  const exec = execAttrs(options, 'spawn options');
  const env = options.env ?? process.env;
  // Without options.env the native child takes our environ as it is: copying
  // process.env through JavaScript cost more than the spawn itself.
  const envp = options.env === undefined ? null : envList(options.env);
  // With a path, the native spawn's execve reports ENOENT and EACCES itself,
  // synchronously; the js backend learns them only after the fact.
  // An absolute path goes to execve as given, as child_process passes it.
  const file =
    command.includes('/') && backend.name === 'native'
      ? command.startsWith('/')
        ? command
        : path.resolve(options.cwd ?? '', command)
      : resolveExecutable(command, env, options.cwd);
  const opened: number[] = [];
  try {
    const stdio = stdioTargets(options.stdio, opened);
    let child: ReturnType<typeof backend.spawn>;
    try {
      child = backend.spawn({
        file,
        argv: [options.argv0 ?? command, ...args],
        env: envp,
        cwd: options.cwd,
        stdio,
        newSession: options.detached === true,
        newGroup: (options.processGroup ?? options.newGroup) === true,
        cgroup: options.cgroup ?? null,
        exec,
      });
    } catch (err) {
      throw options.cgroup ? placementError(options.cgroup, err) : err;
    }
    return new ProcessHandle(child.ref, {
      identity: null,
      stdin: child.stdin,
      stdout: child.stdout,
      stderr: child.stderr,
    });
  } finally {
    for (const fd of opened) closeSync(fd);
  }
}
