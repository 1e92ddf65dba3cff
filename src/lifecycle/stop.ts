/**
 * Stopping an instance: the graceful hook (bounded), then SIGTERM, a bounded
 * wait and SIGKILL, of its cgroup where it has one, else of its tree, else
 * (tree: false) of its main process; an abort forces it (SIGKILL now). Its
 * state, cgroup and declared paths go only once it is proven gone.
 *
 * The `stopping` manifest is written before the first signal. From then on
 * the stop is finished, never undone: one that fails halfway (EMFILE, EIO,
 * a timeout) leaves the instance `stopping`, in the table and on disk, and
 * the next stop() resumes it. It re-finds what is still alive: the cgroup's
 * members, or the main by its pin and the members pinned before the first
 * signal (a few of its children), whose session then proves the rest. `already-gone` is said only
 * when every one of them is proven gone.
 */
import { AbortError } from '../errors.js';
import { backend } from '../backend/index.js';
import { guardCgroup } from '../process/cgroup-guard.js';
import { removeCgroup } from '../process/cgroup-tree.js';
import { open, type ProcessHandle, releaseExit } from '../process/handle.js';
import { isNoProcess } from '../process/identity.js';
import { isMember } from '../process/ownership.js';
import { orphansInSession } from '../process/reaper.js';
import { resultOf } from '../process/exit.js';
import { UNKNOWN_EXIT } from '../process/signals.js';
import { endedResult, forceEnd, terminate } from '../process/terminate.js';
import { terminateCgroup, terminateMembers, terminateTree } from '../process/tree.js';
import type { InstanceStopResult, StopOptions, StopResult } from '../options.js';
import type { ExitResult, LastExit } from '../types.js';
import { removeDeclaredPaths } from '../state/paths.js';
import { TIMED_OUT, within } from '../timing.js';
import { callHook } from './hooks.js';
import { rest, type RunEnd, settleEnd } from './ends.js';
import type { LifecycleHost } from './host.js';
import { persistStopping, type Exited, type Pinned, type Running, type Stopping } from './instances.js';

/** A stop as the lifecycle makes it: the caller's options, the grace settled, and (custody's own stops) why. */
export type StopRequest = StopOptions & { graceMs: number; why?: ExitResult };

/** Begins a stop of a running or exited instance, or resumes one that failed; resolves once it is proven gone. */
export async function stopInstance(
  host: LifecycleHost,
  t: Running | Exited | Stopping,
  options: StopRequest,
): Promise<InstanceStopResult> {
  const { id } = (t.status === 'stopping' ? t.from : t).instance;
  const s: Stopping =
    t.status === 'stopping'
      ? t
      : { status: 'stopping', from: t, persisted: false, done: null, failed: null, members: [] };
  host.table.move(id, s);
  const done = host.inFlight(run(host, s, options));
  s.done = done;
  try {
    return await done;
  } catch (err) {
    if (host.table.get(id) === s) {
      s.done = null;
      // A stop that had begun, or resumed one that had: the next stop() finishes it.
      if (s.persisted || t.status === 'stopping') s.failed = err as Error;
      else {
        // Nothing was written, so nothing was signalled: it is what it was.
        releaseMembers(s);
        host.table.move(id, s.from);
        if (s.from.status === 'running') host.holdExitOf(s.from);
      }
    }
    throw err;
  }
}

/**
 * A stop custody makes itself (failed health probes, a watchdog that fired), told why; refused, as stop()
 * refuses, where the instance's cgroup path became unsafe to act through.
 */
export function stopFor(
  host: LifecycleHost,
  t: Running,
  why: ExitResult,
  graceMs: number,
): Promise<InstanceStopResult> {
  if (t.cgroup) guardCgroup(t.cgroup);
  return stopInstance(host, t, { graceMs, why });
}

async function run(host: LifecycleHost, s: Stopping, options: StopRequest): Promise<InstanceStopResult> {
  const t = s.from;
  const h = t.handle;
  if (options.signal?.aborted) throw new AbortError(options.signal.reason);
  // An exit seen while we were not stopping is being cleaned up: let that finish first.
  if (t.status === 'exited') await t.cleanup;
  if (!s.persisted) {
    // Its state is gone already (the exit's cleanup removed it): nothing is left to signal.
    s.persisted = await persistStopping(host.store, t.instance.id, options.why ?? 'stopped');
  }
  // Before the first signal: the members that prove its session once the main is gone.
  if (!t.cgroup && options.tree !== false && !h.hasExited) pinMembers(s);
  let result: StopResult;
  try {
    result = await end(host, s, options);
  } catch (err) {
    if (!(err instanceof AbortError)) throw err;
    await force(host, s, options);
    if (t.cgroup) await removeCgroup(t.cgroup, host.emit, t.instance.id);
    const killed: StopResult = { outcome: 'exited', escalated: true, code: null, signal: 'SIGKILL' };
    await settleEnd(host, runOf(t), endOf(s, killed, 'stopped'), { restart: false });
    stopped(host, s, killed, 'stop aborted: ended with SIGKILL; state removed');
    throw err;
  }
  // Proven gone (populated 0, or every pin's exit seen): the cgroup goes, then the state (or, for custody's
  // own stop of an instance its policy restarts, the state says backoff).
  if (t.cgroup) await removeCgroup(t.cgroup, host.emit, t.instance.id);
  const why = options.why ?? 'stopped';
  const after = await settleEnd(host, runOf(t), endOf(s, result, why), { restart: !!options.why });
  const how = `${result.outcome}${result.escalated ? ', after SIGKILL' : ''}`;
  const said = options.why ? ` for ${options.why}` : '';
  const r = stopped(host, s, result, `stopped${said} (${how}); ${after ? after.kind : 'state removed'}`, why);
  // Its paths are gone with it (stopped): the restart may be armed.
  if (after && t.life) rest(host, t.instance.id, undefined, after, t.life);
  return r;
}

