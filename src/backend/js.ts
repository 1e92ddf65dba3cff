/**
 * The pure-JS backend: child_process for children, process.kill for
 * signals, fs reads of /proc for identities. It is the fallback where the
 * addon cannot load and the baseline every benchmark compares against.
 *
 * What it cannot promise: between the start-time check and process.kill a
 * pid can be reused (a window of microseconds), and inspect() re-reads the
 * start time to detect, not prevent, a mixed identity. capabilities() says so.
 */
import { spawn as cpSpawn, type ChildProcess } from 'node:child_process';
import {
  accessSync,
  closeSync,
  constants as fsc,
  openSync,
  readFileSync,
  readlinkSync,
  statSync,
  readdirSync,
} from 'node:fs';
import { basename, join, resolve as resolvePath } from 'node:path';
import { encodeArg, hasEscapedBytes, splitCmdlineBytes } from '../bytes.js';
import { type ErrnoCode, errnoError, isErrnoCode, NotAProcessError, UnsupportedError } from '../errors.js';
import { parseLayout, parseStat, parseStatusField, parseStatusUid, type StatFields } from '../process/proc.js';
import { assertOwnProc, ownPidNs, ProcReads, readProcBytes, readProcText } from './procview.js';
import { UNKNOWN_EXIT } from '../process/signals.js';
import type { Capabilities, ExitStatus } from '../types.js';
import type { Backend, NotifyListener, PidRef, ProcEntry, RawIdentity, SpawnedChild, SpawnRequest } from './types.js';

const esrch = (pid: number, syscall: string) => errnoError('ESRCH', syscall, undefined, `pid ${pid}`);

/** A read that failed because the process is gone, as opposed to one the kernel could not answer (EMFILE, ENOMEM...). */
const vanished = (err: unknown) => {
  const code = (err as NodeJS.ErrnoException).code;
  return code === 'ENOENT' || code === 'ESRCH';
};

/** A read of pid's /proc; ENOENT/ESRCH of a vanished process become ESRCH, every other error stays what it is. */
function ofProcess<T>(pid: number, read: () => T): T {
  try {
    return read();
  } catch (err) {
    if (vanished(err)) throw esrch(pid, 'read');
    throw err;
  }
}

const readProc = (path: string, pid: number): Buffer => ofProcess(pid, () => readProcBytes(path));
const readProcString = (path: string, pid: number): string => ofProcess(pid, () => readProcText(path));

function readStat(path: string, pid: number): StatFields {
  const stat = parseStat(readProcString(path, pid));
  if (!stat) throw errnoError('EPROTO', 'read', path, 'unparseable');
  return stat;
}

const isDead = (state: string) => state === 'Z' || state === 'X';

/**
 * A zombie leader whose other threads still run (its main thread called
 * pthread_exit) is a live process whose own cmdline and exe read empty:
 * the /proc dir of a live thread of it, with that thread's state, or null.
 */
function liveThread(dir: string, pid: number): { dir: string; state: string } | null {
  let tids: string[];
  try {
    tids = readdirSync(`${dir}/task`);
  } catch (err) {
    if (vanished(err)) return null;
    throw err;
  }
  for (const tid of tids) {
    if (tid === String(pid)) continue;
    try {
      const st = parseStat(readProcText(`${dir}/task/${tid}/stat`));
      if (st && !isDead(st.state)) return { dir: `${dir}/task/${tid}`, state: st.state };
    } catch (err) {
      if (!vanished(err)) throw err;
    }
  }
  return null;
}

/**
 * The pid namespace a process lives in: the inode of its ns/pid link. The
 * link takes ptrace read access (EACCES/EPERM for another uid's process or
 * one that is not dumpable); there, status's NSpid lists one pid per
 * namespace from that of the /proc read (ours: assertOwnProc) down to the
 * process's own, so a single one means ours. null where it cannot be told.
 */
function readPidNs(dir: string, status: string): number | null {
  try {
    // The link's text is the inode ("pid:[4026531836]"): cheaper than a stat through it.
    const ino = Number(/^pid:\[(\d+)\]$/.exec(readlinkSync(`${dir}/ns/pid`))?.[1]);
    return Number.isSafeInteger(ino) && ino > 0 ? ino : null;
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code !== 'EACCES' && code !== 'EPERM' && code !== 'ENOENT') throw err;
  }
  const line = /^NSpid:(.*)$/m.exec(status);
  return line?.[1]?.trim().split(/\s+/).length === 1 ? ownPidNs() : null;
}

