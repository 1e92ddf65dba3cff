/**
 * The readiness step of a launch attempt, once confirmed: sd_notify, a unix
 * socket (and its probe) or a check of the caller's, each raced against the
 * target's exit so a process that dies is reported at once, not at the
 * ready deadline.
 *
 * The socket is often in a dir others can write (/tmp): another uid can put
 * a symlink to a socket of its own at the path, or bind its own there, and a
 * connect would take its listener for the instance. So only a socket that is
 * not a symlink and belongs to root or to the uid the instance runs as is
 * connected to; anything else is "not ready yet", and the timeout says why.
 */
import { closeSync, fstatSync, constants as fsc, openSync } from 'node:fs';
import { connect } from 'node:net';
import { backend } from '../backend/index.js';
import { ReadyTimeoutError } from '../errors.js';
import type { ProcessHandle } from '../process/handle.js';
import { isNoProcess } from '../process/identity.js';
import { fileKind } from '../state/files.js';
import { errnoCode, pathOf } from '../state/statedir.js';
import { backoff, TIMED_OUT, within } from '../timing.js';
import type { ProcessIdentity } from '../types.js';
import { callHook } from './hooks.js';
import {
  type Attempt,
  confirmedIdentity,
  confirmedTarget,
  type Instance,
  type ReadySpec,
  type SocketReady,
  targetExitedError,
} from './launch.js';

/**
 * Waits until ready, failing the moment the process exits (with its status
 * and stderr tail). Bounded by timeoutMs and the abort signal; whatever is
 * still polling or probing is told to stop when the wait ends.
 */
export async function waitReady(
  a: Attempt,
  instance: Instance,
  ready: ReadySpec,
  timeoutMs: number,
  signal?: AbortSignal,
): Promise<void> {
  if (ready === 'notify') {
    if (!a.notify) throw new Error(`launch of ${a.id}: ready 'notify' without its socket`);
    await a.notify.wait(timeoutMs, signal);
    return;
  }
  const target = confirmedTarget(a);
  const over = new AbortController();
  const probeFailure: SocketFailure = {};
  const died = target.gone.then(() => 'died' as const);
  const check =
    typeof ready === 'function'
      ? callHook(ready, instance).then(() => 'ready' as const)
      : pollSocket(ready, target, confirmedIdentity(a), probeFailure, over.signal);
  try {
    const r = await within(Promise.race([check, died]), timeoutMs, signal);
    if (r === TIMED_OUT) {
      const last = probeFailure.last as Error | undefined;
      const detail =
        typeof ready === 'function'
          ? 'the ready check did not resolve'
          : probeFailure.refused !== undefined
            ? `never connected to ${ready.socket}: it ${probeFailure.refused}`
            : 'last' in probeFailure
              ? `the probe of ${ready.socket} never succeeded: ${last?.message ?? String(last)}`
              : `nothing accepted on ${ready.socket}`;
      const cause = 'last' in probeFailure ? { cause: probeFailure.last } : undefined;
      throw new ReadyTimeoutError(a.id, timeoutMs, detail, cause);
    }
    if (r === 'died') {
      throw await targetExitedError(a, target, signal);
    }
  } finally {
    over.abort();
  }
}

/** What the socket's polls found against it: the last probe failure, and why the last look refused the path. */
interface SocketFailure {
  last?: unknown;
  refused?: string;
}

/**
 * The uid the confirmed process runs as now, or null once it is gone: seen
 * to exit, a zombie, or the pid another's (another start). Read now, not
 * when the exit watcher next runs: a connect can succeed on a socket whose
 * owner just died. Where it cannot be read (and is not gone), the uid
 * confirmed.
 */
function runningUid(target: ProcessHandle, identity: ProcessIdentity): number | null {
  if (target.hasExited) return null;
  try {
    const raw = backend.inspect(target.pid);
    return raw.state !== 'Z' && raw.startTicks === identity.startTicks ? raw.uid : null;
  } catch (err) {
    return isNoProcess(err) ? null : identity.uid;
  }
}

const stillRunning = (target: ProcessHandle, identity: ProcessIdentity) => runningUid(target, identity) !== null;

/** O_PATH (not in Node's constants): an fd naming the inode at a path, for fstat and /proc/self/fd, never for I/O. */
const O_PATH = 0o10000000;

/**
 * The socket at `path`, held by an O_PATH fd, when it is one to connect to:
 * a socket (never through a symlink: with O_NOFOLLOW the fd is the link's
 * own) that belongs to root or to one of `uids`. null while nothing is
 * there yet; otherwise why not.
 */
function lookAtSocket(path: string, uids: ReadonlySet<number>): { fd: number } | { refused: string } | null {
  let fd: number;
  try {
    fd = openSync(path, O_PATH | fsc.O_NOFOLLOW);
  } catch (err) {
    return errnoCode(err) === 'ENOENT' ? null : { refused: `cannot be looked at: ${(err as Error).message}` };
  }
  let refused: string;
  try {
    const st = fstatSync(fd);
    if (st.isSocket() && (st.uid === 0 || uids.has(st.uid))) return { fd };
    refused = !st.isSocket()
      ? `is ${fileKind(st)}, not a socket`
      : `is owned by uid ${st.uid}; only root's or the instance's own (uid ${[...uids].join(' or ')}) is trusted`;
  } catch (err) {
    refused = `cannot be looked at: ${(err as Error).message}`;
  }
  closeSync(fd);
  return { refused };
}

/**
 * Connects until the socket accepts while the process still runs, then
 * probes, if there is a probe, until it resolves. Never resolves when the
 * process is gone: the exit wins the race in waitReady.
 */
async function pollSocket(
  ready: SocketReady,
  target: ProcessHandle,
  identity: ProcessIdentity,
  failure: SocketFailure,
  signal: AbortSignal,
): Promise<'ready'> {
  const never = new Promise<never>(() => {});
  for await (const _ of backoff({ maxMs: 50, signal })) {
    const uid = runningUid(target, identity);
    if (uid === null) return never;
    // The uid confirmed, and the one it runs as now: a daemon started as root may drop to its own before binding.
    const look = lookAtSocket(ready.socket, new Set([identity.uid, uid]));
    if (look && 'refused' in look) failure.refused = look.refused;
    else delete failure.refused;
    if (look && 'fd' in look && (await connectsTo(look.fd, ready.socket))) {
      // The wait may have ended while the connect was in flight: a probe
      // called now would run after the timeout was reported, against a
      // process being abandoned, and its failure would be lost.
      if (signal.aborted || !stillRunning(target, identity)) return never;
      if (!ready.probe) return 'ready';
      try {
        await callHook(ready.probe, ready.socket, signal);
        if (!stillRunning(target, identity)) return never;
        return 'ready';
      } catch (err) {
        if (signal.aborted) return never;
        failure.last = err;
      }
    }
  }
  return never;
}

/**
 * Whether the socket `fd` holds accepts a connection; the fd is closed.
 * Connected through /proc/self/fd/<fd>, the very inode looked at: a swap at
 * the path after the look cannot redirect it. Where /proc cannot serve
 * that, through the path (looked at a moment before).
 */
function connectsTo(fd: number, path: string): Promise<boolean> {
  return new Promise<boolean>((resolve) => {
    const s = connect({ path: pathOf(fd, path) });
    const done = (ok: boolean) => {
      s.destroy();
      closeSync(fd);
      resolve(ok);
    };
    s.once('connect', () => done(true));
    s.once('error', () => done(false));
  });
}
