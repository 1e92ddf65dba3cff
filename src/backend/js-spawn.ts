/**
 * The js backend's spawn path: child_process, and what it takes to make it
 * keep the native spawn's promises where it can (no stray inherited fd, a
 * cgroup entered before exec, a spawn failure thrown synchronously) and
 * refuse where it cannot. Apart from the backend because all of it is about
 * child_process's own behaviour, not about reading processes.
 */
import { spawn as cpSpawn, type ChildProcess } from 'node:child_process';
import { accessSync, closeSync, constants as fsc, openSync, readdirSync, statSync } from 'node:fs';
import { basename, join, resolve as resolvePath } from 'node:path';
import { hasEscapedBytes } from '../bytes.js';
import { type ErrnoCode, errnoError, isErrnoCode, UnsupportedError } from '../errors.js';
import type { ExitStatus } from '../types.js';
import { checkJsExec, execSteps, needsWrapper } from './js-exec.js';
import { readProcText } from './procview.js';
import type { PidRef, SpawnedChild, SpawnRequest } from './types.js';

/** A child of child_process: libuv reaps it; we only read what it reports. */
class ChildPidRef implements PidRef {
  readonly pid: number;
  readonly exited: Promise<ExitStatus>;
  #child: ChildProcess;
  #status: ExitStatus | undefined;