/** The run a stop ends, as its end is settled. */
function runOf(t: Running | Exited): RunEnd {
  return { id: t.instance.id, life: t.life, afterExit: t.afterExit, pid: t.handle.pid, token: t.instance.token };
}

/**
 * A few of the main's children, pinned and proven its children under their pins. One of them alive in the
 * instance's session proves the session (sessionHeld) once the main is gone, and the session's scan then
 * finds the rest: a few suffice, and each pin costs an fd and, on the js backend, a read per poll.
 */
function pinMembers(s: Stopping): void {
  const kept = s.members.filter((m) => {
    const alive = !m.hasExited && m.isAlive();
    if (!alive) m.close();
    return alive;
  });
  const main = s.from.handle;
  const parent = { pids: new Set([main.pid]) };
  const known = new Set(kept.map((m) => m.pid));
  for (const pid of backend.children(main.pid)) {
    if (kept.length >= MEMBER_PINS) break;
    if (known.has(pid)) continue;
    let m: ProcessHandle;
    try {
      m = open(pid);
    } catch (err) {
      if (isNoProcess(err)) continue;
      throw err;
    }
    // The main alive after the read: the parent the child showed was the main, not a later owner of its pid.
    if (m.identity && isMember(m.identity, parent) && main.isAlive()) kept.push(m);
    else m.close();
  }
  s.members = kept;
}

/** How many of its children a stop pins before its first signal. */
const MEMBER_PINS = 4;

function releaseMembers(s: Stopping): void {
  for (const m of s.members.splice(0)) m.close();
}

/** Abort means "force it now": KILL, a bounded wait until it is gone (StopTimeoutError past it). */
async function force(host: LifecycleHost, s: Stopping, options: StopRequest): Promise<void> {
  const t = s.from;
  const h = t.handle;
  if (t.cgroup) await terminateCgroup(t.cgroup, [h], { termSignal: 'SIGKILL', graceMs: 0, killEach: killEach(host) });
  else if (options.tree !== false)
    await terminateTree(h, {
      termSignal: 'SIGKILL',
      graceMs: 0,
      reapIfChild: true,
      session: t.session,
      also: liveMembers(s),
    });
  else {
    releaseExit(h);
    await forceEnd(h);
  }
}

async function end(host: LifecycleHost, s: Stopping, options: StopRequest): Promise<StopResult> {
  const t = s.from;
  const h = t.handle;
  if (t.status === 'exited' || h.exitStatus) return endLeft(host, s, options);
  const single = options.tree === false;
  if (!options.graceful) {
    const { leftovers: _l, ...result } = await terminateInstance(host, s, options.graceMs, options.signal, single);
    return result;
  }
  const { id } = t.instance;
  const ac = new AbortController();
  // Gone, not exited: a non-child's status may come much later, if ever.
  const gone = h.gone.then(() => 'gone' as const);
  // The hook asks (sync or async); the process then has the rest of graceMs to act on it.
  const hook = callHook(options.graceful, t.instance, ac.signal).then(
    () => gone,
    (err: unknown) => {
      const why = (err as Error)?.message ?? String(err);
      host.emit('warning', { id, message: `graceful stop hook failed: ${why}` });
      return 'failed' as const;
    },
  );
  let r: 'gone' | 'failed' | typeof TIMED_OUT | undefined;
  try {
    r = await within(Promise.race([hook, gone]), options.graceMs, options.signal);
  } finally {
    // Whatever ended the graceful phase, the hook's work is over.
    ac.abort(new Error(r === TIMED_OUT ? 'graceful stop timed out' : 'graceful stop is over'));
  }
  if (r === TIMED_OUT) {
    host.emit('warning', {
      id,
      message: `graceful stop did not end the process within ${options.graceMs} ms; terminating`,
    });
  }
  const termGraceMs = options.termGraceMs ?? 2000;
  const { leftovers: _l, ...result } = await terminateInstance(host, s, termGraceMs, options.signal, single);
  return r === 'gone' ? { ...result, outcome: 'exited' } : result;
}

