/**
 * Process trees: descendants(pid) pins every descendant with a pidfd, and
 * terminateMembers() ends a set of proven members and everything that joins
 * them while it works: children (read under each parent's pin), and, where
 * custody created the instance's session, every process in it (a child
 * whose parent was killed is re-parented away, but stays in the session).
 * It rescans after SIGTERM and after SIGKILL until a scan finds nothing new
 * and every member is gone, within its bounds. Who counts as a member is
 * decided by the ownership module.
 */
import { backend } from './backend/index.js';
import { StopTimeoutError } from './errors.js';
import { ProcessHandle } from './handle.js';
import { isNoProcess, toIdentity } from './identity.js';
import { isMember, protectedPid, type Members } from './ownership.js';
import { signalNumber } from './signals.js';
import { TIMED_OUT, within } from './timing.js';
import { terminateParams, type TerminateOptions, type TerminateResult } from './terminate.js';
import { UNKNOWN_EXIT } from './signals.js';
import { assertPid } from './validate.js';

/** Pins pid if it is still a member (re-checked under the pin), else null. */
function pinMember(pid: number, members: Members, reapIfChild: boolean): ProcessHandle | null {
  if (protectedPid(pid)) return null;
  try {
    const { raw, ref } = backend.inspectPinned(pid, { reapIfChild });
    const identity = toIdentity(pid, raw, backend.bootId());
    if (isMember(identity, members)) return new ProcessHandle(ref, { identity, spawned: false });
    ref.close();
    return null;
  } catch (err) {
    if (isNoProcess(err)) return null;
    throw err;
  }
}

/**
 * Every descendant of a process, each pinned by a pidfd and proven, under
 * its pin, to be the child of the member it was found under. Callers own
 * the handles (close them).
 */
export function descendants(pid: number, options: { reapIfChild?: boolean } = {}): ProcessHandle[] {
  assertPid(pid);
  const out: ProcessHandle[] = [];
  const seen = new Set<number>([pid]);
  const queue = [pid];
  while (queue.length) {
    const parent = queue.shift()!;
    for (const child of backend.children(parent)) {
      if (seen.has(child)) continue;
      seen.add(child);
      // The children list was read before the pin: prove the link under it.
      const h = pinMember(child, { pids: new Set([parent]) }, options.reapIfChild === true);
      if (!h) continue;
      out.push(h);
      queue.push(child);
    }
  }
  return out;
}

export interface MembersOptions {
  /** More proven members to end with the roots (pinned by the caller). */
  also?: ProcessHandle[];
  /** The session custody created for the instance (its leader's pid), whose every process is a member. */
  session?: number | null;
  /** Members that become our children (as a subreaper) are reaped; for custody's own instances only. */
  reapIfChild?: boolean;
}

/** A growing set of pinned members: roots, their descendants, their session. */
class MemberSet {
  readonly all = new Map<number, ProcessHandle>();
  readonly #own = new Set<ProcessHandle>();
  readonly #session: number | null;
  readonly #reap: boolean;

  constructor(roots: ProcessHandle[], options: MembersOptions) {
    for (const r of roots) this.all.set(r.pid, r);
    this.#session = options.session ?? null;
    this.#reap = options.reapIfChild === true;
  }