  /** `pid`: the child's, which child_process sets once the spawn succeeded. */
  constructor(child: ChildProcess, pid: number) {
    this.#child = child;
    this.pid = pid;
    this.exited = new Promise((resolve) => {
      // 'exit' comes once: `on` spares the wrapper `once` would keep (~160 B).
      child.on('exit', (code, signal) => {
        this.#status = { code, signal };
        resolve(this.#status);
      });
    });
  }

  get exitStatus(): ExitStatus | undefined {
    return this.#status;
  }

  get gone(): Promise<void> {
    return this.exited.then(() => undefined);
  }

  get hasExited(): boolean {
    return this.#status !== undefined;
  }

  signal(signo: number): boolean {
    if (this.#status) return false;
    // Until libuv has reaped it the pid cannot be reused, so this is safe;
    // after, kill() returns false without signalling.
    if (signo === 0) {
      try {
        process.kill(this.pid, 0);
        return true;
      } catch {
        return false;
      }
    }
    return this.#child.kill(signo);
  }

  ref(): void {
    this.#child.ref();
  }

  unref(): void {
    this.#child.unref();
  }

  close(): void {
    this.unref();
  }
}

/**
 * The js backend's placement: child_process cannot run code between fork
 * and exec, so the child is a shell that writes itself ("0") into the
 * cgroup's cgroup.procs ($0) and only then execs the target ("$@"): nothing
 * of the target runs, or forks, outside. Writing the pid after spawn()
 * returns would let a fast double-fork escape. $1 restores PWD as given (or
 * its absence): dash exports one of its own otherwise.
 */
export const PLACE_SHELL = '/bin/sh';
const PLACE_STEP = 'echo 0 >"$0" || exit 126; ';
const EXEC_SCRIPT =
  // biome-ignore lint/suspicious/noTemplateCurlyInString: a shell parameter expansion, not a JS template
  'case $1 in set:*) PWD=${1#set:}; export PWD;; *) unset PWD;; esac; shift; exec "$@"';

export function shellUsable(): boolean {
  try {
    accessSync(PLACE_SHELL, fsc.X_OK);
    return true;
  } catch {
    return false;
  }
}

/**
 * Spawns req through child_process. `inherited`: the inheritable fds this
 * process was started with (see inheritableFds), asked for only once the
 * request has passed its checks.
 */
export function spawnChild(req: SpawnRequest, inherited: () => number[]): SpawnedChild {
  // child_process encodes every argument as UTF-8: an escaped byte would
  // reach the program as U+FFFD. Refuse rather than exec something else.
  if (
    req.argv.some(hasEscapedBytes) ||
    (req.file !== undefined && hasEscapedBytes(req.file)) ||
    (req.cwd !== undefined && hasEscapedBytes(req.cwd)) ||
    req.env?.some(hasEscapedBytes)
  ) {
    throw new UnsupportedError(
      'the js backend cannot pass an argv, path or environment that is not UTF-8 (child_process encodes it); use the native backend',
    );
  }
  const env =
    req.env === null
      ? process.env
      : Object.fromEntries(
          req.env.map((kv) => {
            const eq = kv.indexOf('=');
            return [kv.slice(0, eq), kv.slice(eq + 1)];
          }),
        );
  if (req.exec) checkJsExec(req.exec, !!req.cgroup);
  const [file, args, argv0] =
    req.cgroup || needsWrapper(req.exec)
      ? placed(req, req.cgroup ?? null, env)
      : [req.file, req.argv.slice(1), req.argv[0]];
  const stdio: Array<'ignore' | 'inherit' | 'pipe' | number> = req.stdio.map((t) => (typeof t === 'object' ? t.fd : t));
  // child_process passes on every fd of ours without close-on-exec and
  // cannot close one in the child; it can put another file in its place.
  // /dev/null there means a lock or a pipe of our caller's is never held
  // by the program (the native spawn closes them: close_range). An fd of
  // the list closed and reused since is close-on-exec (Node opens nothing
  // else), so the worst /dev/null does there is take its number.
  const inheritable = coverable(inherited());
  const devNull = inheritable.length > 0 ? openSync('/dev/null', 'r') : -1;
  for (const fd of inheritable) {
    while (stdio.length < fd) stdio.push('ignore');
    stdio[fd] = devNull;
  }
  let child: ChildProcess;
  try {
    child = cpSpawn(file, args, {
      argv0,
      cwd: req.cwd,
      env,
      stdio,
      // child_process cannot setpgid alone: a new group comes with a new session here.
      detached: req.newSession || req.newGroup,
      // libuv: setgroups(0), setgid, setuid, before the wrapper (or the program) is exec'd.
      ...(req.exec?.runAs ? { uid: req.exec.runAs.uid, gid: req.exec.runAs.gid } : {}),
    });
  } finally {
    // The child has exec'd (or failed) when cpSpawn returns: it holds its own copy.
    if (devNull !== -1) closeSync(devNull);
  }
  if (child.pid === undefined) {
    // child_process reports exec failure asynchronously; surface it as the
    // native backend does, synchronously, by waiting for nothing: the
    // 'error' event carries the errno, and pid is undefined.
    throw spawnFailure(child, req.file);
  }
  trimChild(child);
  return { ref: new ChildPidRef(child, child.pid), stdin: child.stdin, stdout: child.stdout, stderr: child.stderr };
}

const NO_ARGS: readonly string[] = Object.freeze([]);

/**
 * What a spawned child keeps that nobody reads again. The handle holds the
 * ChildProcess as long as the child runs, and it is the handle's alone.
 * child_process reads `spawnfile` and `spawnargs` only to describe a spawn
 * that failed, which this one did not (~280 B: the argv array keeps room for
 * 22). `stdio` has an entry per stdio index, null beyond 2 here (250 nulls
 * for an inherited fd 251 would be 2 KiB), and child_process reads it again
 * only at the exit, to resume every pipe nobody reads: what the program
 * wrote before it exited would be thrown away before a reader came, where
 * the native backend keeps it for one. The handle has the streams; child_process
 * keeps its own references. (A spawn that failed with EMFILE has no `stdio`
 * at all: hence only after the pid check.)
 */
function trimChild(child: ChildProcess): void {
  const fields = child as unknown as { spawnfile: string; spawnargs: readonly string[]; stdio: readonly unknown[] };
  fields.spawnfile = '';
  fields.spawnargs = NO_ARGS;
  fields.stdio = NO_ARGS;
}

// O_CLOEXEC as /proc/<pid>/fdinfo's "flags:" shows it (octal): the value of
// asm-generic, so x86_64 and arm64 alike.
const FDINFO_CLOEXEC = 0o2000000;

/**
 * This process's fds above stdio that a child would inherit: those without
 * close-on-exec. Node marks the fds it was started with close-on-exec only up
 * to the first gap past fd 15, so a wrapper's `exec 200>lock` stays
 * inheritable. Read once: one fdinfo read per open fd costs more than the
 * rest of a spawn at a few dozen fds, and what a process inherits is there
 * from its start. An fd that native code opens later without O_CLOEXEC is
 * not in it, and reaches the program as it would through child_process, as
 * does every fd where there is no /proc to read them from.
 */
export function inheritableFds(): number[] {
  let names: string[];
  try {
    names = readdirSync('/proc/self/fd');
  } catch (err) {
    // No /proc of ours (none mounted, one of a pid namespace we are not in,
    // another platform): nothing to learn, so spawn as child_process does.
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') return [];
    throw err;
  }
  const out: number[] = [];
  for (const name of names) {
    const fd = Number(name);
    if (fd < 3) continue;
    let info: string;
    try {
      info = readProcText(`/proc/self/fdinfo/${name}`);
    } catch (err) {
      // Closed since the listing, the listing's own fd among them.
      if ((err as NodeJS.ErrnoException).code === 'ENOENT') continue;
      throw err;
    }
    const flags = /^flags:\s*([0-7]+)$/m.exec(info)?.[1];
    if (flags !== undefined && (Number.parseInt(flags, 8) & FDINFO_CLOEXEC) === 0) out.push(fd);
  }
  return out;
}

/**
 * The fds of `fds` that child_process can put /dev/null at. It moves its
 * sources above the last stdio index first (F_DUPFD), which fails EINVAL at
 * the soft RLIMIT_NOFILE, so the highest index must stay two below it; an fd
 * there (inherited before the limit was lowered) reaches the program as it
 * did before. The limit is read at each spawn, only when there is an fd to
 * cover: another process may change it (prlimit).
 */
function coverable(fds: number[]): number[] {
  if (fds.length === 0) return fds;
  const limit = /^Max open files\s+(\d+)/m.exec(readProcText('/proc/self/limits'))?.[1];
  if (limit === undefined) return fds; // "unlimited"
  return fds.filter((fd) => fd < Number(limit) - 1);
}

/**
 * The wrapper's command line: it enters the cgroup, if any, applies the
 * exec attributes it can (js-exec.ts) and execs the target. The shell execs
 * "$@" as execvp does, so the target's argv[0] must be what finds req.file:
 * the path itself, or its basename on PATH. Anything else (an argv0 of its
 * own) would exec another argv than asked: refused.
 */
function placed(req: SpawnRequest, cgroup: string | null, env: NodeJS.ProcessEnv): [string, string[], string] {
  const argv0 = req.argv[0] ?? '';
  const finds = argv0.includes('/')
    ? resolvePath(req.cwd ?? process.cwd(), argv0) === req.file
    : basename(req.file) === argv0;
  if (!finds) {
    throw new UnsupportedError(
      `the js backend cannot run ${req.file} through its exec wrapper (a cgroup, rlimits, oomScoreAdj or umask) under argv[0] ${JSON.stringify(argv0)}: the wrapper runs argv[0] as given; use the native backend`,
    );
  }
  const pwd = env.PWD === undefined ? 'unset' : `set:${env.PWD}`;
  const steps = execSteps(req.exec);
  if (cgroup === null) return [PLACE_SHELL, ['-c', steps + EXEC_SCRIPT, 'sh', pwd, ...req.argv], 'sh'];
  const procs = join(cgroup, 'cgroup.procs');
  // A cgroup that is not there (or not ours to write) fails here, at once,
  // as on the native backend, not as the wrapper's exit status later.
  closeSync(openSync(procs, fsc.O_WRONLY));
  return [PLACE_SHELL, ['-c', PLACE_STEP + steps + EXEC_SCRIPT, procs, pwd, ...req.argv], 'sh'];
}

function spawnFailure(child: ChildProcess, file: string): Error {
  // Node sets `pid` undefined and emits 'error' on the next tick; the errno is
  // in the spawn result's internal error, which we re-derive from the file.
  child.on('error', () => {});
  // child_process returns before it sets up stdio only when it ran out of
  // fds (EMFILE, ENFILE): the program may well exist. Which of the two, an
  // open of our own says; EMFILE where that works again.
  if (child.stdio === undefined) {
    let code: ErrnoCode = 'EMFILE';
    try {
      closeSync(openSync('/dev/null', 'r'));
    } catch (err) {
      const c = (err as NodeJS.ErrnoException).code;
      if (c === 'ENFILE') code = c;
    }
    return errnoError(code, 'spawn', file);
  }
  let code: ErrnoCode = 'ENOENT';
  try {
    const st = statSync(file);
    if (!st.isFile() || (st.mode & 0o111) === 0) code = 'EACCES';
  } catch (err) {
    const c = (err as NodeJS.ErrnoException).code;
    if (isErrnoCode(c)) code = c;
  }
  return errnoError(code, 'spawn', file);
}
