/**
 * Undoing a failed launch attempt: everything it started ends (by cgroup, or
 * by descent, session and the token carriers the ownership rule accepts),
 * our child is reaped, and its declared paths go. Apart from confirm and
 * readiness because it is also the path every failure, abort and retry takes.
 */
import { backend } from '../backend/index.js';
import type { Emit } from '../events.js';
import type { ProcessHandle } from '../process/handle.js';
import { describeRejection, isMember, judge, mayCarryEnvToken } from '../process/ownership.js';
import { pin } from '../process/pin.js';
import { terminate } from '../process/terminate.js';
import { terminateCgroup, terminateMembers } from '../process/tree.js';
import { removeDeclaredPaths } from '../state/paths.js';
import { type Attempt, claimOf } from './launch.js';

/**
 * Undoes an attempt: the child we spawned (ours by birth), the confirmed
 * target, everything that descends from them or stays in the session we
 * created, and token carriers the ownership rule accepts (a daemon that
 * double-forked away) get TERM, a bounded wait, KILL, rescans until none is
 * left; our child is reaped; then the declared paths go. A carrier the rule
 * rejects (an operator's `tail -f <token>.log`, another uid's copy) is never
 * signalled: a warning says why. With a cgroup, the cgroup is the attempt:
 * TERM to the child and target, cgroup.kill after the grace, `populated 0`,
 * and nothing outside it is looked at (but a pid function's target created
 * elsewhere, ended as above), not even our child where its launcher moved it
 * out after its exec (letGo). Throws when something ours would not die (the
 * caller keeps the manifest). Returns the pids that were ended.
 */
export async function abandon(a: Attempt, graceMs: number, emit: Emit): Promise<number[]> {
  const child = a.childMovedOut && a.child ? letGo(a, a.child, emit) : a.child;
  const cg = a.cgroup;
  const targetInside = !!a.target && (a.target === child || !cg || targetInCgroup(a));
  const onEscalate = ({ pid }: { pid: number }) =>
    emit('escalate', {
      id: a.id,
      pid,
      message: `members of ${a.id} ignored SIGTERM for ${graceMs} ms during abandon; sent SIGKILL`,
    });
  const inCgroup: ProcessHandle[] = [];
  if (child) inCgroup.push(child);
  if (a.target && a.target !== child && targetInside) inCgroup.push(a.target);
  const ended: Array<Promise<number[]>> = [];
  if (cg) {
    const members = cg.procs();
    ended.push(
      terminateCgroup(cg, inCgroup, { graceMs, onEscalate }).then(() => [
        ...new Set([...inCgroup.map((h) => h.pid), ...members]),
      ]),
    );
  }
  const outside = cg ? (a.target && !targetInside ? [a.target] : []) : inCgroup;
  if (outside.length) ended.push(endTree(a, outside, graceMs, emit, onEscalate));
  const settled = await Promise.allSettled(ended);
  const failed = settled.find((r) => r.status === 'rejected');
  if (failed) {
    if (child?.hasExited) await child.exited;
    throw (failed as PromiseRejectedResult).reason;
  }
  // Our child is reaped by its watcher; wait for that so no zombie outlives abandon.
  if (child) await child.exited;
  removeDeclaredPaths(a.paths, emit, a.id);
  return settled.flatMap((r) => (r.status === 'fulfilled' ? r.value : []));
}

/**
 * Our child, moved out of the attempt's cgroup after its exec (confirm refused it), is no longer the
 * instance's: whoever moved it owns it now. Never signalled; its handle is closed, and it is still reaped
 * whenever it exits. Returns null: nothing of the attempt is left to end by it.
 */
function letGo(a: Attempt, child: ProcessHandle, emit: Emit): null {
  emit('warning', {
    id: a.id,
    pid: child.pid,
    message: `pid ${child.pid} was moved out of the cgroup of ${a.id} after its exec: not the instance's, left running and not signalled`,
  });
  child.close();
  return null;
}

/** Whether the attempt's target is in its cgroup (a pid function's may have been created elsewhere). */
export function targetInCgroup(a: Attempt): boolean {
  return !!a.cgroup && !!a.identity && isMember(a.identity, { pids: new Set(), cgroup: a.cgroup.node });
}

/** Ends roots that no cgroup holds, with their descendants, session and the token carriers the rule accepts. */
async function endTree(
  a: Attempt,
  roots: ProcessHandle[],
  graceMs: number,
  emit: Emit,
  onEscalate: (i: { pid: number }) => void,
): Promise<number[]> {
  const rootPids = new Set(roots.map((r) => r.pid));
  const extra: ProcessHandle[] = [];
  const claim = claimOf(a);
  const launched = [a.command, ...a.argv];
  // Env mode: the token is in environments, read only of processes whose argv fits the launch.
  const candidate = (argv: string[]) =>
    a.tokenMode === 'env' ? mayCarryEnvToken(argv, launched, a.executablePath) : argv.some((x) => x.includes(a.token));
  try {
    // The attempt's own session, made by the child it spawned: its launcher may have exited already (a
    // pidfile launch's does), its fork not exec'd yet. Freed and taken by a stranger only after all of it
    // left, within this attempt's bounds (a stop, later, asks for a member in it: sessionHeld).
    const session = a.session;
    for (const p of await backend.listProcesses()) {
      if (rootPids.has(p.pid) || !candidate(p.argv)) continue;
      const pinned = pin(p.pid, { reapIfChild: true });
      if (!pinned) continue;
      // Re-checked under the pin: the scan alone proves nothing.
      const verdict = judge(claim, pinned.identity, { pids: rootPids, session }, false, pinned.environ);
      if (verdict.ours) {
        extra.push(pinned.handle);
        continue;
      }
      pinned.handle.close();
      // In env mode most candidates are merely the same program: only a token carrier is worth a warning.
      if (a.tokenMode === 'env' && verdict.why === 'token') continue;
      if (verdict.why !== 'gone')
        emit('warning', {
          id: a.id,
          pid: p.pid,
          reason: verdict.why,
          message: `abandon left ${describeRejection(p.pid, verdict.why)}`,
        });
    }
    const { members } = await terminateMembers([...roots, ...extra], {
      session,
      sessionProven: session !== null,
      graceMs,
      reapIfChild: true,
      onEscalate,
    });
    return members;
  } catch (err) {
    // A scan or a pin that failed (EMFILE) proves nothing gone, but the roots are ours by birth and by the
    // confirming inspection: they end all the same, and the error tells the caller to keep the state.
    const warn = (r: ProcessHandle, e: unknown) =>
      emit('warning', { id: a.id, pid: r.pid, message: `abandon could not end pid ${r.pid}: ${(e as Error).message}` });
    await Promise.all(roots.map((r) => terminate(r, { graceMs }).catch((e: unknown) => warn(r, e))));
    throw err;
  } finally {
    for (const h of extra) h.close();
  }
}
