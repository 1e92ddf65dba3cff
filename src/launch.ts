/**
 * One launch attempt: spawn, find the pid, confirm exec into the expected
 * argv, wait until ready; and abandon, which undoes a failed attempt.
 *
 * The rule from the field: identity is recorded only from the inspection
 * that confirmed exec (the pid a launcher reports may still be the
 * launcher's fork), and a failed attempt is killed, reaped and its declared
 * paths removed before anything else happens.
 */
import { closeSync, openSync, readFileSync, readSync, fstatSync, unlinkSync } from 'node:fs';
import { connect } from 'node:net';
import type { Readable } from 'node:stream';
import { backend } from './backend/index.js';
import type { PidRef } from './backend/types.js';
import { AbortError, ConfirmTimeoutError, LaunchExitedError, ReadyTimeoutError } from './errors.js';
import type { Emit } from './events.js';
import { ProcessHandle, spawn, type StdioOption } from './handle.js';
import { toIdentity } from './identity.js';
import { terminate } from './terminate.js';
import { sleep, TIMED_OUT, within } from './timing.js';
import type { ExitStatus, ProcessIdentity } from './types.js';

export interface Instance {
  id: string;
  pid: number;
  /** The 128-bit launch token (hex) the process's argv carries. */
  token: string;
  /** Recorded from the inspection that confirmed exec. */
  identity: ProcessIdentity;
  /** Settles once the process has exited; code and signal are null where the kernel cannot say. */
  exited: Promise<ExitStatus>;
}

export type ReadySpec = { socket: string; timeoutMs?: number } | ((instance: Instance) => Promise<void>);
export type PidSpec = 'child' | { file: string } | (() => Promise<number>);

export interface LaunchSpec {
  id: string;
  command: string;
  /** The argv after the command; a function receives the launch token, which the argv must carry. */
  args: string[] | ((token: string) => string[]);
  /** argv elements the confirmed process must carry besides the token. */
  expect?: string[];
  /**
   * The program the confirmed process must be running, compared by device
   * and inode with /proc/<pid>/exe. Give it when a launcher's own argv
   * carries the target's arguments (its fork, before exec, would match them).
   */
  executable?: string;
  ready?: ReadySpec;
  /** Where the pid comes from: the child (default), a pidfile the program writes, or a function. */
  pid?: PidSpec;
  /** Paths removed on abandon and stop (sockets, pidfiles). */
  paths?: string[];
  /** How long the pid may take to exec into the expected argv. Default 3000. */
  confirmTimeoutMs?: number;
  /** Tries in all, each abandoned cleanly before the next. Default 1. */
  attempts?: number;
  env?: Record<string, string | undefined>;
  cwd?: string;
  stdout?: StdioOption;
  /** 'pipe' keeps a tail for error messages; `{ file }` appends (its tail is read on failure). Default 'ignore'. */
  stderr?: StdioOption;
  /** A new session for the process (default true): it must outlive the agent and its terminal. */
  detached?: boolean;
  /** Without a new session, still a new process group (setpgid), so the group can be told apart. */
  processGroup?: boolean;
  /** How long abandon waits after SIGTERM before SIGKILL. Default 2000. */
  abandonGraceMs?: number;
  /** Readiness bound for a ready function. Default 10000. */
  readyTimeoutMs?: number;
  /** Cancels the launch: the attempt is abandoned and the launch rejects with an AbortError. */
  signal?: AbortSignal;
}

const STDERR_TAIL_BYTES = 2048;

/** A short kernel wait for a child's argv to appear after exec: at most 40 x 50 us. */
const spinCell = new Int32Array(new SharedArrayBuffer(4));
const MAX_ARGV_SPINS = 40;
const ARGV_SPIN_MS = 0.05;

/** Whether an argv carries the token (inside any element) and every expected element exactly. */
export function carries(argv: readonly string[], token: string, expect: readonly string[]): boolean {
  return argv.some((a) => a.includes(token)) && expect.every((e) => argv.includes(e));
}

