/**
 * Real processes for tests, made without custody so that what custody reads
 * can be compared with what was independently set up.
 */
import { spawn as cpSpawn, type ChildProcess, execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { randomBytes } from 'node:crypto';

export const MARKER = `custody-test-${randomBytes(4).toString('hex')}`;

export function tmpDir(prefix = 'custody-'): { path: string; cleanup: () => void } {
  const path = mkdtempSync(join(tmpdir(), prefix));
  return { path, cleanup: () => rmSync(path, { recursive: true, force: true }) };
}

/** A child_process child that sleeps; argv carries the marker. */
export function sleeper(seconds = 60, extra: string[] = []): ChildProcess {
  return cpSpawn('sleep', [String(seconds), ...extra], { stdio: 'ignore', argv0: 'sleep' });
}

export async function waitFor<T>(fn: () => T | undefined | null | false, ms = 5000, what = 'condition'): Promise<T> {
  const deadline = Date.now() + ms;
  for (;;) {
    const v = fn();
    if (v) return v;
    if (Date.now() > deadline) throw new Error(`timed out waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

export function exited(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return Promise.resolve();
  return new Promise((r) => child.once('exit', () => r()));
}

export async function killAndWait(child: ChildProcess): Promise<void> {
  if (child.exitCode === null && child.signalCode === null) {
    child.kill('SIGKILL');
    await exited(child);
  }
}

export function procStat(pid: number): string[] | null {
  try {
    const text = readFileSync(`/proc/${pid}/stat`, 'utf8');
    return text
      .slice(text.lastIndexOf(')') + 2)
      .trim()
      .split(' ');
  } catch {
    return null;
  }
}

/** Whether `pid` has a handler installed for `signal` (its SigCgt mask): a test that signals a process whose
 * handler is not yet installed tests the default action instead. */
export function catchesSignal(pid: number, signal: number): boolean {
  try {
    const line = readFileSync(`/proc/${pid}/status`, 'utf8').match(/^SigCgt:\s*([0-9a-f]+)$/m);
    return line !== null && ((BigInt(`0x${line[1]}`) >> BigInt(signal - 1)) & 1n) === 1n;
  } catch {
    return false;
  }
}

export function isGone(pid: number): boolean {
  const st = procStat(pid);
  return st === null || st[0] === 'Z';
}

/**
 * Whether the process that had start time `start` at pid (stat field 22, as
 * identity.startTicks holds it, read while it was known alive) is gone: none
 * there, a zombie, or another process. On a busy host a pid freed seconds
 * ago may already be a stranger's, which isGone would take for it.
 */
export function goneSince(pid: number, start: number | string | null): boolean {
  const st = procStat(pid);
  return st === null || st[0] === 'Z' || st[19] !== String(start);
}

/**
 * Whether no process of the test's own is left at pid: none there, a zombie,
 * or one whose argv no longer carries `mark` (a stranger that reused the pid).
 * For pids whose start time was never read, such as those of events.
 */
export function goneFrom(pid: number, mark = MARKER): boolean {
  return isGone(pid) || !carries(pid, mark);
}

/** Whether the process at pid has `mark` in its argv (false when there is none). */
function carries(pid: number, mark: string): boolean {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'latin1').includes(mark);
  } catch {
    return false;
  }
}

/** The start time of the process at pid (stat field 22), or null when there is none. */
export function startOf(pid: number): string | null {
  return procStat(pid)?.[19] ?? null;
}

/**
 * SIGKILL from a test's cleanup, only to the process it means. A process the
 * test started and that exited meanwhile may have left its pid to a stranger
 * (another test worker, even): the pid must still carry `mark` in its argv
 * or, given `start`, still have that start time. Returns whether it sent.
 */
export function killOwn(pid: number, options: { start?: number | string | null; mark?: string } = {}): boolean {
  const { start, mark = MARKER } = options;
  const ours = start !== undefined ? start !== null && startOf(pid) === String(start) : carries(pid, mark);
  if (!ours) return false;
  try {
    process.kill(pid, 'SIGKILL');
    return true;
  } catch {
    return false;
  }
}

/**
 * A pid with no process that will not get one while a test uses it.
 *
 * On a busy host pids wrap within seconds, so "free now" is not enough: the
 * pid just ahead of the allocation cursor is handed out next. Once the cursor
 * has passed RESERVED_PIDS (300) the kernel allocates only from 300 up
 * (kernel/pid.c, alloc_pid), so a free pid below 300 stays free. Failing
 * that, the free pid just behind the cursor is the last the kernel reaches.
 */
export function unusedPid(): number {
  const max = Number(readFileSync('/proc/sys/kernel/pid_max', 'utf8'));
  const cursor = Number(readFileSync('/proc/sys/kernel/ns_last_pid', 'utf8'));
  const free = (p: number) => !existsSync(`/proc/${p}`);
  if (cursor > 300) for (let p = 299; p > 1; p--) if (free(p)) return p;
  for (let back = 1; back < max; back++) {
    const p = (((cursor - back) % max) + max) % max;
    if (p > 1 && free(p)) return p;
  }
  throw new Error('no free pid');
}

/** A process to end at cleanup: a pid that carries MARKER in its argv, or a pid with its start time (startOf). */
export type Own = number | { pid: number; start: string | null };

/** Ends, from a cleanup, each of `own` that is still the test's own (killOwn), and waits up to `ms` until those are gone. */
export async function endOwn(own: Iterable<Own>, ms = 5000): Promise<void> {
  const sent: Array<{ pid: number; start: string | null }> = [];
  for (const o of own) {
    const { pid, start } = typeof o === 'number' ? { pid: o, start: startOf(o) } : o;
    if (killOwn(pid, typeof o === 'number' ? {} : { start })) sent.push({ pid, start });
  }
  await waitFor(() => sent.every(({ pid, start }) => goneSince(pid, start)), ms, 'cleanup').catch(() => {});
}

/**
 * A python process that logs every catchable signal it receives to `log`,
 * one name a line, and optionally ignores SIGTERM (logging it all the same).
 * Prints "ready" on stdout once its handlers are in place.
 */
export const SIGNAL_LOGGER = `
import os, signal, sys, time
log, ignore_term = sys.argv[1], sys.argv[2] == '1'
def handler(num, frame):
    with open(log, 'a') as f:
        f.write(signal.Signals(num).name + '\\n')
    if num == signal.SIGTERM and not ignore_term:
        os._exit(143)
for s in signal.valid_signals():
    if s in (signal.SIGKILL, signal.SIGSTOP, signal.SIGCHLD):
        continue
    try:
        signal.signal(s, handler)
    except (OSError, ValueError, RuntimeError):
        pass
print('ready', flush=True)
while True:
    time.sleep(3600)
`;

export function signalLoggerArgs(log: string, ignoreTerm: boolean, marker = MARKER): string[] {
  return ['-c', SIGNAL_LOGGER, log, ignoreTerm ? '1' : '0', marker];
}

export function loggedSignals(log: string): string[] {
  try {
    return readFileSync(log, 'utf8').split('\n').filter(Boolean);
  } catch {
    return [];
  }
}

export function isRoot(): boolean {
  return process.getuid?.() === 0;
}

export function hasUnshare(): boolean {
  try {
    execFileSync('unshare', ['--pid', '--fork', '--mount-proc', 'true'], { stdio: 'ignore', timeout: 5000 });
    return true;
  } catch {
    return false;
  }
}

/** Resolves once a signal logger has printed its whole "ready" line; keeps draining after. */
export function untilReady(stream: NodeJS.ReadableStream): Promise<void> {
  return new Promise((resolve) => {
    let seen = '';
    const onData = (d: Buffer | string) => {
      seen += String(d);
      if (seen.includes('ready\n')) {
        stream.off('data', onData);
        stream.resume();
        resolve();
      }
    };
    stream.on('data', onData);
  });
}

/**
 * The arguments of `unshare` that run a Node fixture as pid 1 of a fresh
 * PID namespace with its own /proc, where orphans come to it and
 * ns_last_pid can hand out a chosen pid; the namespace ends with the fixture.
 */
export function asNamespaceInit(fixture: string, ...args: string[]): string[] {
  return ['--pid', '--fork', '--kill-child', '--mount-proc', process.execPath, fixture, ...args];
}

/** The processes (host pids, every namespace's) whose argv carries `token`, in /proc's order. */
export function tokenCarriers(token: string): number[] {
  const out: number[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      if (readFileSync(`/proc/${name}/cmdline`, 'latin1').includes(token)) out.push(Number(name));
    } catch {
      // gone
    }
  }
  return out;
}
