/**
 * Ownership: is this live process one of an instance's, and why. The one
 * place that decides it, for confirm, abandon, recovery of an interrupted
 * launch, tree stop, subreaper reaping and sweep.
 *
 * A token in argv is a name, not a proof: an operator's `tail -f
 * <token>.log`, another uid's process that copied it, or a launcher's fork
 * before exec all carry it. So, strongest proof first:
 * 0. never pid 1, ourselves, or an ancestor of ours (whatever it carries);
 * 1. the instance's cgroup, where it has one (cgroup v2, src/process/cgroup.ts):
 *    custody placed its child there before exec, so everything of the
 *    instance is in it (or in a cgroup a member made below it: a cgroup is
 *    a tree) and nothing else can be. Inside it: ours (the target
 *    among the members is still the one with the target's marks); outside
 *    it: a bystander, whatever it carries. Nothing below is asked;
 * 2. descent: its parent, read under its own pin, is a proven member, or it
 *    is in the session custody created for the instance (a session id stays
 *    taken while any member of the session lives, so no stranger can be in
 *    it; callers pass the session only while a pinned member is in it, see
 *    sessionHeld in src/process/tree.ts), or in a session a member or a member's
 *    child leads (a daemon's fork that called setsid: everything in it was
 *    forked from it): an instance's children carry no token;
 * 3. otherwise the token AND the expected program (the executable's
 *    dev/inode, or the exact argv) AND our uid (runAs.uid where the launch
 *    ran it as another, or the one the launch declared) AND our pid
 *    namespace, and never the launcher's own program.
 *    The token is in argv, or, for programs with a fixed argv (`token:
 *    'env'`), CUSTODY_TOKEN in the initial environment, which the caller
 *    reads under its pin and this module parses; an environment that may not
 *    be read proves nothing either way (`environ`: unprovable, never "no token").
 * Nothing here signals; callers act on the judgement and report rejections.
 */
import { backend } from '../backend/index.js';
import { inSubtree } from './cgroup-tree.js';
import { isNoProcess } from './identity.js';
import type { ProcessIdentity } from '../types.js';

export interface DevIno {
  dev: number;
  ino: number;
}

/** Where a launch put its token: in argv (default), or CUSTODY_TOKEN in the initial environment. */
export type TokenMode = 'argv' | 'env';

/** The variable a `token: 'env'` launch sets. */
export const TOKEN_VAR = 'CUSTODY_TOKEN';

/** How much of an environment is read for the token (custody puts it first; a launcher may not). */
export const ENVIRON_MAX_BYTES = 256 * 1024;

/** What an instance's process must show to be taken for it. */
export interface Claim {
  token: string;
  /** Where the token is proven from; argv when absent. */
  tokenMode?: TokenMode;
  /** argv elements it must carry besides the token. */
  expect: readonly string[];
  /** What the target runs: an executable, the exact argv, or unknown (a launcher's target without `executable`). */
  program: { exe: DevIno } | { argv: readonly string[] } | null;
  /** A launcher's own program: a process still running it is the launcher (or its fork before exec), never the target. */
  launcherExe: DevIno | null;
  /** The uid the target runs as: ours unless the launch declared another (a launcher that drops privileges). */
  uid: number | null;
  /** The uid the launch started its child as (LaunchSpec.runAs), which replaces ours in the rule; null: ours. */
  runAsUid?: number | null;
  /** The instance cgroup's hierarchy path (as /proc/<pid>/cgroup names it), where the instance has one: rule 1. */
  cgroup?: string | null;
}

