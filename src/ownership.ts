/**
 * Ownership: is this live process one of an instance's, and why. The one
 * place that decides it, for confirm, abandon, recovery of an interrupted
 * launch, tree stop, subreaper reaping and sweep.
 *
 * A token in argv is a name, not a proof: an operator's `tail -f
 * <token>.log`, another uid's process that copied it, or a launcher's fork
 * before exec all carry it. So, strongest proof first:
 * 0. never pid 1, ourselves, or an ancestor of ours (whatever it carries);
 * 1. the instance's cgroup, where it has one (cgroup v2, src/cgroup.ts):
 *    custody placed its child there before exec, so everything of the
 *    instance is in it and nothing else can be. In it: ours (the target
 *    among the members is still the one with the target's marks); outside
 *    it: a bystander, whatever it carries. Nothing below is asked;
 * 2. descent: its parent, read under its own pin, is a proven member, or it
 *    is in the session custody created for the instance (a session id stays
 *    taken while any member of the session lives, so no stranger can be in
 *    it): an instance's children carry no token;
 * 3. otherwise the token AND the expected program (the executable's
 *    dev/inode, or the exact argv) AND our uid (or the one the launch
 *    declared) AND our pid namespace, and never the launcher's own program.
 * Nothing here signals; callers act on the judgement and report rejections.
 */
import { backend } from './backend/index.js';
import { ownPidNs } from './backend/procview.js';
import type { ProcessIdentity } from './types.js';

export interface DevIno {
  dev: number;
  ino: number;
}

/** What an instance's process must show to be taken for it. */
export interface Claim {
  token: string;
  /** argv elements it must carry besides the token. */
  expect: readonly string[];
  /** What the target runs: an executable, the exact argv, or unknown (a launcher's target without `executable`). */
  program: { exe: DevIno } | { argv: readonly string[] } | null;
  /** A launcher's own program: a process still running it is the launcher (or its fork before exec), never the target. */
  launcherExe: DevIno | null;
  /** The uid the target runs as: ours unless the launch declared another (a launcher that drops privileges). */
  uid: number | null;
  /** The instance cgroup's hierarchy path (as /proc/<pid>/cgroup names it), where the instance has one: rule 1. */
  cgroup?: string | null;
}

/** Who is known to be the instance's already, for the descent rule. */
export interface Members {
  /** Proven members' pids (pinned by the caller while it uses them). */
  pids: ReadonlySet<number>;
  /** The session custody created for the instance (setsid), if any. */
  session?: number | null;
  /** The instance cgroup's hierarchy path: where it is given, membership is being in it, and nothing else. */
  cgroup?: string | null;
}

export type Rejection =
  | 'init'
  | 'self'
  | 'ancestor'
  | 'gone'
  | 'namespace'
  | 'uid'
  | 'token'
  | 'expect'
  | 'exe'
  | 'argv'
  | 'launcher'
  | 'program'
  | 'cgroup';
export type Judgement = { ours: true; by: 'cgroup' | 'descent' | 'session' | 'token' } | { ours: false; why: Rejection };

const sameFile = (a: DevIno | null | undefined, b: DevIno | null | undefined) => !!a && !!b && a.dev === b.dev && a.ino === b.ino;
const dead = (state: string) => state === 'Z' || state === 'X';

let ancestorCache: { at: number; pids: Set<number> } | undefined;

/** Our ancestors, parent first up to (not including) pid 1. Cached briefly: they change only when a parent dies. */
export function ourAncestors(): ReadonlySet<number> {
  const now = Date.now();
  if (ancestorCache && now - ancestorCache.at < 200) return ancestorCache.pids;
  const pids = new Set<number>();
  for (let pid = process.ppid, hops = 0; pid > 1 && hops < 4096; hops++) {
    pids.add(pid);
    const st = backend.stat(pid);
    if (!st) break;
    pid = st.ppid;
  }
  ancestorCache = { at: now, pids };
  return pids;
}

/** Why a pid may never be signalled, adopted or reaped by custody whatever it carries, or null. */
export function protectedPid(pid: number): 'init' | 'self' | 'ancestor' | null {
  if (pid === 1) return 'init';
  if (pid === process.pid) return 'self';
  if (ourAncestors().has(pid)) return 'ancestor';
  return null;
}

/** Whether an argv carries the token (inside any element) and every expected element exactly. */
export function carries(argv: readonly string[], token: string, expect: readonly string[]): boolean {
  return argv.some((a) => a.includes(token)) && expect.every((e) => argv.includes(e));
}

function sameArgv(a: readonly string[], b: readonly string[]): boolean {
  return a.length === b.length && a.every((v, i) => v === b[i]);
}

/**
 * The cgroup a pinned process is in, read now; null when it has exited (or
 * the pid is another process's since the pin was read: the start ticks
 * are checked after the read).
 */
function cgroupOfLive(live: ProcessIdentity): string | null {
  const where = backend.cgroupOf(live.pid);
  const st = backend.stat(live.pid);
  return st && st.startTicks === live.startTicks && !dead(st.state) ? where : null;
}

