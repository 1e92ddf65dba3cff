/**
 * Process trees: descendants(pid) pins every descendant with a pidfd, and
 * terminateMembers() ends a set of proven members and everything that joins
 * them while it works: children (read under each parent's pin), and, where
 * custody created the instance's session, every process in it (a child
 * whose parent was killed is re-parented away, but stays in the session).
 * It rescans after SIGTERM and after SIGKILL until a scan finds nothing new
 * and every member is gone, within its bounds. Who counts as a member is
 * decided by the ownership module.
 *
 * An instance with a cgroup is ended by terminateCgroup() instead: the
 * cgroup is the instance, so there is nothing to discover: SIGTERM to the
 * main process, cgroup.kill after the grace, and `populated 0` as the proof.
 */
import { backend } from '../backend/index.js';
import type { InstanceCgroup } from './cgroup.js';
import { inSubtree } from './cgroup-tree.js';
import { AbortError, StopTimeoutError } from '../errors.js';
import { exitHeld, type ProcessHandle, releaseExit } from './handle.js';
import { isMember, protectedPid, type Members } from './ownership.js';
import { pin } from './pin.js';
import { signalNumber } from './signals.js';
import { paced, sleep, TIMED_OUT, within } from '../timing.js';
import { endedResult, stillRuns, terminateParams, type StopResult, type TerminateOptions } from './terminate.js';
import { assertPid } from '../validate.js';

/** The least a session scan is waited for (a busy table's scan takes tens of ms): a stop may run this much over its bounds per full scan. */
const SESSION_SCAN_MIN_MS = 500;

/** Pins pid if it is still a member (re-checked under the pin), else null. */
function pinMember(pid: number, members: Members, reapIfChild: boolean): ProcessHandle | null {
  if (protectedPid(pid)) return null;
  const pinned = pin(pid, { reapIfChild });
  if (!pinned || isMember(pinned.identity, members)) return pinned?.handle ?? null;
  pinned.handle.close();
  return null;
}

/**
 * Whether a session custody created is still the instance's: a pinned
 * member lives in it now. A session id stays taken while any process is in
 * it, and no process can enter a session it left, so a member in it now
 * proves the session was never free since it was made. Once every process
 * left it (a daemon's own setsid, its launcher gone), the id is free and a
 * stranger that later gets that pid and calls setsid leads a session of the
 * same number: recorded at confirm, it proves nothing after.
 */
function sessionHeld(session: number, pinned: ProcessHandle[]): boolean {
  return pinned.some((m) => {
    if (m.hasExited) return false;
    const st = backend.stat(m.pid);
    // Alive after the read: the stat was the pinned process's, not a later owner's of the pid.
    return st !== null && st.session === session && m.isAlive();
  });
}

/**
 * Whether `session` is led, now, by a live member or by a member's child
 * (alive or a zombie): the fork of a daemon that called setsid, then forked
 * the daemon and exited, leaving the daemon outside every member's tree. A
 * session id is its creator's pid, and that pid stays taken while anyone is
 * in the session, so a process with that pid in that session is its
 * creator; everything in a session was forked into it, so all of it
 * descends from the instance. The member is alive after the read: the pid
 * the read named was our member's, not a later owner's.
 */
function ledByMember(session: number, live: ProcessHandle[]): boolean {
  const st = backend.stat(session);
  if (st === null || st.session !== session) return false;
  const m = live.find((h) => h.pid === session || h.pid === st.ppid);
  return m?.isAlive() === true;
}

/**
 * What an instance's main process left in the session it led, read while
 * its zombie is still unreaped (the caller holds it: holdExit): a session id
 * is its leader's pid, which nobody else can be given before the zombie is
 * reaped, so every process in the session now was forked into it from the
 * instance. Each is pinned and re-read in the session under its pin, and
 * the leader is read a zombie still after the pins, or nothing is returned.
 * The backend's scan (on the threadpool on native, in slices on this
 * thread on js) is waited for at most `scanMs`, then read on this thread in
 * one go instead. The caller ends them and closes the pins.
 */