/** Who is known to be the instance's already, for the descent rule. */
export interface Members {
  /** Proven members' pids (pinned by the caller while it uses them). */
  pids: ReadonlySet<number>;
  /** The session custody created for the instance (setsid), if any. */
  session?: number | null;
  /**
   * Sessions a member, or a member's child, leads: made by the instance, so everything in one descends from it.
   * Callers pass one only while they can prove it (ledByMember and sessionHeld in src/process/tree.ts).
   */
  ledSessions?: ReadonlySet<number>;
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
  | 'environ'
  | 'cgroup';
export type Judgement =
  | { ours: true; by: 'cgroup' | 'descent' | 'session' | 'token' }
  | { ours: false; why: Rejection };

export const sameFile = (a: DevIno | null | undefined, b: DevIno | null | undefined) =>
  !!a && !!b && a.dev === b.dev && a.ino === b.ino;
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

/** Rule 1 on its own: inside the cgroup (in it or in a cgroup below it), outside it, or gone. */
function inCgroup(live: ProcessIdentity, cgroup: string): true | 'cgroup' | 'gone' {
  const where = cgroupOfLive(live);
  return where === null ? 'gone' : inSubtree(where, cgroup) ? true : 'cgroup';
}

/**
 * Reads a process's environment, under the pin the identity was read with (backend.readEnviron). Throws
 * EACCES/EPERM where it may not be read and ESRCH when the process is gone.
 */
export type EnvironReader = () => Buffer;

/**
 * The value of CUSTODY_TOKEN in an environment block (NUL-separated KEY=value, as /proc/<pid>/environ has
 * it): the first occurrence, as getenv finds it; null when there is none.
 */
export function envToken(environ: Buffer): string | null {
  const key = Buffer.from(`${TOKEN_VAR}=`);
  for (let at = 0; at < environ.length; ) {
    let end = environ.indexOf(0, at);
    if (end === -1) end = environ.length;
    if (end - at >= key.length && environ.subarray(at, at + key.length).equals(key)) {
      return environ.subarray(at + key.length, end).toString('latin1');
    }
    at = end + 1;
  }
  return null;
}

/** The env-mode token check: 'environ' where it may not be read, 'gone' for a process that left meanwhile. */
function envMark(token: string, environ: EnvironReader | undefined): Rejection | null {
  if (!environ) return 'environ';
  let block: Buffer;
  try {
    block = environ();
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code;
    if (code === 'EACCES' || code === 'EPERM') return 'environ';
    if (isNoProcess(err)) return 'gone';
    throw err;
  }
  return envToken(block) === token ? null : 'token';
}

/**
 * Whether a live process shows the launch's marks: its token (in argv, or in the environment for an env-mode
 * claim) and every expected argv element. null when it does, else why not.
 */
export function tokenMarks(claim: Claim, live: ProcessIdentity, environ?: EnvironReader): Rejection | null {
  return argvMarks(claim, live) ?? (claim.tokenMode === 'env' ? envMark(claim.token, environ) : null);
}

/** The argv's part of the marks: the token inside any element (argv mode), every expected element exactly. */
function argvMarks(claim: Claim, live: ProcessIdentity): Rejection | null {
  // No argv: inspected inside an execve (its new exe shown, its argv and environment not laid out yet) or in
  // its exit. It carries no token, in either mode: an environment read after the inspection may be the
  // exec's, laid out since, and would prove an identity that has no argv (the one recorded, then refused
  // as a mismatch at recovery). Whoever asks again once the exec is done gets the argv with the token.
  if (live.argv.length === 0) return 'token';
  if (claim.tokenMode !== 'env' && !live.argv.some((a) => a.includes(claim.token))) return 'token';
  if (!claim.expect.every((e) => live.argv.includes(e))) return 'expect';
  return null;
}

/**
 * Whether `uid` is one the claim's target may run as: the uid the launch ran it as (runAs.uid, else ours), or
 * the one it declared for a launcher that drops privileges. Off Linux (no getuid) every uid is.
 */
export function expectedUid(claim: Pick<Claim, 'uid' | 'runAsUid'>, uid: number): boolean {
  const started = claim.runAsUid ?? process.getuid?.();
  return started === undefined || uid === started || uid === claim.uid;
}

/**
 * Rule 3 without descent: is this live process the instance's target by its
 * own marks? Inside the instance's cgroup uid and namespace are moot (it is
 * ours already); the marks still tell the target from its launcher and members.
 */
function byToken(
  claim: Claim,
  live: ProcessIdentity,
  reported: boolean,
  environ: EnvironReader | undefined,
  inside = false,
): Judgement {
  // Where it cannot be told (null), it is not proven ours either.
  const ourNs = backend.ownPidNs();
  if (!inside && ourNs !== null && live.processPidNs !== ourNs) return { ours: false, why: 'namespace' };
  if (!inside && !expectedUid(claim, live.uid)) return { ours: false, why: 'uid' };
  const marks = argvMarks(claim, live);
  if (marks) return { ours: false, why: marks };
  const program = claim.program;
  if (program && 'exe' in program) {
    if (!sameFile(live.exe, program.exe)) return { ours: false, why: 'exe' };
  } else if (program && 'argv' in program) {
    if (!sameArgv(live.argv, program.argv)) return { ours: false, why: 'argv' };
  }
  if (
    sameFile(live.exe, claim.launcherExe) &&
    !(program && 'exe' in program && sameFile(program.exe, claim.launcherExe))
  ) {
    return { ours: false, why: 'launcher' };
  }
  // Without a program to compare, the token alone is a name anyone can
  // carry: only a pid the launch itself was handed (a pidfile, a pid
  // function) may be taken on it.
  if (!program && !reported) return { ours: false, why: 'program' };
  // Last: the environment is read only of a process that fits the program.
  if (claim.tokenMode === 'env') {
    const why = envMark(claim.token, environ);
    if (why) return { ours: false, why };
  }
  return { ours: true, by: 'token' };
}

/**
 * Judges one live process, read under a pin the caller holds. `members`
 * enables the descent rule (for a tree, an abandon, a reap); without it only
 * the process's own marks count (for choosing a target). `reported`: the
 * pid came from the launch's own pid source (pidfile, pid function).
 * `environ` reads the process's environment under the same pin: an env-mode
 * claim cannot be met without it.
 */
export function judge(
  claim: Claim,
  live: ProcessIdentity,
  members?: Members,
  reported = false,
  environ?: EnvironReader,
): Judgement {
  const guarded = protectedPid(live.pid);
  if (guarded) return { ours: false, why: guarded };
  if (dead(live.state)) return { ours: false, why: 'gone' };
  const cgroup = claim.cgroup ?? members?.cgroup;
  if (cgroup) {
    const r = inCgroup(live, cgroup);
    if (r !== true) return { ours: false, why: r };
    return members ? { ours: true, by: 'cgroup' } : byToken(claim, live, reported, environ, true);
  }
  if (members) {
    if (members.pids.has(live.ppid)) return { ours: true, by: 'descent' };
    if (inMemberSession(live, members)) return { ours: true, by: 'session' };
  }
  return byToken(claim, live, reported, environ);
}

/** A member by cgroup (where the instance has one: nothing else then), or else by descent or session (processes that carry no token). */
export function isMember(live: ProcessIdentity, members: Members): boolean {
  if (protectedPid(live.pid) || dead(live.state)) return false;
  if (members.cgroup) return inCgroup(live, members.cgroup) === true;
  return members.pids.has(live.ppid) || inMemberSession(live, members);
}

/** In the session custody created, or in one a member (or a member's child) leads. */
function inMemberSession(live: ProcessIdentity, members: Members): boolean {
  return (
    (members.session != null && live.session === members.session) || members.ledSessions?.has(live.session) === true
  );
}

/** For a `cgroup` rejection: the cgroup the process is in (null: gone meanwhile) and the instance's, as /proc/<pid>/cgroup names them. */
export interface CgroupPlaces {
  where: string | null;
  instance: string;
}

/** The message a rejection event carries; a `cgroup` one names both cgroups where the caller read them. */
export function describeRejection(pid: number, why: Rejection, cgroups?: CgroupPlaces): string {
  const text: Record<Rejection, string> = {
    init: 'it is pid 1',
    self: 'it is this process',
    ancestor: 'it is an ancestor of this process',
    gone: 'it has exited',
    namespace: 'it is in another pid namespace',
    uid: 'it runs as another uid',
    token: 'it does not carry the launch token',
    environ: 'its environment, where the token would be, cannot be read (another uid, or not dumpable): unprovable',
    expect: 'it lacks an expected argument',
    exe: 'it runs another executable',
    argv: 'its argv is not the launched argv',
    launcher: "it still runs the launcher's program (a fork before exec)",
    program: 'the launch named no executable to prove it by (give LaunchSpec.executable)',
    cgroup: !cgroups
      ? "it is not in the instance's cgroup"
      : cgroups.where === null
        ? `it is not in the instance's cgroup ${cgroups.instance}`
        : `it is in cgroup ${cgroups.where}, outside the instance's cgroup ${cgroups.instance}`,
  };
  return `pid ${pid} is not taken for the instance: ${text[why]}`;
}

/**
 * Token candidates from one process-table scan: every argv element's runs of
 * 32+ lowercase hex digits, each 32-digit window a key. One pass over all
 * argv bytes, then O(1) per token looked up (recovery of many interrupted
 * launches must not scan the table once per launch).
 */
export function indexByToken<T extends { argv: string[] }>(
  rows: Iterable<T>,
  wanted: ReadonlySet<string>,
): Map<string, T[]> {
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
          const list = out.get(key);
          if (list) list.push(row);
          else out.set(key, [row]);
        }
      }
    }
  }
  return out;
}

/**
 * For env-mode launches, which rows of a process-table scan are worth reading the environment of: the launched
 * argv itself (the target with pid 'child', or a launcher and its forks), or a process whose argv[0] names the
 * `executable` (path or file name). Every other process is passed over: its environment is never read.
 */
export function mayCarryEnvToken(
  argv: readonly string[],
  launched: readonly string[],
  executable: string | null,
): boolean {
  if (argv.length === launched.length && argv.every((a, i) => a === launched[i])) return true;
  const first = argv[0];
  if (!executable || first === undefined) return false;
  const base = (p: string) => p.slice(p.lastIndexOf('/') + 1);
  return first === executable || base(first) === base(executable);
}