/** The live processes whose argv carries the token: provably launched by us (each still to be re-checked under a pidfd). */
export async function tokenCarriers(token: string): Promise<number[]> {
  const me = process.pid;
  return (await backend.listProcesses()).filter((p) => p.pid !== me && p.pid !== 1 && p.argv.some((a) => a.includes(token))).map((p) => p.pid);
}

export interface Attempt {
  id: string;
  token: string;
  argv: string[];
  expect: string[];
  /** dev/ino the confirmed exe must have, when the spec names an executable. */
  executable: { dev: number; ino: number } | null;
  /** dev/ino of the spawned child's program (the launcher, in pidfile or function mode). */
  launcherExe?: { dev: number; ino: number } | null;
  paths: string[];
  pidSpec: PidSpec;
  /** The process we spawned (the target itself, or a launcher). */
  child: ProcessHandle | null;
  /** The confirmed target, pinned by the inspection that confirmed it. */
  target: ProcessHandle | null;
  identity: ProcessIdentity | null;
  stderrTail: () => string | undefined;
}

/** Spawns the command; keeps a bounded stderr tail when stderr is piped. */
export function startChild(a: Attempt, spec: LaunchSpec): void {
  const child = spawn(spec.command, a.argv, {
    stdio: ['ignore', spec.stdout ?? 'ignore', spec.stderr ?? 'ignore'],
    env: spec.env,
    cwd: spec.cwd,
    detached: spec.detached !== false,
    newGroup: spec.processGroup === true,
  });
  a.child = child;
  // The launcher's own program: a reported pid still running it is the
  // launcher's fork before exec, whatever its argv says. (Not needed when the
  // child is the target.)
  if (a.pidSpec !== 'child') {
    try {
      a.launcherExe = backend.inspect(child.pid).exe;
    } catch {
      a.launcherExe = null;
    }
  }
  if (spec.stderr === 'pipe' && child.stderr) {
    let tail = '';
    // Read for the tail, but never hold the agent's loop open for a daemon's
    // stderr. (A daemon writing to a pipe whose reader is gone gets EPIPE:
    // prefer { file } for anything long-lived.)
    (child.stderr as Readable & { unref?: () => void }).unref?.();
    (child.stderr as Readable).on('data', (d: Buffer) => {
      tail = (tail + d.toString('utf8')).slice(-STDERR_TAIL_BYTES);
    });
    a.stderrTail = () => tail || undefined;
  } else if (spec.stderr && typeof spec.stderr === 'object' && 'file' in spec.stderr) {
    const file = spec.stderr.file;
    a.stderrTail = () => readTail(file);
  }
}

function readTail(file: string): string | undefined {
  try {
    const fd = openSync(file, 'r');
    try {
      const size = fstatSync(fd).size;
      const len = Math.min(size, STDERR_TAIL_BYTES);
      const buf = Buffer.alloc(len);
      readSync(fd, buf, 0, len, size - len);
      return buf.toString('utf8') || undefined;
    } finally {
      closeSync(fd);
    }
  } catch {
    return undefined;
  }
}

function exitedError(a: Attempt, pid: number | undefined, status: ExitStatus): LaunchExitedError {
  return new LaunchExitedError(a.id, pid, status, a.stderrTail());
}