  #add(h: ProcessHandle): void {
    this.all.set(h.pid, h);
    this.#own.add(h);
  }

  /**
   * Finds members not yet pinned: children of live members, and with
   * `full`, the session's members too (re-parented away from a killed
   * parent). Repeats while a pass finds some (bounded); returns how many.
   */
  grow(full: boolean): number {
    let added = 0;
    for (let pass = 0; pass < 64; pass++) {
      const before = added;
      const live = [...this.all.values()].filter((m) => !m.hasExited);
      const members: Members = { pids: new Set(live.map((m) => m.pid)), session: this.#session };
      const found = live.flatMap((m) => backend.children(m.pid));
      if (full && this.#session !== null) found.push(...backend.sessionMembers(this.#session));
      for (const pid of found) {
        if (this.all.has(pid)) continue;
        const h = pinMember(pid, members, this.#reap);
        if (h) (this.#add(h), added++);
      }
      if (added === before) break;
    }
    return added;
  }

  signal(sig: number): void {
    for (const m of this.all.values()) m.signal(sig);
  }

  allGone(): Promise<unknown> {
    return Promise.all([...this.all.values()].map((m) => m.gone));
  }

  alive(): number[] {
    return [...this.all.values()].filter((m) => m.isAlive()).map((m) => m.pid);
  }

  /** Closes the pins this set made (never the caller's roots). */
  close(): void {
    for (const h of this.#own) h.close();
  }
}

export interface MembersResult {
  /** Every member that was signalled, the roots first. */
  members: number[];
  escalated: boolean;
}

/**
 * Ends the roots and every member that joins them: TERM to all (rescanning
 * every 50 ms for children forked meanwhile) for graceMs, then KILL to all,
 * rescanning after each KILL until a scan finds nothing new and all are
 * gone, within killWaitMs (StopTimeoutError past it). A member already gone
 * is success.
 */
export async function terminateMembers(
  roots: ProcessHandle[],
  options: MembersOptions & { termSignal?: NodeJS.Signals | number; killSignal?: NodeJS.Signals | number; graceMs?: number; killWaitMs?: number; signal?: AbortSignal; onEscalate?: (info: { pid: number; graceMs: number }) => void },
): Promise<MembersResult> {
  const term = signalNumber(options.termSignal ?? 'SIGTERM');
  const kill = signalNumber(options.killSignal ?? 'SIGKILL');
  const graceMs = options.graceMs ?? 2000;
  const killWaitMs = options.killWaitMs ?? 5000;
  const set = new MemberSet(roots, options);
  try {
    // A full scan (the session) before TERM, at escalation and after each
    // KILL; between them only children, which are cheap to list.
    set.grow(true);
    set.signal(term);
    const deadline = Date.now() + graceMs;
    let escalated = false;
    for (;;) {
      const r = await within(set.allGone(), Math.min(50, Math.max(0, deadline - Date.now())), options.signal);
      // All gone, or a tick: look for members forked meanwhile. Once all are gone, the session too: a
      // child forked just before its parent died is re-parented away, but stays in the session.
      const added = set.grow(r !== TIMED_OUT);
      if (r !== TIMED_OUT && added === 0) break;
      if (added > 0) set.signal(term);
      if (Date.now() < deadline) continue;
      options.onEscalate?.({ pid: roots[0]?.pid ?? 0, graceMs });
      escalated = true;
      const killDeadline = Date.now() + killWaitMs;
      set.grow(true);
      for (;;) {
        set.signal(kill);
        const k = await within(set.allGone(), Math.min(20, Math.max(0, killDeadline - Date.now())), options.signal);
        const more = set.grow(k !== TIMED_OUT);
        if (k !== TIMED_OUT && more === 0) break;
        if (Date.now() >= killDeadline) {
          const alive = set.alive();
          if (alive.length) throw new StopTimeoutError(alive[0]!, killWaitMs);
          break;
        }
      }
      break;
    }
    return { members: [...set.all.keys()], escalated };
  } finally {
    set.close();
  }
}

export interface TreeTerminateOptions extends TerminateOptions, MembersOptions {}

export interface TreeTerminateResult extends TerminateResult {
  /** Every member of the tree, the root first. */
  members: number[];
}

/**
 * Terminates a process and all its descendants (and its session's members,
 * where one is given): see terminateMembers.
 */
export async function terminateTree(root: ProcessHandle, options: TreeTerminateOptions = {}): Promise<TreeTerminateResult> {
  const { termSignal, killSignal, graceMs, killWaitMs } = terminateParams(root, options, 'terminateTree');
  const rootWasAlive = root.isAlive();
  const r = await terminateMembers([root, ...(options.also ?? [])], { ...options, termSignal, killSignal, graceMs, killWaitMs });
  const st = root.exitStatus ?? (await within(root.exited, 50));
  const status = st === TIMED_OUT ? UNKNOWN_EXIT : st;
  return { outcome: rootWasAlive ? 'exited' : 'already-gone', escalated: r.escalated, code: status.code, signal: status.signal, members: r.members };
}
