/**
 * Undoing a failed launch attempt: everything it started ends (by cgroup, or
 * by descent, session, the launcher's own fork and the token carriers the
 * ownership rule accepts), our child is reaped, and its declared paths go,
 * unless a carrier the rule rejected is still running: its paths are then
 * kept, and the caller quarantines the id. Apart from confirm and readiness
 * because it is also the path every failure, abort and retry takes.
 */
import { backend } from '../backend/index.js';
import type { Emit } from '../events.js';
import type { ProcessHandle } from '../process/handle.js';
import { isTransient } from '../process/identity.js';
import {
  type Claim,
  describeRejection,
  type EnvironReader,
  envToken,
  isMember,
  judge,
  mayCarryEnvToken,
  protectedPid,
  type Rejection,
} from '../process/ownership.js';
import { pin } from '../process/pin.js';
import { terminate } from '../process/terminate.js';
import { terminateCgroup, terminateMembers } from '../process/tree.js';
import { removeDeclaredPaths } from '../state/paths.js';
import type { ProcessIdentity } from '../types.js';
import { type Attempt, claimOf } from './launch.js';
import { readPidfile } from './pidfile.js';

/** A carrier of the attempt's token that abandon would not signal, still running when it was done. */
export interface LeftProcess {
  pid: number;
  /** Why the ownership rule did not take it for the attempt's. */
  why: Rejection;
}

/** What an abandon did: the pids it ended, and what it left running (never signalled). */
export interface Abandoned {
  ended: number[];
  /** Non-empty: the declared paths were kept, since a process left running may be using them. */
  left: LeftProcess[];
}

/**
 * Undoes an attempt: the child we spawned (ours by birth), the confirmed
 * target, everything that descends from them or stays in the session we
 * created, the launcher's own fork the pidfile names, and token carriers the
 * ownership rule accepts (a daemon that double-forked away) get TERM, a
 * bounded wait, KILL, rescans until none is left; our child is reaped; then
 * the declared paths go. A carrier the rule rejects (an operator's `tail -f
 * <token>.log`, another uid's copy, a daemon that dropped to a uid the launch
 * did not declare) is never signalled: a warning says why, and while it runs
 * the paths stay (it may be serving on them) and it is returned in `left`.
 * With a cgroup, the cgroup is the attempt: TERM to the child and target,
 * cgroup.kill after the grace, `populated 0`, and nothing outside it is
 * looked at (but a pid function's target created elsewhere, ended as above),
 * not even our child where its launcher moved it out after its exec (letGo:
 * whoever moved it owns it now, as a service manager owns a scope). Throws
 * when something ours would not die (the caller keeps the manifest).
 */
