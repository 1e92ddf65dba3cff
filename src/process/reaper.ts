/**
 * Reaping for a subreaper. With PR_SET_CHILD_SUBREAPER, every orphan among
 * our descendants is re-parented to us: QEMU's intermediate -daemonize fork
 * (already a zombie when its parent exits), a helper that double-forked away
 * from an instance. Such a child stays a zombie forever unless we reap it,
 * and we may reap only what is an instance's: never a child that Node's
 * child_process, node-pty or a worker spawned (their owners reap them), nor
 * one custody spawned (its own watcher reaps it, and keeps its status).
 *
 * A re-parented child is an instance's when it is in the cgroup of a
 * supervised instance (where it has one: nothing can be in it that the
 * instance did not fork), or in the session of one (the session custody
 * created, or the target's own session where that is not ours), or when it
 * led such a session (its pid is the session id: the fork that called setsid
 * and then forked the daemon).
 * On every SIGCHLD (and when asked), zombies that pass are reaped at once and
 * live ones are pinned so that their exit is reaped.
 */
import { backend } from '../backend/index.js';
import { inSubtree } from './cgroup-tree.js';
import { type ProcessHandle, pin } from './pin.js';

/** A supervisor's instances: the sessions their members are in, their cgroups (hierarchy paths), and the pids it already watches itself. */
type SessionSource = () => { sessions: number[]; pids: number[]; cgroups?: string[] };

const sources = new Set<SessionSource>();
const pinned = new Map<number, ProcessHandle>();
const orphanSession = new Map<number, number>();
let scheduled = false;

function members(): { sessions: Set<number>; watched: Set<number>; cgroups: Set<string> } {
  const sessions = new Set<number>();
  const watched = new Set<number>();
  const cgroups = new Set<string>();
  const ours = backend.stat(process.pid)?.session;
  for (const source of sources) {
    const { sessions: ss, pids, cgroups: cs = [] } = source();
    for (const s of ss) if (s !== ours && s > 1) sessions.add(s);
    for (const p of pids) watched.add(p);
    for (const c of cs) cgroups.add(c);
  }
  return { sessions, watched, cgroups };
}

/** Reaps or pins every re-parented child of ours that is an instance's. Returns the pids it reaped. */
export function reapMembers(): number[] {
  const reaped: number[] = [];
  if (sources.size === 0) return reaped;
  const { sessions, watched, cgroups } = members();
  if (sessions.size === 0 && cgroups.size === 0) return reaped;
  for (const pid of backend.children(process.pid)) {
    if (pinned.has(pid) || watched.has(pid) || backend.spawnedHere(pid)) continue;
    const st = backend.stat(pid);
    const inCgroup = () => {
      const where = cgroups.size > 0 ? backend.cgroupOf(pid) : null;
      return [...cgroups].some((c) => inSubtree(where, c));
    };
    if (!st || !(sessions.has(st.session) || sessions.has(pid) || inCgroup())) continue;
    if (st.state === 'Z' || st.state === 'X') {
      if (backend.reapZombie(pid)) reaped.push(pid);
      continue;
    }
    const h = pin(pid, { reapIfChild: true })?.handle.unref();
    if (!h) continue;
    pinned.set(pid, h);
    orphanSession.set(pid, st.session);
    void h.exited.then(() => {
      pinned.delete(pid);
      orphanSession.delete(pid);
      h.close();
    });
  }
  return reaped;
}

/**
 * The orphans re-parented to us that are in `session`, pinned: with a
 * subreaper, anything re-parented to us descends from something custody
 * spawned, so one in an instance's session is a member its tree no longer
 * reaches (a helper that double-forked away). Stop ends them with it.
 */
export function orphansInSession(session: number): ProcessHandle[] {
  return [...pinned].filter(([pid, h]) => orphanSession.get(pid) === session && !h.hasExited).map(([, h]) => h);
}

function onChild(): void {
  if (scheduled) return;
  scheduled = true;
  setImmediate(() => {
    scheduled = false;
    try {
      reapMembers();
    } catch {
      // EMFILE and the like: the next SIGCHLD tries again
    }
  });
}

/** A supervisor that holds the subreaper flag registers the sessions of its instances. */
export function addReaperSource(source: SessionSource): void {
  if (sources.size === 0) process.on('SIGCHLD', onChild);
  sources.add(source);
}

export function removeReaperSource(source: SessionSource): void {
  sources.delete(source);
  if (sources.size > 0) return;
  process.off('SIGCHLD', onChild);
  for (const h of pinned.values()) h.close();
  pinned.clear();
}