/** Resolves the pid: the child's, a pidfile's, or a function's. Fails fast if the launcher fails. */
export async function obtainPid(a: Attempt, deadline: number, signal?: AbortSignal): Promise<number> {
  const child = a.child!;
  if (a.pidSpec === 'child') return child.pid;
  if (typeof a.pidSpec === 'function') {
    const r = await within(a.pidSpec(), deadline - Date.now(), signal);
    if (r === TIMED_OUT) throw new ConfirmTimeoutError(a.id, undefined, 0, 'the pid function did not resolve in time');
    if (!Number.isSafeInteger(r) || r < 1) throw new ConfirmTimeoutError(a.id, undefined, 0, `the pid function returned ${String(r)}`);
    return r;
  }
  const file = a.pidSpec.file;
  for (let delay = 1; ; delay = Math.min(delay * 2, 25)) {
    try {
      const text = readFileSync(file, 'utf8').trim();
      if (/^\d+$/.test(text) && Number(text) > 1) return Number(text);
    } catch {
      // not written yet
    }
    // A launcher that failed will never write it; one that exited 0 may
    // have daemonized after writing, so keep reading until the deadline.
    const st = child.exitStatus;
    if (st && (st.code !== 0 || st.signal)) throw exitedError(a, child.pid, st);
    if (Date.now() >= deadline) throw new ConfirmTimeoutError(a.id, undefined, 0, `no pid in ${file}`);
    await sleep(delay, signal);
  }
}

/**
 * Polls the pid's argv until it carries the token and every expected
 * element, and records the identity from that very inspection, under the
 * pin the inspection was made with.
 */
export async function confirm(a: Attempt, pid: number, deadline: number, timeoutMs: number, signal?: AbortSignal): Promise<void> {
  const child = a.child!;
  let lastArgv: string[] | null = null;
  let spins = 0;
  for (let delay = 0; ; delay = Math.max(1, Math.min(delay * 2, 20))) {
    if (signal?.aborted) throw new AbortError(signal.reason);
    let pinned: { raw: ReturnType<typeof backend.inspect>; ref: PidRef } | null = null;
    try {
      pinned = backend.inspectPinned(pid, { reapIfChild: true });
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code !== 'ESRCH' && code !== 'ENOENT') throw err;
    }
    if (pinned === null || pinned.raw.state === 'Z') {
      pinned?.ref.close();
      // The pid is gone before it carried our argv.
      const st = pid === child.pid ? await child.exited : (child.exitStatus ?? { code: null, signal: null });
      throw exitedError(a, pid, st);
    }
    const exe = pinned.raw.exe;
    const sameFile = (x: { dev: number; ino: number } | null | undefined) => !!x && !!exe && x.dev === exe.dev && x.ino === exe.ino;
    // With an executable named, the exe must be it. Without one, a pid
    // reported by a launcher must at least no longer run the launcher's
    // program: its fork carries the launcher's argv (token included) until
    // it execs. (A target that is the launcher's own program needs
    // `executable` to be told apart.)
    const exeOk = a.executable !== null ? sameFile(a.executable) : pid === child.pid || !sameFile(a.launcherExe);
    if (exeOk && carries(pinned.raw.argv, a.token, a.expect)) {
      a.identity = toIdentity(pid, pinned.raw, backend.bootId());
      if (pid === child.pid) {
        // Our own child: its pidfd from birth already pins it.
        pinned.ref.close();
        a.target = child;
      } else {
        a.target = new ProcessHandle(pinned.ref, { identity: a.identity, spawned: false });
      }
      return;
    }
    lastArgv = pinned.raw.argv;
    pinned.ref.close();
    // Our own child, exec'd (clone returns only then) but its argv not laid
    // out yet: that takes microseconds, and a timer takes a millisecond.
    if (pinned.raw.argv.length === 0 && pid === child.pid && spins < MAX_ARGV_SPINS) {
      spins++;
      Atomics.wait(spinCell, 0, 0, ARGV_SPIN_MS);
      delay = 0;
      continue;
    }
    if (Date.now() >= deadline) {
      throw new ConfirmTimeoutError(a.id, pid, timeoutMs, `last argv seen: ${JSON.stringify(lastArgv).slice(0, 200)}`);
    }
    await sleep(delay, signal);
  }
}