export async function abandon(a: Attempt, graceMs: number, emit: Emit): Promise<Abandoned> {
  const movedOut = a.childMovedOut && a.child ? a.child : null;
  const child = movedOut ? letGo(a, movedOut, emit) : a.child;
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
  const ended: Array<Promise<Abandoned>> = [];
  if (cg) {
    const members = cg.procs();
    ended.push(
      terminateCgroup(cg, inCgroup, { graceMs, onEscalate }).then(() => ({
        ended: [...new Set([...inCgroup.map((h) => h.pid), ...members])],
        left: [],
      })),
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
  const done = settled.flatMap((r) => (r.status === 'fulfilled' ? [r.value] : []));
  const left = done.flatMap((d) => d.left);
  if (left.length === 0) removeDeclaredPaths(a.paths, emit, a.id);
  return { ended: done.flatMap((d) => d.ended), left };
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
): Promise<Abandoned> {
  const rootPids = new Set(roots.map((r) => r.pid));
  const extra: ProcessHandle[] = [];
  const rejected: Array<LeftProcess & { startTicks: number }> = [];
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
    const named = pidfileNames(a);
    for (const p of await backend.listProcesses()) {
      if (rootPids.has(p.pid) || !candidate(p.argv)) continue;
      const pinned = pin(p.pid, { reapIfChild: true });
      if (!pinned) continue;
      // Re-checked under the pin: the scan alone proves nothing.
      const verdict = judge(claim, pinned.identity, { pids: rootPids, session }, false, pinned.environ);
      if (verdict.ours || (p.pid === named && isLaunchersFork(a, pinned.identity, pinned.environ))) {
        extra.push(pinned.handle);
        continue;
      }
      let leftBehind: boolean;
      try {
        // Pid 1, ourselves and our ancestors were there before the launch: never what it left behind. The
        // environment is read while the pin holds: the read is checked against it.
        leftBehind = verdict.why !== 'gone' && !protectedPid(p.pid) && carriesToken(a, pinned.environ);
      } finally {
        pinned.handle.close();
      }
      // In env mode most candidates are merely the same program: only a token carrier is worth a warning.
      if (a.tokenMode === 'env' && verdict.why === 'token') continue;
      if (verdict.why === 'gone') continue;
      emit('warning', {
        id: a.id,
        pid: p.pid,
        reason: verdict.why,
        message: `abandon left ${describeRejection(p.pid, verdict.why)}`,
      });
      if (leftBehind) rejected.push({ pid: p.pid, why: verdict.why, startTicks: pinned.identity.startTicks });
    }
    const { members } = await terminateMembers([...roots, ...extra], {
      session,
      sessionProven: session !== null,
      graceMs,
      reapIfChild: true,
      onEscalate,
    });
    // Read once the rest is over: one that exited meanwhile (or was a member's after all) holds nothing.
    const left = rejected.filter((r) => stillRuns(r.pid, r.startTicks)).map(({ pid, why }) => ({ pid, why }));
    return { ended: members, left };
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

/** The pid a pidfile launch's pidfile names now; null for none, or one launch would refuse. */
function pidfileNames(a: Attempt): number | null {
  if (typeof a.pidSpec !== 'object') return null;
  try {
    return readPidfile(a.pidSpec.file);
  } catch (err) {
    // EMFILE opening it says nothing of what it names: no verdict, so the abandon is not proven.
    if (isTransient((err as Error).cause)) throw err;
    return null;
  }
}

/**
 * The launcher's own fork, which the pidfile names: a launcher that daemonizes
 * without exec (QEMU -daemonize, a python daemon) leaves its target running
 * the launcher's program, which confirm never takes for the target (without
 * `executable` it cannot be told from the fork before an exec), yet it is the
 * launch's: it carries the token, runs the launcher's program as our uid in our
 * pid namespace, and started no earlier than the launcher. Abandon ends it.
 */
function isLaunchersFork(a: Attempt, live: ProcessIdentity, environ: EnvironReader | undefined): boolean {
  const exe = a.launcherExe;
  const since = a.launcherStartTicks;
  if (!exe || since === null || since === undefined || live.startTicks < since) return false;
  // Our uid only (uid null): a uid the launch declared is one its target may drop to, not its launcher.
  const fork: Claim = {
    token: a.token,
    tokenMode: a.tokenMode,
    expect: [],
    program: { exe },
    launcherExe: null,
    uid: null,
  };
  return judge(fork, live, undefined, true, environ).ours;
}

/**
 * Whether a rejected candidate is known to carry the attempt's token: in argv mode the scan chose it for
 * that; in env mode it was chosen for its argv alone (the rule rejects another uid's before reading its
 * environment), so only an environment that shows the token counts.
 */
function carriesToken(a: Attempt, environ: EnvironReader): boolean {
  if (a.tokenMode !== 'env') return true;
  try {
    return envToken(environ()) === a.token;
  } catch (err) {
    // Exhaustion is no answer; unreadable, or gone, shows nothing of the launch's.
    if (isTransient(err)) throw err;
    return false;
  }
}

/** Whether the process read at pid with these start ticks is still alive (not a zombie). */
function stillRuns(pid: number, startTicks: number): boolean {
  const st = backend.stat(pid);
  return st !== null && st.startTicks === startTicks && st.state !== 'Z' && st.state !== 'X';
}
