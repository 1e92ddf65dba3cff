/**
 * The confirm step of a launch attempt: the reported pid is polled until it
 * has exec'd into the attempt's marks, and the identity is recorded from that
 * very inspection (launch.ts has the attempt). The decision after each
 * inspection is a pure function, decideConfirm(), so its table is tested
 * without a process.
 */
import { backend } from '../backend/index.js';
import { ConfirmTimeoutError, NotOursError } from '../errors.js';
import {
  describeRejection,
  judge,
  sameFile,
  tokenMarks,
  type CgroupPlaces,
  type Claim,
  type EnvironReader,
  type Rejection,
} from '../process/ownership.js';
import { pin } from '../process/pin.js';
import { UNKNOWN_EXIT } from '../process/signals.js';
import { backoff, TIMED_OUT, within } from '../timing.js';
import type { ProcessIdentity } from '../types.js';
import { type Attempt, claimOf, EXIT_STATUS_WAIT_MS, exitedError, goneBeforeConfirm, spawned } from './launch.js';

/** A short kernel wait for a child's argv to appear after exec: at most 40 x 50 us. */
const spinCell = new Int32Array(new SharedArrayBuffer(4));
const MAX_ARGV_SPINS = 40;
const ARGV_SPIN_MS = 0.05;

/**
 * Rejections that waiting cannot change for a reported pid: it is someone else's (not a launcher still
 * exec'ing); and, for any pid, an environment that may not be read (another uid; root reads every one).
 */
const PERMANENT = new Set<Rejection>(['init', 'self', 'ancestor', 'uid', 'namespace', 'cgroup', 'environ']);

/** Our own child: exec'd into `executable` (if named) and carrying the marks; why not, or null. */
function ownChildMarks(a: Attempt, claim: Claim, live: ProcessIdentity, environ: EnvironReader): Rejection | null {
  if (a.executable && !(live.exe !== null && live.exe.dev === a.executable.dev && live.exe.ino === a.executable.ino)) {
    return 'exe';
  }
  return tokenMarks(claim, live, environ);
}

/** What one inspection of the reported pid showed, for decideConfirm(). */
export interface ConfirmFacts {
  /** Whether the pid is our own child (ours by birth), not one a launcher or a function reported. */
  own: boolean;
  /** Not there any more, or a zombie: it exited before it carried our marks. */
  gone: boolean;
  /** Why it is not (yet) the target, by the ownership rule or our child's marks; null: it is. */
  why: Rejection | null;
  /** Our child exec'd but its argv not laid out yet (an empty cmdline). */
  argvEmpty: boolean;
  /** Short kernel waits spent on an empty argv so far. */
  spins: number;
  /** Whether the confirm deadline has passed. */
  timedOut: boolean;
  /**
   * Our own child, outside the instance cgroup and outside ours, already showing the target's own marks
   * (token, program, uid): it was placed, then moved out (a launcher writing itself into another cgroup's
   * cgroup.procs, as `systemd-run --scope` does). See movedOut.
   */
  execdOutside?: boolean;
}

export type ConfirmStep =
  | { do: 'exited' }
  | { do: 'not-ours'; why: Rejection }
  | { do: 'confirmed' }
  | { do: 'spin' }
  | { do: 'retry' }
  | { do: 'timeout' };

/**
 * The confirm loop's next step after one inspection: the pid is the target,
 * has exited, is someone else's for good, or may still exec into the marks
 * (spin on our child's empty argv, retry later, or give up at the deadline).
 */
export function decideConfirm(f: ConfirmFacts): ConfirmStep {
  if (f.gone) return { do: 'exited' };
  // Our own child may still be exec'ing whatever it shows (only an environment that may not be read stays
  // so); a reported pid that is someone else's will not become ours by waiting.
  if (f.why && PERMANENT.has(f.why) && (!f.own || f.why === 'environ')) return { do: 'not-ours', why: f.why };
  // Moved out after its exec: nothing brings it back, and waiting would end as "did not exec", which it did.
  if (f.why === 'cgroup' && f.execdOutside) return { do: 'not-ours', why: 'cgroup' };
  if (f.why === null) return { do: 'confirmed' };
  // Exec'd (clone returns only then) but its argv not laid out yet: that takes microseconds, a timer a millisecond.
  if (f.own && f.argvEmpty && f.spins < MAX_ARGV_SPINS) return { do: 'spin' };
  return f.timedOut ? { do: 'timeout' } : { do: 'retry' };
}

/**
 * Polls the pid's argv until it carries the token and every expected
 * element, and records the identity from that very inspection, under the
 * pin the inspection was made with.
 */