export async function sessionLeftovers(session: number, scanMs: number): Promise<ProcessHandle[]> {
  const leaderHeld = () => {
    const st = backend.stat(session);
    return st !== null && st.session === session && (st.state === 'Z' || st.state === 'X');
  };
  if (!leaderHeld()) return [];
  let scan = await within(backend.sessionMembers(new Set([session])), scanMs);
  // The threadpool is busy (a consumer's file work, fsyncs): read on this thread instead, once, rather than
  // report the exit and leave what the main left running. The zombie is still held, so the session is still its.
  if (scan === TIMED_OUT) scan = backend.sessionMembersNow(new Set([session]));
  const out: ProcessHandle[] = [];
  try {
    for (const pid of scan) {
      if (pid === session) continue;
      const h = pinMember(pid, { pids: new Set(), session }, true);
      if (h) out.push(h);
    }
  } catch (err) {
    for (const h of out) h.close();
    throw err;
  }
  if (leaderHeld()) return out;
  for (const h of out) h.close();
  return [];
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
  for (let parent = queue.shift(); parent !== undefined; parent = queue.shift()) {
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
  /**
   * The session is known to be the instance's without a pinned member in it
   * (sessionHeld): an attempt's own, made moments ago by the child it
   * spawned, which may already have exited.
   */
  sessionProven?: boolean;
  /** Members that become our children (as a subreaper) are reaped; for custody's own instances only. */
  reapIfChild?: boolean;
  /**
   * The session's leader, held unreaped by the caller (holdExit): while it is, the session's id is taken, so
   * the session counts on every pass, members or not; once it is not, only while a pinned member is in it.
   */
  anchor?: ProcessHandle;
  /**
   * The session counts on a pass only while a pinned member is in it (or the anchor holds), never for the rest
   * of the call once proven: for members found after their session's leader was reaped (an exited main's
   * leftovers), whose last scan could otherwise find a stranger that took the leader's pid.
   */
  sessionEachPass?: boolean;
}

/** A growing set of pinned members: roots, their descendants, their session. */
class MemberSet {
  readonly all = new Map<number, ProcessHandle>();
  readonly #own = new Set<ProcessHandle>();
  readonly #session: number | null;
  /** Whether the session counts: the caller knew, or a member was seen in it during this stop (sessionHeld). */
  #sessionProven: boolean;
  readonly #callerProven: boolean;
  readonly #anchor: ProcessHandle | null;
  /** The session is proven again on every pass (an anchor, or sessionEachPass), never latched. */
  readonly #eachPass: boolean;
  /**
   * Sessions a member or a member's child was seen to lead (ledByMember), with the leader's pidfs id (for
   * reapLeaders; null where there is none); each counts only while still proven.
   */
  readonly #led = new Map<number, string | null>();
  readonly #reap: boolean;

  constructor(roots: ProcessHandle[], options: MembersOptions) {
    for (const r of roots) this.all.set(r.pid, r);
    this.#session = options.session ?? null;
    this.#sessionProven = options.sessionProven === true;
    this.#callerProven = this.#sessionProven;
    this.#anchor = options.anchor ?? null;
    this.#eachPass = this.#anchor !== null || options.sessionEachPass === true;
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
   * The session's scan runs on the threadpool on native, which anything
   * else in the process may hold (four reads of a FIFO with no writer fill
   * it), and in slices on this thread on js: it is waited for at most
   * `scanMs`, and skipped for this pass after, so a stop keeps its bounds
   * and its AbortSignal. (The children are read synchronously.)
   */
  async grow(full: boolean, scanMs = Number.POSITIVE_INFINITY, signal?: AbortSignal): Promise<number> {
    let added = 0;
    for (let pass = 0, now = 1; pass < 64 && now > 0; pass++) {
      const { found, members, live, scanned } = this.#children();
      if (full && scanned.size > 0) {
        const scan = await within(backend.sessionMembers(scanned), scanMs, signal, true);
        if (scan !== TIMED_OUT) found.push(...scan);
      }
      now = this.#admit(found, members, live);
      added += now;
    }
    return added;
  }

  /** grow(false), which reads only children (synchronously): for a paced check between full scans. */
  growChildren(): number {
    let added = 0;
    for (let pass = 0, now = 1; pass < 64 && now > 0; pass++) {
      const { found, members, live } = this.#children();
      now = this.#admit(found, members, live);
      added += now;
    }
    return added;
  }

  /** One pass's reads: the live members' children, and the sessions a full pass would scan. */
  #children(): { found: number[]; members: Members; live: ProcessHandle[]; scanned: Set<number> } {
    const live = [...this.all.values()].filter((m) => !m.hasExited);
    if (this.#session !== null && (this.#eachPass || !this.#sessionProven)) {
      this.#sessionProven = this.#sessionHoldsNow(this.#session, live);
    }
    const session = this.#sessionProven ? this.#session : null;
    const found = live.flatMap((m) => backend.children(m.pid));
    // A member's child that leads a session of its own and is no live member (a zombie is none, but still
    // leads). A live member's session needs no proof: everything in it descends from it, found by descent.
    for (const pid of found) {
      const pinned = this.all.get(pid);
      if ((pinned && !pinned.hasExited) || this.#led.has(pid) || pid === session) continue;
      if (backend.stat(pid)?.session !== pid) continue;
      // Read before the proof, so that the proof covers the process the id names.
      const id = this.#reap ? backend.pidfsIdOf(pid) : null;
      if (ledByMember(pid, live)) this.#led.set(pid, id);
    }
    const led = this.#ledNow(live);
    const members: Members = { pids: new Set(live.map((m) => m.pid)), session, ledSessions: led };
    const scanned = new Set(led);
    if (session !== null) scanned.add(session);
    return { found, members, live, scanned };
  }

  /** Pins and admits the found pids that are members, proven again under their pins; returns how many. */
  #admit(found: number[], members: Members, live: ProcessHandle[]): number {
    let added = 0;
    for (const pid of found) {
      if (this.all.has(pid)) continue;
      const h = pinMember(pid, members, this.#reap);
      if (!h) continue;
      if (!this.#stillProven(h, members.session ?? null, live)) {
        h.close();
        continue;
      }
      this.#add(h);
      added++;
    }
    return added;
  }

  /** The led sessions still proven now: by their leader (ledByMember), or by a pinned member in them (sessionHeld). */
  #ledNow(live: ProcessHandle[]): Set<number> {
    return new Set([...this.#led.keys()].filter((s) => this.#ledHolds(s, live)));
  }

  #ledHolds(session: number, live: ProcessHandle[]): boolean {
    return ledByMember(session, live) || sessionHeld(session, live);
  }

  /**
   * What admitted a newcomer must still hold after its read under its pin
   * (the pass's lists were read before, and a scan may have taken long):
   * its parent, a pinned member, is alive still (so the ppid it showed was
   * that member's, not a later owner's of the pid), or the led session it
   * is in is still proven (its id may have been freed and taken by a
   * stranger's setsid meanwhile). The custody session: as the pass found
   * it, or, where it is proven on each pass, still proven now.
   */
  #stillProven(h: ProcessHandle, session: number | null, live: ProcessHandle[]): boolean {
    const id = h.identity;
    if (!id) return false;
    if (this.all.get(id.ppid)?.isAlive() === true) return true;
    if (session !== null && id.session === session) return !this.#eachPass || this.#sessionHoldsNow(session, live);
    return this.#led.has(id.session) && this.#ledHolds(id.session, live);
  }

  /**
   * The custody session, proven now: the caller knew, its leader is held unreaped (the anchor), or a pinned
   * member is in it. Unless it is proven on each pass (an anchor, sessionEachPass), once proven it counts for
   * the rest of the stop (a leftover forked just before its parent died is found by the last scan), which
   * trusts that no stranger took its id meanwhile.
   */
  #sessionHoldsNow(session: number, live: ProcessHandle[]): boolean {
    return this.#callerProven || (this.#anchor !== null && exitHeld(this.#anchor)) || sessionHeld(session, live);
  }

  /**
   * As a subreaper, a led session's leader that died a zombie comes to us
   * when the stop kills its parent member: reaped here, once it is a zombie
   * child of ours, by the pidfs id read when it was proven (never a later
   * process given its pid, such as a child_process child of ours started in
   * the same clock tick). Without pidfs ids (Linux < 6.9) it is left to
   * whoever reaps it. Never a child custody spawned.
   */
  reapLeaders(): void {
    if (!this.#reap || this.#led.size === 0) return;
    for (const pid of zombieOrphans((pid) => this.#led.get(pid) != null)) {
      const id = this.#led.get(pid);
      if (id) backend.reapZombie(pid, id);
    }
  }

  signal(sig: number): void {
    for (const m of this.all.values()) m.signal(sig);
  }

  allGone(): Promise<unknown> {
    return Promise.all([...this.all.values()].map((m) => m.gone));
  }

  /** The members that run now, read fresh (stillRuns): what a deadline's verdict rests on. */
  running(): number[] {
    return [...this.all.values()].filter(stillRuns).map((m) => m.pid);
  }

  /**
   * Waits until every member is gone, sending `sig` to members found meanwhile: children on a paced check
   * (thousands of stops share one timer's budget), the session once all are gone (a child forked just before
   * its parent died is re-parented away, but stays in it). false: some still run, read fresh, at the deadline.
   */
  async endWithin(
    sig: number,
    deadline: number,
    scanMs: (until: number) => number,
    abort?: AbortSignal,
  ): Promise<boolean> {
    const rescan = paced(() => {
      if (this.growChildren() > 0) this.signal(sig);
      return false;
    });
    try {
      for (;;) {
        const r = await within(Promise.race([this.allGone(), rescan.done]), Math.max(0, deadline - Date.now()), abort);
        if (r === TIMED_OUT && this.running().length > 0) return false;
        const added = await this.grow(true, scanMs(deadline), abort);
        if (added > 0) this.signal(sig);
        // Members found by the paced check since allGone() was asked for are waited for in the next round.
        if (this.running().length === 0) return true;
      }
    } finally {
      rescan.cancel();
    }
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
 * Ends the roots and every member that joins them: TERM to all (children
 * forked meanwhile are found by a paced rescan and signalled too) for
 * graceMs, then KILL to all the same way, until a scan finds nothing new
 * and all are gone, within killWaitMs (StopTimeoutError past it, if a fresh
 * read still finds one running). A member already gone is success.
 */
export async function terminateMembers(
  roots: ProcessHandle[],
  options: MembersOptions & {
    termSignal?: NodeJS.Signals | number;
    killSignal?: NodeJS.Signals | number;
    graceMs?: number;
    killWaitMs?: number;
    signal?: AbortSignal;
    onEscalate?: (info: { pid: number; graceMs: number }) => void;
  },
): Promise<MembersResult> {
  const term = signalNumber(options.termSignal ?? 'SIGTERM');
  const kill = signalNumber(options.killSignal ?? 'SIGKILL');
  const graceMs = options.graceMs ?? 2000;
  const killWaitMs = options.killWaitMs ?? 5000;
  const set = new MemberSet(roots, options);
  try {
    // A full scan (the session) before TERM, at escalation and once all are gone; between them only children.
    // It may take the time left, but never less than a busy table's scan needs, nor, before TERM, more.
    const scanMs = (until: number) => Math.max(SESSION_SCAN_MIN_MS, until - Date.now());
    await set.grow(true, SESSION_SCAN_MIN_MS, options.signal);
    set.signal(term);
    // The grace is the time after SIGTERM.
    let escalated = false;
    if (!(await set.endWithin(term, Date.now() + graceMs, scanMs, options.signal))) {
      options.onEscalate?.({ pid: roots[0]?.pid ?? 0, graceMs });
      escalated = true;
      const killDeadline = Date.now() + killWaitMs;
      await set.grow(true, scanMs(killDeadline), options.signal);
      set.signal(kill);
      if (!(await set.endWithin(kill, killDeadline, scanMs, options.signal))) {
        const [alive] = set.running();
        if (alive !== undefined) throw new StopTimeoutError(alive, killWaitMs);
      }
    }
    set.reapLeaders();
    return { members: [...set.all.keys()], escalated };
  } finally {
    set.close();
  }
}

/** Options of `terminateTree()`: those of `terminate()` and which members count. */
export interface TreeTerminateOptions extends TerminateOptions, MembersOptions {}

export interface TreeTerminateResult extends StopResult {
  /** Every member of the tree, the root first. */
  members: number[];
}

/**
 * Terminates a process and all its descendants (and its session's members,
 * where one is given): see terminateMembers.
 */
export async function terminateTree(
  root: ProcessHandle,
  options: TreeTerminateOptions = {},
): Promise<TreeTerminateResult> {
  const { termSignal, killSignal, graceMs, killWaitMs } = terminateParams(root, options, 'terminateTree');
  const rootWasAlive = root.isAlive();
  // A root that leads the session and is held unreaped (a supervised main: holdExit) anchors the session
  // until its members are ended; then it is reaped, for its status.
  const anchor = options.session != null && options.session === root.pid && exitHeld(root) ? root : undefined;
  try {
    const r = await terminateMembers([root, ...(options.also ?? [])], {
      ...options,
      termSignal,
      killSignal,
      graceMs,
      killWaitMs,
      anchor,
    });
    releaseExit(root);
    return { ...(await endedResult(root, rootWasAlive, r.escalated)), members: r.members };
  } finally {
    releaseExit(root);
  }
}

export interface CgroupTerminateOptions {
  termSignal?: NodeJS.Signals | number;
  /** How long the main process(es) may take after termSignal before cgroup.kill. Default 2000. */
  graceMs?: number;
  /** How long cgroup.kill may take to empty the cgroup. Default 5000. */
  killWaitMs?: number;
  /** Aborted midway: cgroup.kill now, the bounded wait for empty, then AbortError. */
  signal?: AbortSignal;
  onEscalate?: (info: { pid: number; graceMs: number }) => void;
  /** Kill member by member through pins, as on a kernel without cgroup.kill (< 5.14). Chosen by the caller from capabilities. */
  killEach?: boolean;
}

export interface CgroupTerminateResult {
  /** The grace passed with a main process still running: cgroup.kill ended it. */
  escalated: boolean;
  /** Processes still in the cgroup once every main process had gone, ended by cgroup.kill. */
  leftovers: number[];
}

/**
 * Ends an instance that has a cgroup. A frozen cgroup is thawed first (a
 * frozen process never acts on SIGTERM). termSignal goes to the main
 * process(es) `roots` (the instance's own program, which ends its children
 * its own way); the grace lasts until the cgroup is empty, or every root is
 * gone, or graceMs; then whatever is still in the cgroup gets cgroup.kill
 * (a fork racing it cannot escape: the kernel kills the cgroup as a whole),
 * and `populated 0` in cgroup.events, within killWaitMs, is the proof that
 * every process of the instance is gone (StopTimeoutError past it).
 * Members re-parented to us as a subreaper are reaped. The caller removes
 * the cgroup and then the state.
 */
export async function terminateCgroup(
  cg: InstanceCgroup,
  roots: ProcessHandle[],
  options: CgroupTerminateOptions = {},
): Promise<CgroupTerminateResult> {
  const term = signalNumber(options.termSignal ?? 'SIGTERM');
  const graceMs = options.graceMs ?? 2000;
  const killWaitMs = options.killWaitMs ?? 5000;
  const abort = options.signal;
  if (abort?.aborted) throw new AbortError(abort.reason);
  if (cg.freezeRequested()) await cg.thaw();
  let aborted: AbortError | null = null;
  for (const r of roots) r.signal(term);
  // Read fresh (stillRuns), not from the exit watch a busy loop may not have heard yet.
  const rootsGone = () => !roots.some(stillRuns);
  // A root is the instance's by its pin in any cgroup: one that moved itself out (root can) is not
  // proven gone by an empty cgroup, and is waited for, and killed, through its pin.
  const rootOutside = () => roots.some((r) => !r.hasExited && outside(r, cg));
  const rootsExit = Promise.all(roots.map((r) => r.gone));
  // The roots' exits come as events; an emptied cgroup is polled, paced with every other stop's.
  const emptied = paced(() => !cg.populated() && !rootOutside());
  try {
    await within(Promise.race([rootsExit, emptied.done]), graceMs, abort);
  } catch (err) {
    if (!(err instanceof AbortError)) throw err;
    aborted = err;
  } finally {
    emptied.cancel();
  }
  let escalated = false;
  let leftovers: number[] = [];
  if (cg.populated() || rootOutside()) {
    const mainAlive = !rootsGone();
    if (mainAlive) {
      escalated = true;
      options.onEscalate?.({ pid: roots[0]?.pid ?? cg.procs()[0] ?? 0, graceMs });
    } else leftovers = cg.procs();
    await killAll(cg, roots, killWaitMs, options.killEach === true);
  }
  // Gone, not merely signalled: a root outside the cgroup (an adopted main that left it) is waited for too.
  const rootsLeft = await within(rootsExit, killWaitMs);
  if (rootsLeft === TIMED_OUT && !rootsGone()) throw new StopTimeoutError(roots.find(stillRuns)?.pid ?? 0, killWaitMs);
  reapOrphans(cg, roots);
  if (aborted) throw aborted;
  return { escalated, leftovers };
}

/** Whether a pinned process runs outside the cgroup's subtree: read by pid, then the pin says the pid was still its. */
function outside(h: ProcessHandle, cg: InstanceCgroup): boolean {
  const where = backend.cgroupOf(h.pid);
  return where !== null && !inSubtree(where, cg.node) && h.isAlive();
}

/** cgroup.kill (or, without it, a kill through each member's pin), SIGKILL to the roots, then populated 0 within killWaitMs. */
async function killAll(cg: InstanceCgroup, roots: ProcessHandle[], killWaitMs: number, each: boolean): Promise<void> {
  const deadline = Date.now() + killWaitMs;
  const kill = signalNumber('SIGKILL');
  for (const r of roots) r.signal(kill);
  if (each || !cg.kill()) {
    // Member by member: each pid is pinned and proven in the cgroup under
    // its pin before the signal; a fork racing the listing is found by the
    // next pass (a killed process forks no more), until the cgroup is empty.
    for (let pass = 0; cg.populated() && Date.now() < deadline; pass++) {
      for (const pid of cg.procs()) {
        const h = pinMember(pid, { pids: new Set(), cgroup: cg.node }, true);
        if (!h) continue;
        h.signal(kill);
        h.close();
      }
      await sleep(Math.min(pass < 8 ? 1 : 10, Math.max(0, deadline - Date.now())));
    }
  }
  if (!(await cg.waitEmpty(Math.max(0, deadline - Date.now())))) {
    throw new StopTimeoutError(cg.procs()[0] ?? roots[0]?.pid ?? 0, killWaitMs);
  }
}

/**
 * Members that were re-parented to us (we are a subreaper) and were killed
 * are our zombies now, and must be reaped before the cgroup is removed (a
 * zombie names its cgroup in /proc/<pid>/cgroup only while the cgroup
 * exists): reap the ones the cgroup proves were the instance's. Never a
 * root (its pin reaps it, with its status), never a child custody spawned
 * (its watcher does), never without the subreaper flag (then every child of
 * ours is someone's spawn: child_process's, on the js backend).
 */
function reapOrphans(cg: InstanceCgroup, roots: ProcessHandle[]): void {
  const own = new Set(roots.map((r) => r.pid));
  for (const pid of zombieOrphans((pid) => !own.has(pid)))
    if (inSubtree(backend.cgroupOf(pid), cg.node)) backend.reapZombie(pid);
}

/**
 * Our children that `accept` takes, that no spawn of ours made (its watcher
 * reaps those), and that are zombies now: what re-parenting brought us. Only
 * as a subreaper; otherwise every child of ours is someone's spawn
 * (child_process's, on the js backend). `accept` runs before any stat.
 */
function zombieOrphans(accept: (pid: number) => boolean): number[] {
  if (backend.childSubreaper() !== true) return [];
  return backend.children(process.pid).filter((pid) => {
    if (!accept(pid) || backend.spawnedHere(pid)) return false;
    const st = backend.stat(pid);
    return st !== null && (st.state === 'Z' || st.state === 'X');
  });
}