/** The executable's dev/ino; null for a kernel thread (ENOENT) or one we may not look at (EACCES, EPERM). */
function readExe(dir: string): RawIdentity['exe'] {
  try {
    const st = statSync(`${dir}/exe`);
    return { dev: st.dev, ino: st.ino };
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'ENOENT' || code === 'EACCES' || code === 'EPERM') return null;
    throw err;
  }
}

/** The start ticks of a live process; null when there is none or it has exited (a zombie with no live thread). */
function readStartTicks(pid: number, procRoot: string): number | null {
  try {
    const st = parseStat(readProcText(`${procRoot}/${pid}/stat`));
    if (!st) return null;
    if (isDead(st.state) && liveThread(`${procRoot}/${pid}`, pid) === null) return null;
    return st.startTicks;
  } catch (err) {
    // Gone is an answer; EMFILE or ENOMEM is not: taken for one, a live process would count as exited.
    if (vanished(err)) return null;
    throw err;
  }
}

/** How often a read is repeated while an exec keeps moving under it (as native/identity.cc does). */
const EXEC_RETRIES = 8;

/** What the exit poller watches: a process pinned by (pid, start ticks), told once it is gone. */
export interface PolledExit {
  readonly pid: number;
  readonly startTicks: number;
  markExited(status: ExitStatus): void;
}

/**
 * One shared timer polls every watched non-child: no per-process timers. A
 * pass over the watched pids may span ticks: each tick reads for at most
 * `budgetMs` and the next one resumes where it stopped, so a supervisor
 * holding thousands of adopted instances keeps its event loop. Reading all
 * of 5 000 every 50 ms took ~150 ms per tick: three quarters of the thread,
 * for ever, and a third of what recovery spent. Now a pass over N takes
 * about N × 15 µs (one stat read) / budgetMs ticks, and an exit is seen
 * within one pass (within one tick up to a few hundred watched). A pid
 * custody has just signalled is read at every tick, ahead of the pass and
 * whatever the budget, until it is seen gone: a stop waits for that exit,
 * and must not wait out a pass (or escalate to KILL meanwhile).
 * @internal exported for its tests
 */
export class ExitPoller {
  readonly #intervalMs: number;
  readonly #budgetMs: number;
  #watched = new Map<number, Set<PolledExit>>();
  /** The pass under way: the pids it still has to read from #next on (one added since waits for the next pass). */
  #pass: number[] = [];
  #next = 0;
  /** Watched pids a signal was sent to (see expedite). */
  #signalled = new Set<number>();
  #timer: NodeJS.Timeout | undefined;
  #refs = 0;

  constructor({ intervalMs = 50, budgetMs = 5 } = {}) {
    this.#intervalMs = intervalMs;
    this.#budgetMs = budgetMs;
  }