export async function confirm(
  a: Attempt,
  pid: number,
  deadline: number,
  timeoutMs: number,
  signal?: AbortSignal,
): Promise<void> {
  const child = spawned(a);
  const own = pid === child.pid;
  let lastArgv: string[] | null = null;
  let spins = 0;
  let everSeen = false;
  const timeout = () =>
    new ConfirmTimeoutError(a.id, pid, timeoutMs, `last argv seen: ${JSON.stringify(lastArgv).slice(0, 200)}`);
  for await (const _ of backoff({ firstMs: 0, maxMs: 20, deadline, signal })) {
    for (;;) {
      // A pid function may name a child of Node's child_process: its owner
      // reaps it, and reaping it here would rob libuv of its exit. A TID is
      // refused (ERR_CUSTODY_NOT_A_PROCESS), exhaustion thrown: only a vanished pid means "exited".
      const pinned = pin(pid, { reapIfChild: typeof a.pidSpec !== 'function', thread: 'refuse' });
      let why: Rejection | null = null;
      let execdOutside = false;
      let live: ProcessIdentity | null = null;
      if (pinned && pinned.identity.state !== 'Z') {
        live = pinned.identity;
        const claim = claimOf(a);
        const environ = pinned.environ;
        // Our own child is ours by birth: it only has to have exec'd into the
        // argv (or, in env mode, into an environment with the token: before exec
        // the child's is ours). A pid a launcher or a function reported must pass
        // the ownership rule on its own marks (token, program, uid; never the
        // launcher's fork). (A child exec'ing through a wrapper must still reach `executable`.)
        // With a cgroup our child is judged too: the js backend's placing
        // wrapper carries the target's argv before it is placed and has exec'd
        // it, and only the exec'd target in the cgroup is it. So is a child
        // given exec attributes: the js backend's wrapper that applies them
        // carries the target's argv and token until it has exec'd it.
        const judged = !own || a.cgroup || (a.exec && a.pidSpec === 'child');
        const verdict = judged ? judge(claim, live, undefined, true, environ) : null;
        why = verdict ? (verdict.ours ? null : verdict.why) : ownChildMarks(a, claim, live, environ);
        if (own && why === 'cgroup') execdOutside = movedOut(claim, live, environ);
        if (own && (why === 'token' || why === 'expect') && retitled(a, claim, live, environ, !!judged)) why = null;
      }
      const step = decideConfirm({
        own,
        gone: live === null,
        why,
        argvEmpty: pinned?.identity.argv.length === 0,
        spins,
        timedOut: Date.now() >= deadline,
        execdOutside,
      });
      if (step.do === 'confirmed' && pinned && live) {
        a.identity = live;
        if (own) {
          // Our own child: its pidfd from birth already pins it.
          pinned.handle.close();
          a.target = child;
        } else {
          a.target = pinned.handle;
        }
        return;
      }
      if (pinned) lastArgv = pinned.identity.argv;
      everSeen ||= live !== null;
      pinned?.handle.close();
      switch (step.do) {
        case 'exited': {
          // The pid is gone before it carried our argv. (Our child's status
          // comes with its reaping, at once; the bound is for the unexpected.)
          const bound = Math.max(0, deadline - Date.now()) + EXIT_STATUS_WAIT_MS;
          const reaped = own ? await within(child.exited, bound, signal) : TIMED_OUT;
          const status = reaped !== TIMED_OUT ? reaped : (child.exitStatus ?? UNKNOWN_EXIT);
          throw exitedError(a, pid, status, own ? undefined : goneBeforeConfirm(a, pid, everSeen));
        }
        case 'not-ours':
          if (step.why === 'cgroup' && own) a.childMovedOut = true;
          throw new NotOursError(a.id, pid, describeRejection(pid, step.why, cgroupsOf(a, pid)));
        case 'spin':
          spins++;
          Atomics.wait(spinCell, 0, 0, ARGV_SPIN_MS);
          continue;
        case 'timeout':
          throw timeout();
      }
      break;
    }
  }
  throw timeout();
}

/**
 * Whether our own child, the target itself, runs the very binary spawned but shows a title without the marks:
 * it exec'd the argv we gave it (clone or libuv returns the child only once exec'd, and the js wrapper shows
 * the token until its own exec) and rewrote it before this first look, as redis-server does at once on a busy
 * host. It is judged as it was exec'd; the title is what is recorded. A child that exec'd another program, or
 * one inside an exec (no argv yet), is not.
 */
function retitled(a: Attempt, claim: Claim, live: ProcessIdentity, environ: EnvironReader, judged: boolean): boolean {
  if (a.pidSpec !== 'child' || live.argv.length === 0 || !sameFile(live.exe, a.spawnedExe)) return false;
  const asExecd = { ...live, argv: [a.command, ...a.argv] };
  return judged
    ? judge(claim, asExecd, undefined, true, environ).ours
    : ownChildMarks(a, claim, asExecd, environ) === null;
}

/**
 * Whether our child, outside the instance cgroup, was moved out after its exec: it is the target by its own
 * marks, in a cgroup other than ours. The js backend's placing wrapper, not placed yet, is still in ours (and
 * runs its own program, unless the target's program is the shell itself).
 */
function movedOut(claim: Claim, live: ProcessIdentity, environ: EnvironReader): boolean {
  const where = backend.cgroupOf(live.pid);
  if (where === null || where === backend.cgroupOf(process.pid)) return false;
  return judge({ ...claim, cgroup: null }, live, undefined, true, environ).ours;
}

/** Where the pid is and where it should be, for a rejection that says it is outside the instance cgroup. */
function cgroupsOf(a: Attempt, pid: number): CgroupPlaces | undefined {
  if (!a.cgroup) return undefined;
  return { where: backend.cgroupOf(pid), instance: a.cgroup.node };
}