/** Rule 1 on its own: in the cgroup, outside it, or gone. */
function inCgroup(live: ProcessIdentity, cgroup: string): true | 'cgroup' | 'gone' {
  const where = cgroupOfLive(live);
  return where === null ? 'gone' : where === cgroup ? true : 'cgroup';
}

/**
 * Rule 3 without descent: is this live process the instance's target by its
 * own marks? Inside the instance's cgroup uid and namespace are moot (it is
 * ours already); the marks still tell the target from its launcher and members.
 */
function byToken(claim: Claim, live: ProcessIdentity, reported: boolean, inside = false): Judgement {
  const ours = process.getuid?.();
  if (!inside && live.pidNs !== null && ownPidNs() !== null && live.pidNs !== ownPidNs()) return { ours: false, why: 'namespace' };
  if (!inside && ours !== undefined && live.uid !== ours && live.uid !== claim.uid) return { ours: false, why: 'uid' };
  if (!live.argv.some((a) => a.includes(claim.token))) return { ours: false, why: 'token' };
  if (!claim.expect.every((e) => live.argv.includes(e))) return { ours: false, why: 'expect' };
  const program = claim.program;
  if (program && 'exe' in program) {
    if (!sameFile(live.exe, program.exe)) return { ours: false, why: 'exe' };
  } else if (program && 'argv' in program) {
    if (!sameArgv(live.argv, program.argv)) return { ours: false, why: 'argv' };
  }
  if (sameFile(live.exe, claim.launcherExe) && !(program && 'exe' in program && sameFile(program.exe, claim.launcherExe))) {
    return { ours: false, why: 'launcher' };
  }
  // Without a program to compare, the token alone is a name anyone can
  // carry: only a pid the launch itself was handed (a pidfile, a pid
  // function) may be taken on it.
  if (!program && !reported) return { ours: false, why: 'program' };
  return { ours: true, by: 'token' };
}

/**
 * Judges one live process, read under a pin the caller holds. `members`
 * enables the descent rule (for a tree, an abandon, a reap); without it only
 * the process's own marks count (for choosing a target). `reported`: the
 * pid came from the launch's own pid source (pidfile, pid function).
 */
export function judge(claim: Claim, live: ProcessIdentity, members?: Members, reported = false): Judgement {
  const guarded = protectedPid(live.pid);
  if (guarded) return { ours: false, why: guarded };
  if (dead(live.state)) return { ours: false, why: 'gone' };
  const cgroup = claim.cgroup ?? members?.cgroup;
  if (cgroup) {
    const r = inCgroup(live, cgroup);
    if (r !== true) return { ours: false, why: r };
    return members ? { ours: true, by: 'cgroup' } : byToken(claim, live, reported, true);
  }
  if (members) {
    if (members.pids.has(live.ppid)) return { ours: true, by: 'descent' };
    if (members.session != null && live.session === members.session) return { ours: true, by: 'session' };
  }
  return byToken(claim, live, reported);
}

/** A member by cgroup (where the instance has one: nothing else then), or else by descent or session (processes that carry no token). */
export function isMember(live: ProcessIdentity, members: Members): boolean {
  if (protectedPid(live.pid) || dead(live.state)) return false;
  if (members.cgroup) return inCgroup(live, members.cgroup) === true;
  return members.pids.has(live.ppid) || (members.session != null && live.session === members.session);
}

/** The message a rejection event carries. */
export function describeRejection(pid: number, why: Rejection): string {
  const text: Record<Rejection, string> = {
    init: 'it is pid 1',
    self: 'it is this process',
    ancestor: 'it is an ancestor of this process',
    gone: 'it has exited',
    namespace: 'it is in another pid namespace',
    uid: 'it runs as another uid',
    token: 'it does not carry the launch token',
    expect: 'it lacks an expected argument',
    exe: 'it runs another executable',
    argv: 'its argv is not the launched argv',
    launcher: "it still runs the launcher's program (a fork before exec)",
    program: 'the launch named no executable to prove it by (give LaunchSpec.executable)',
    cgroup: "it is not in the instance's cgroup",
  };
  return `pid ${pid} is not taken for the instance: ${text[why]}`;
}

/**
 * Token candidates from one process-table scan: every argv element's runs of
 * 32+ lowercase hex digits, each 32-digit window a key. One pass over all
 * argv bytes, then O(1) per token looked up (recovery of many interrupted
 * launches must not scan the table once per launch).
 */
export function indexByToken<T extends { argv: string[] }>(rows: Iterable<T>, wanted: ReadonlySet<string>): Map<string, T[]> {
  const out = new Map<string, T[]>();
  if (wanted.size === 0) return out;
  const hex = /[0-9a-f]{32,}/g;
  for (const row of rows) {
    const seen = new Set<string>();
    for (const arg of row.argv) {
      if (arg.length < 32) continue;
      hex.lastIndex = 0;
      for (let m = hex.exec(arg); m; m = hex.exec(arg)) {
        const run = m[0];
        for (let i = 0; i + 32 <= run.length; i++) {
          const key = run.slice(i, i + 32);
          if (!wanted.has(key) || seen.has(key)) continue;
          seen.add(key);
          let list = out.get(key);
          if (!list) out.set(key, (list = []));
          list.push(row);
        }
      }
    }
  }
  return out;
}
