/**
 * Process trees: descendants(pid) pins every descendant with a pidfd, and
 * terminateTree() signals every member through its own pidfd, re-scanning
 * for children spawned meanwhile until its bound.
 */
import { readdirSync, readFileSync } from 'node:fs';
import { backend } from './backend/index.js';
import { parseStat } from './proc.js';
import { ProcessHandle } from './handle.js';
import { toIdentity } from './identity.js';
import { TIMED_OUT, within } from './timing.js';
import { terminateParams, type TerminateOptions, type TerminateResult } from './terminate.js';
import { assertPid } from './validate.js';

/** Children of pid from /proc/<pid>/task/*\/children (every thread's), or from a ppid scan where that file does not exist. */
function childPids(pid: number): number[] {
  const out = new Set<number>();
  let tasks: string[];
  try {
    tasks = readdirSync(`/proc/${pid}/task`);
  } catch {
    return [];
  }
  let sawFile = false;
  for (const tid of tasks) {
    try {
      const text = readFileSync(`/proc/${pid}/task/${tid}/children`, 'latin1');
      sawFile = true;
      for (const c of text.split(' ')) if (c.trim()) out.add(Number(c));
    } catch {
      // thread gone, or a kernel without CONFIG_PROC_CHILDREN
    }
  }
  if (!sawFile) for (const child of scanForChildren(pid)) out.add(child);
  return [...out];
}

/** Without /proc/<pid>/task/<tid>/children (CONFIG_PROC_CHILDREN): every stat, for its ppid. */
function scanForChildren(pid: number): number[] {
  const out: number[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      if (parseStat(readFileSync(`/proc/${name}/stat`, 'latin1'))?.ppid === pid) out.push(Number(name));
    } catch {
      // gone
    }
  }
  return out;
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
    for (const child of childPids(parent)) {
      if (seen.has(child)) continue;
      seen.add(child);
      try {
        const { raw, ref } = backend.inspectPinned(child, { reapIfChild: options.reapIfChild === true });
        // The children list was read before the pin: prove the link under it.
        if (raw.ppid !== parent || raw.state === 'Z') {
          ref.close();
          continue;
        }
        out.push(new ProcessHandle(ref, { identity: toIdentity(child, raw, backend.bootId()), spawned: false }));
        queue.push(child);
      } catch {
        // gone since the listing
      }
    }
  }
  return out;
}

export interface TreeTerminateOptions extends TerminateOptions {
  /** @internal: members that become our children (as a subreaper) are reaped; for custody's own instances only. */
  reapIfChild?: boolean;
}

export interface TreeTerminateResult extends TerminateResult {
  /** Every member of the tree, the root first. */
  members: number[];
}

/**
 * Terminates a process and all its descendants: TERM to every member
 * (re-scanning each live member's children until the grace ends, so a child
 * forked meanwhile is caught), then KILL to what remains, then proven gone.
 */
export async function terminateTree(root: ProcessHandle, options: TreeTerminateOptions = {}): Promise<TreeTerminateResult> {
  const { termSignal: term, killSignal: kill, graceMs, killWaitMs } = terminateParams(root, options, 'terminateTree');
  const members = new Map<number, ProcessHandle>([[root.pid, root]]);
  const rootWasAlive = root.isAlive();
  const sweepIn = (sig: number) => {
    // Scan from every member still alive: an orphan of a dead member has a new parent, but it was pinned when first seen.
    for (const m of [...members.values()]) {
      if (m.hasExited) continue;
      for (const d of descendants(m.pid, { reapIfChild: options.reapIfChild === true })) {
        if (members.has(d.pid) || d.pid === process.pid) d.close();
        else members.set(d.pid, d);
      }
    }
    for (const m of members.values()) m.signal(sig);
  };
  const allGone = () => Promise.all([...members.values()].map((m) => m.gone));
  try {
    sweepIn(term);
    const deadline = Date.now() + graceMs;
    let escalated = false;
    for (;;) {
      const r = await within(allGone(), Math.min(50, Math.max(0, deadline - Date.now())), options.signal);
      if (r !== TIMED_OUT) {
        // The root is gone: one more scan for children forked at the very end.
        const before = members.size;
        sweepIn(term);
        if (members.size === before) break;
        continue;
      }
      if (Date.now() >= deadline) {
        options.onEscalate?.({ pid: root.pid, graceMs });
        escalated = true;
        sweepIn(kill);
        const k = await within(allGone(), killWaitMs, options.signal);
        if (k === TIMED_OUT) {
          const alive = [...members.values()].filter((m) => m.isAlive()).map((m) => m.pid);
          if (alive.length) throw Object.assign(new Error(`tree of ${root.pid}: pids ${alive.join(', ')} survived SIGKILL for ${killWaitMs} ms`), { code: 'ERR_CUSTODY_STOP_TIMEOUT' });
        }
        break;
      }
      sweepIn(term);
    }
    const st = root.exitStatus ?? (await within(root.exited, 50)) ;
    const status = st === TIMED_OUT ? { code: null, signal: null } : st;
    return { outcome: rootWasAlive ? 'exited' : 'already-gone', escalated, code: status.code, signal: status.signal, members: [...members.keys()] };
  } finally {
    for (const m of members.values()) if (m !== root) m.close();
  }
}