/**
 * The main process is gone: what is left of the instance (its cgroup's
 * members, or the members a failed stop pinned and their session) is still
 * the instance's. `already-gone` only when nothing of it was alive.
 */
async function endLeft(host: LifecycleHost, s: Stopping, options: StopRequest): Promise<StopResult> {
  const t = s.from;
  const st = (t.status === 'exited' ? t.exit : t.handle.exitStatus) ?? UNKNOWN_EXIT;
  let ended = false;
  let escalated = false;
  if (t.cgroup) {
    ended = t.cgroup.populated();
    if (ended) escalated = (await terminateInstance(host, s, 0, options.signal)).escalated;
  } else {
    const live = liveMembers(s);
    if (live.length > 0) {
      const r = await terminateMembers(live, {
        session: t.session,
        reapIfChild: true,
        graceMs: options.graceMs,
        signal: options.signal,
        onEscalate: onEscalate(host, t),
      });
      ended = true;
      escalated = r.escalated;
    }
  }
  return { outcome: ended ? 'exited' : 'already-gone', escalated, code: st.code, signal: st.signal };
}

function liveMembers(s: Stopping): ProcessHandle[] {
  return s.members.filter((m) => !m.hasExited && m.isAlive());
}

const onEscalate =
  (host: LifecycleHost, t: Pinned) =>
  ({ pid, graceMs }: { pid: number; graceMs: number }) =>
    host.emit('escalate', {
      id: t.instance.id,
      pid,
      message: `${t.instance.id} (pid ${pid}) did not stop within ${graceMs} ms of SIGTERM; sending SIGKILL`,
    });

/**
 * SIGTERM, graceMs, then the kill: of the cgroup where the instance has
 * one (the proof is `populated 0`), else of the tree (every member
 * pinned), else (single: tree: false) of the main process alone.
 */
export async function terminateInstance(
  host: LifecycleHost,
  s: Stopping | Exited,
  graceMs: number,
  signal: AbortSignal | undefined,
  single = false,
): Promise<StopResult & { leftovers?: number[] }> {
  const t = s.status === 'stopping' ? s.from : s;
  const h = t.handle;
  if (t.cgroup) {
    const wasAlive = h.isAlive();
    const r = await terminateCgroup(t.cgroup, [h], {
      graceMs,
      signal,
      onEscalate: onEscalate(host, t),
      killEach: killEach(host),
    });
    return { ...(await endedResult(h, wasAlive, r.escalated)), leftovers: r.leftovers };
  }
  if (single) {
    // The main alone: nothing to anchor, and its status is wanted as it comes.
    releaseExit(h);
    return terminate(h, { graceMs, signal, onEscalate: onEscalate(host, t) });
  }
  const { members: _members, ...result } = await terminateTree(h, {
    graceMs,
    signal,
    onEscalate: onEscalate(host, t),
    reapIfChild: true,
    session: t.session,
    also: [...(s.status === 'stopping' ? liveMembers(s) : []), ...orphansOf(host, t)],
  });
  return result;
}

/** Without cgroup.kill (Linux < 5.14) every member is killed through its own pidfd. */
function killEach(host: LifecycleHost): boolean {
  return host.cgroups?.capabilities().kill !== true;
}

/** Members re-parented to us (as subreaper) that the instance's tree no longer reaches. */
function orphansOf(host: LifecycleHost, t: Pinned): ProcessHandle[] {
  const session = t.instance.identity.session;
  return host.subreaper && session ? orphansInSession(session) : [];
}

/**
 * Why it ended: its own end where it had ended before this stop (exited on its own, its exit seen), else
 * `stopped` (or the reason custody stopped it: `health`); an `already-gone` main whose exit was not seen
 * yet, by its status.
 */
function endOf(s: Stopping, r: StopResult, why: ExitResult): LastExit {
  const own = s.from.instance.lastExit;
  if (s.from.status === 'exited' && own) return own;
  const status = { code: r.code, signal: r.signal };
  return { ...status, result: r.outcome === 'already-gone' ? resultOf(status) : why };
}

/** Proven gone: the pins, the declared paths, the entry go; the stop event says how and why it ended. */
function stopped(
  host: LifecycleHost,
  s: Stopping,
  r: StopResult,
  message: string,
  why: ExitResult = 'stopped',
): InstanceStopResult {
  const t = s.from;
  const { id } = t.instance;
  const end = endOf(s, r, why);
  t.instance.lastExit = end;
  const result: InstanceStopResult = { ...r, result: end.result };
  host.reap();
  t.handle.close();
  releaseMembers(s);
  host.logs.unwatch(id);
  removeDeclaredPaths(t.paths, host.emit, id);
  host.table.moveFrom(id, s, undefined);
  host.emit('stop', { id, pid: t.handle.pid, ...result, message });
  return result;
}