  add(ref: PolledExit): void {
    let set = this.#watched.get(ref.pid);
    if (!set) {
      set = new Set();
      this.#watched.set(ref.pid, set);
    }
    set.add(ref);
    if (!this.#timer) {
      this.#timer = setInterval(() => this.tick(), this.#intervalMs);
      if (this.#refs === 0) this.#timer.unref();
    }
  }

  delete(ref: PolledExit): void {
    const set = this.#watched.get(ref.pid);
    if (!set) return;
    set.delete(ref);
    if (set.size === 0) {
      this.#watched.delete(ref.pid);
      this.#signalled.delete(ref.pid);
    }
    if (this.#watched.size === 0 && this.#timer) {
      clearInterval(this.#timer);
      this.#timer = undefined;
      this.#pass = [];
      this.#next = 0;
    }
  }

  /** pid was just signalled: read it at every tick until it is gone or no longer watched. */
  expedite(pid: number): void {
    if (this.#watched.has(pid)) this.#signalled.add(pid);
  }

  adjustRefs(delta: number): void {
    this.#refs += delta;
    if (!this.#timer) return;
    if (this.#refs > 0) this.#timer.ref();
    else this.#timer.unref();
  }

  /**
   * Reads every signalled pid, then the next pids of the pass until the
   * budget is spent (at least one, whatever the clock says), and tells the
   * ones gone or reused. A tick begins a pass only when the last one is done
   * and never runs past its end, so it reads no pid twice. Returns how many
   * pids it read.
   */
  tick(): number {
    const stop = performance.now() + this.#budgetMs;
    let read = 0;
    for (const pid of [...this.#signalled]) {
      const set = this.#watched.get(pid);
      if (set) {
        read++;
        this.#check(pid, set);
      }
    }
    if (this.#next >= this.#pass.length) {
      this.#pass = [...this.#watched.keys()];
      this.#next = 0;
    }
    let inPass = 0;
    // delete() ends the pass (#pass emptied) when the last watch goes, even from a markExited below.
    while (this.#next < this.#pass.length && (inPass === 0 || performance.now() < stop)) {
      const pid = this.#pass[this.#next++] as number;
      const set = this.#watched.get(pid);
      // Unwatched since the pass began, or read above.
      if (!set || this.#signalled.has(pid)) continue;
      inPass++;
      this.#check(pid, set);
    }
    return read + inPass;
  }

  /** One read of pid for every pin on it. */
  #check(pid: number, set: Set<PolledExit>): void {
    let ticks: number | null;
    try {
      ticks = readStartTicks(pid, '/proc');
    } catch {
      // Unreadable now (EMFILE): it is read again at the next tick.
      return;
    }
    for (const ref of [...set]) {
      if (ticks !== ref.startTicks) ref.markExited(UNKNOWN_EXIT);
    }
  }
}

const poller = new ExitPoller();

/** A non-child, pinned by (pid, start ticks). */
class JsPidRef implements PidRef, PolledExit {
  readonly pid: number;
  readonly startTicks: number;
  #exited: Promise<ExitStatus> | undefined;
  #resolve: ((s: ExitStatus) => void) | undefined;
  #status: ExitStatus | undefined;
  #refed = true;
  #polling = false;
  /** A signal other than 0 was sent through this pin. */
  #signalled = false;
  #countsRef = false;
  #gone: Promise<void> | undefined;

  constructor(pid: number, startTicks: number) {
    this.pid = pid;
    this.startTicks = startTicks;
  }

  get exited(): Promise<ExitStatus> {
    if (!this.#exited) {
      const status = this.#status;
      this.#exited = status
        ? Promise.resolve(status)
        : new Promise((resolve) => {
            this.#resolve = resolve;
          });
      if (!status) {
        poller.add(this);
        if (this.#signalled) poller.expedite(this.pid);
        this.#polling = true;
        this.#syncRef();
      }
    }
    return this.#exited;
  }

  get exitStatus(): ExitStatus | undefined {
    return this.#status;
  }

  get gone(): Promise<void> {
    this.#gone ??= this.exited.then(() => undefined);
    return this.#gone;
  }

  get hasExited(): boolean {
    return this.#status !== undefined;
  }

  signal(signo: number): boolean {
    if (this.#status) return false;
    // The window this backend cannot close: the pid could be reused between
    // this check and the kill.
    if (readStartTicks(this.pid, '/proc') !== this.startTicks) {
      this.markExited(UNKNOWN_EXIT);
      return false;
    }
    try {
      process.kill(this.pid, signo);
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code === 'ESRCH') return false;
      throw err;
    }
    // Its exit is now expected: the poller reads it at every tick (see ExitPoller).
    if (signo !== 0) {
      this.#signalled = true;
      if (this.#polling) poller.expedite(this.pid);
    }
    return true;
  }

  markExited(status: ExitStatus): void {
    if (this.#status) return;
    this.#status = status;
    this.#stopPolling();
    this.#resolve?.(status);
  }

  ref(): void {
    this.#refed = true;
    this.#syncRef();
  }

  unref(): void {
    this.#refed = false;
    this.#syncRef();
  }

  close(): void {
    this.#stopPolling();
  }

  #stopPolling(): void {
    if (!this.#polling) return;
    poller.delete(this);
    this.#polling = false;
    this.#syncRef();
  }

  /** The shared timer holds the loop open while any polling reference is ref'd. */
  #syncRef(): void {
    const want = this.#polling && this.#refed;
    if (want !== this.#countsRef) {
      poller.adjustRefs(want ? 1 : -1);
      this.#countsRef = want;
    }
  }
}

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
const PLACE_SHELL = '/bin/sh';
const PLACE_SCRIPT =
  // biome-ignore lint/suspicious/noTemplateCurlyInString: a shell parameter expansion, not a JS template
  'echo 0 >"$0" || exit 126; case $1 in set:*) PWD=${1#set:}; export PWD;; *) unset PWD;; esac; shift; exec "$@"';

function shellUsable(): boolean {
  try {
    accessSync(PLACE_SHELL, fsc.X_OK);
    return true;
  } catch {
    return false;
  }
}

export class JsBackend extends ProcReads implements Backend {
  readonly name = 'js' as const;
  readonly cgroupPlacement: 'exec-wrapper' | null;
  readonly cgroupPlacementReason?: string;
  #caps: Capabilities;
  #bootId: string | undefined;
  /** The inheritable fds this process was started with, read at the first spawn (see inheritableFds). */
  #inherited: number[] | undefined;

  constructor(caps: Capabilities) {
    super();
    this.#caps = caps;
    this.cgroupPlacement = shellUsable() ? 'exec-wrapper' : null;
    if (!this.cgroupPlacement)
      this.cgroupPlacementReason = `the js backend places children through ${PLACE_SHELL}, which is not executable here`;
  }

  capabilities(): Capabilities {
    return this.#caps;
  }

  inspect(pid: number, procRoot = '/proc'): RawIdentity {
    assertOwnProc(procRoot);
    const dir = `${procRoot}/${pid}`;
    // Exec is a seam: cmdline and exe change together in the kernel, but a
    // reader can land between them. stat, cmdline, exe, status, cmdline
    // again, stat again; repeat while the cmdline or comm moved. Paths,
    // unlike the addon's dir fd, can cross a pid reuse: the start ticks of
    // both stats must agree (detection, not prevention: capabilities() says so).
    for (let attempt = 0; attempt < EXEC_RETRIES; attempt++) {
      const stat = readStat(`${dir}/stat`, pid);
      let state = stat.state;
      let src = dir;
      if (isDead(stat.state)) {
        const t = liveThread(dir, pid);
        if (t) [src, state] = [t.dir, t.state];
      }
      const cmdline = readProc(`${src}/cmdline`, pid);
      const exe = readExe(src);
      const status = readProcString(`${dir}/status`, pid);
      const tgid = parseStatusField(status, 'Tgid');
      if (tgid !== pid) throw new NotAProcessError(pid, tgid);
      const processPidNs = readPidNs(src, status);
      const again = readProc(`${src}/cmdline`, pid);
      const stat2 = readStat(`${dir}/stat`, pid);
      if (stat2.startTicks !== stat.startTicks) throw esrch(pid, 'read');
      if (!again.equals(cmdline) || stat2.comm !== stat.comm || isDead(stat2.state) !== isDead(stat.state)) continue;
      return {
        state,
        ppid: stat.ppid,
        session: stat.session,
        startTicks: stat.startTicks,
        argv: splitCmdlineBytes(cmdline),
        uid: parseStatusUid(status),
        exe,
        pidfsId: null,
        processPidNs,
      };
    }
    throw errnoError('EAGAIN', 'read', undefined, `pid ${pid} kept exec'ing during ${EXEC_RETRIES} reads`);
  }

  spawnedHere(): boolean {
    // child_process owns (and reaps) every child this backend spawns.
    return true;
  }

  reapZombie(): boolean {
    return false;
  }

  pidfsIdOf(): null {
    return null;
  }

  childSubreaper(): null {
    return null;
  }

  setChildSubreaper(): boolean {
    return false;
  }

  inspectPinned(pid: number): { raw: RawIdentity; ref: PidRef } {
    const raw = this.inspect(pid);
    return { raw, ref: new JsPidRef(pid, raw.startTicks) };
  }

  probeCloneIntoCgroup(): null {
    return null;
  }

  bootId(): string {
    this.#bootId ??= readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
    return this.#bootId;
  }

  async matchArgv(argv: readonly string[], procRoot = '/proc'): Promise<number[]> {
    assertOwnProc(procRoot);
    const want = Buffer.concat(argv.flatMap((a) => [encodeArg(a), Buffer.of(0)]));
    const out: number[] = [];
    for (const name of readdirSync(procRoot)) {
      if (name.charCodeAt(0) < 49 || name.charCodeAt(0) > 57) continue;
      try {
        let raw = readProcBytes(`${procRoot}/${name}/cmdline`);
        if (raw.length === 0) {
          const st = parseStat(readProcText(`${procRoot}/${name}/stat`));
          const t = st && isDead(st.state) ? liveThread(`${procRoot}/${name}`, st.pid) : null;
          if (t) raw = readProcBytes(`${t.dir}/cmdline`);
        }
        if (raw.length && raw[raw.length - 1] !== 0) raw = Buffer.concat([raw, Buffer.of(0)]);
        if (raw.equals(want)) out.push(Number(name));
      } catch (err) {
        if (!vanished(err)) throw err;
      }
    }
    return out;
  }

  async listProcesses(procRoot = '/proc', images?: readonly string[]): Promise<ProcEntry[]> {
    assertOwnProc(procRoot);
    const wanted = images ? new Set(images) : null;
    const out: ProcEntry[] = [];
    for (const name of readdirSync(procRoot)) {
      if (name.charCodeAt(0) < 49 || name.charCodeAt(0) > 57) continue;
      const dir = `${procRoot}/${name}`;
      // A process that vanished mid-scan is skipped; any other failure
      // (EMFILE, ENOMEM) is thrown: skipping would report a live process as absent.
      try {
        const text = readProcText(`${dir}/stat`);
        const stat = parseStat(text);
        if (!stat) continue;
        const layout = wanted ? parseLayout(text) : null;
        let state = stat.state;
        let src = dir;
        if (isDead(state)) {
          const t = liveThread(dir, stat.pid);
          if (t) [src, state] = [t.dir, t.state];
        }
        const argv = splitCmdlineBytes(readProcBytes(`${src}/cmdline`));
        // The directory's owner, as the native scan reads it: a hint only.
        const uid = statSync(dir).uid;
        const row: ProcEntry = {
          pid: stat.pid,
          ppid: stat.ppid,
          pgrp: stat.pgrp,
          session: stat.session,
          uid,
          state,
          startTicks: stat.startTicks,
          argv,
        };
        if (layout?.image && wanted?.has(layout.image)) row.image = layout.image;
        if (layout?.kernelThread) row.kernelThread = true;
        out.push(row);
      } catch (err) {
        if (!vanished(err)) throw err;
      }
    }
    return out;
  }

  openNotify(): NotifyListener {
    // Node has no unix datagram sockets, nor a way to receive SCM_CREDENTIALS.
    throw new UnsupportedError(
      "ready: 'notify' needs the native backend: receiving sd_notify datagrams with their senders' credentials " +
        `takes a unix datagram socket with SO_PASSCRED, which Node cannot open (${this.#caps.reason ?? 'js backend'})`,
    );
  }

  tryLock(): 'unsupported' {
    return 'unsupported';
  }

  spawn(req: SpawnRequest): SpawnedChild {
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
    const [file, args, argv0] = req.cgroup ? placed(req, req.cgroup, env) : [req.file, req.argv.slice(1), req.argv[0]];
    const stdio: Array<'ignore' | 'inherit' | 'pipe' | number> = req.stdio.map((t) =>
      typeof t === 'object' ? t.fd : t,
    );
    // child_process passes on every fd of ours without close-on-exec and
    // cannot close one in the child; it can put another file in its place.
    // /dev/null there means a lock or a pipe of our caller's is never held
    // by the program (the native spawn closes them: close_range). An fd of
    // the list closed and reused since is close-on-exec (Node opens nothing
    // else), so the worst /dev/null does there is take its number.
    this.#inherited ??= inheritableFds();
    const inheritable = coverable(this.#inherited);
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
function inheritableFds(): number[] {
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
 * The wrapper's command line. The shell execs "$@" as execvp does, so the
 * target's argv[0] must be what finds req.file: the path itself, or its
 * basename on PATH. Anything else (an argv0 of its own) would exec another
 * argv than asked: refused.
 */
function placed(req: SpawnRequest, cgroup: string, env: NodeJS.ProcessEnv): [string, string[], string] {
  const argv0 = req.argv[0] ?? '';
  const finds = argv0.includes('/')
    ? resolvePath(req.cwd ?? process.cwd(), argv0) === req.file
    : basename(req.file) === argv0;
  if (!finds) {
    throw new UnsupportedError(
      `the js backend cannot place ${req.file} in a cgroup under argv[0] ${JSON.stringify(argv0)}: its exec wrapper runs argv[0] as given; use the native backend`,
    );
  }
  const procs = join(cgroup, 'cgroup.procs');
  // A cgroup that is not there (or not ours to write) fails here, at once,
  // as on the native backend, not as the wrapper's exit status later.
  closeSync(openSync(procs, fsc.O_WRONLY));
  const pwd = env.PWD === undefined ? 'unset' : `set:${env.PWD}`;
  return [PLACE_SHELL, ['-c', PLACE_SCRIPT, procs, pwd, ...req.argv], 'sh'];
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