/** Waits until ready, failing the moment the process exits. */
export async function waitReady(a: Attempt, instance: Instance, ready: ReadySpec, defaultTimeoutMs: number, signal?: AbortSignal): Promise<void> {
  const target = a.target!;
  const timeoutMs = typeof ready === 'function' ? defaultTimeoutMs : (ready.timeoutMs ?? 10_000);
  const died = target.exited.then((st) => ({ died: st }));
  const check = typeof ready === 'function' ? ready(instance).then(() => 'ready' as const) : pollSocket(ready.socket, target, signal);
  const r = await within(Promise.race([check, died]), timeoutMs, signal);
  if (r === TIMED_OUT) {
    throw new ReadyTimeoutError(a.id, timeoutMs, typeof ready === 'function' ? 'the ready check did not resolve' : `nothing accepted on ${ready.socket}`);
  }
  if (typeof r === 'object') {
    // A launcher child that ended means nothing here; the target did.
    throw exitedError(a, target.pid, r.died);
  }
}

async function pollSocket(path: string, target: ProcessHandle, signal?: AbortSignal): Promise<'ready'> {
  for (let delay = 1; ; delay = Math.min(delay * 2, 50)) {
    if (target.exitStatus) return new Promise<never>(() => {});
    const ok = await new Promise<boolean>((resolve) => {
      const s = connect({ path });
      s.once('connect', () => {
        s.destroy();
        resolve(true);
      });
      s.once('error', () => {
        s.destroy();
        resolve(false);
      });
    });
    if (ok) return 'ready';
    await sleep(delay, signal);
  }
}

/**
 * Undoes an attempt: every process provably ours (the child we spawned,
 * the confirmed target, anything whose argv carries the token) gets TERM,
 * a bounded wait, KILL; each is proven gone (our children reaped); then the
 * declared paths are removed. Returns the pids that were ended.
 */
export async function abandon(a: Attempt, graceMs: number, emit: Emit): Promise<number[]> {
  const child = a.child;
  // Provably ours: the child (by birth), the confirmed target (by the
  // confirming inspection), every member of the session the child leads
  // (we created it with setsid, and a session id stays taken while any
  // member lives), and anything whose argv carries the token.
  const sid = child && !child.exitStatus ? child.pid : null;
  const others = new Map<number, ProcessHandle>();
  if (a.target && a.target !== child) others.set(a.target.pid, a.target);
  for (const p of await backend.listProcesses()) {
    if (p.pid === process.pid || p.pid === 1 || p.pid === child?.pid || others.has(p.pid)) continue;
    const inSession = sid !== null && p.session === sid;
    if (!inSession && !p.argv.some((x) => x.includes(a.token))) continue;
    try {
      const { raw, ref } = backend.inspectPinned(p.pid, { reapIfChild: true });
      // Re-checked under the pin: the scan alone proves nothing.
      const proven = raw.state !== 'Z' && (raw.argv.some((x) => x.includes(a.token)) || (sid !== null && raw.session === sid));
      if (proven) others.set(p.pid, new ProcessHandle(ref, { identity: null, spawned: false }));
      else ref.close();
    } catch {
      // gone since the scan: nothing to do
    }
  }
  const ended: number[] = [];
  const end = async (h: ProcessHandle) => {
    try {
      await terminate(h, {
        graceMs,
        onEscalate: ({ pid }) => emit('escalate', { id: a.id, pid, message: `pid ${pid} ignored SIGTERM for ${graceMs} ms during abandon; sent SIGKILL` }),
      });
      ended.push(h.pid);
    } finally {
      if (h !== child) h.close();
    }
  };
  // Descendants first, so a launcher still alive reaps them (nothing is left
  // a zombie under an init that may not reap); then our own child.
  await Promise.all([...others.values()].map(end));
  if (child) {
    await end(child);
    // Our child is reaped by its watcher; wait for that so no zombie outlives abandon.
    await child.exited;
  }
  removePaths(a.paths);
  return ended;
}

export function removePaths(paths: readonly string[]): void {
  for (const p of paths) {
    try {
      unlinkSync(p);
    } catch {
      // not there: nothing stale to remove
    }
  }
}
