/**
 * Recovery's deciders. Pure: from what has been read so far (the manifest or
 * why it could not be read, verify()'s verdict on the live process, the
 * recorded cgroup as this supervisor sees it, the ownership judgement) each
 * says where the manifest ends, or which fact to read next. Facts are read
 * only when asked for, so nothing is read that the outcome does not need;
 * the modules beside this one read them and carry the outcome out.
 */
import { errnoError, BadManifestError } from '../errors.js';
import { isTransient } from '../process/identity.js';
import type { Judgement } from '../process/ownership.js';
import { IncompleteInstanceError, type Manifest } from '../state/manifest.js';
import type { VerifyResult } from '../types.js';

/** How long recovery gives an interrupted launch to exec into its expected argv (the launch's own confirm bound). */
export const STARTING_CONFIRM_MS = 3000;
/** How long what is left of an instance proven over gets after SIGTERM before SIGKILL (abandon's default). */
export const LEFTOVER_GRACE_MS = 2000;

/** Where every manifest ends. */
export type Outcome =
  | {
      do: 'adopt';
      why: 'verified' | 'unprovable' | 'starting';
      rewrite: boolean;
      /** The recorded process, proven by its pidfs id, runs outside its instance cgroup: adopted, and warned of. */
      leftCgroup?: true;
    }
  | { do: 'repair'; field: string; reason: 'mismatch' | 'renamed' }
  | { do: 'clean'; reason: 'gone' | 'rebooted' | 'incomplete' | 'stopped'; graceMs: number }
  | { do: 'quarantine'; reason: string; field?: string; persist: boolean }
  | { do: 'defer'; error: Error };

const quarantined = (reason: string, field: string | undefined, persist: boolean): Outcome => ({
  do: 'quarantine',
  reason,
  ...(field === undefined ? {} : { field }),
  persist,
});

/** A manifest that could not be read: cleaned (an interrupted first write), deferred, quarantined, or not recovery's to judge. */
export function decideUnreadable(err: unknown): Outcome | { do: 'rethrow' } {
  // Never launched: only temp files, which must not be read as valid.
  if (err instanceof IncompleteInstanceError) return { do: 'clean', reason: 'incomplete', graceMs: 0 };
  if (!(err instanceof BadManifestError)) return { do: 'rethrow' };
  // EMFILE opening a manifest says nothing about the manifest.
  if (isTransient(err.cause)) return { do: 'defer', error: err.cause as Error };
  // Kept on disk for the operator; never deleted, never fatal to the others.
  return quarantined('bad-manifest', err.message, false);
}

/** A failure while carrying a decision out: the kernel could not answer (EMFILE, ENOMEM...), which is no verdict. */
export function decideFailure(err: unknown): Outcome | { do: 'rethrow' } {
  return isTransient(err) ? { do: 'defer', error: err as Error } : { do: 'rethrow' };
}

/** The platform recovery runs on: whether identity can be proven, and whether the supervisor adopts without proof. */
export interface Platform {
  provable: boolean;
  allowUnprovable: boolean;
}

/**
 * A manifest judged as a running one is: running, or starting with the
 * identity its launch confirmed (the agent died while readiness was
 * pending), which is as much the launch's own record of the process.
 */
export function provenLike(m: Manifest): boolean {
  return m.state === 'running' || (m.state === 'starting' && m.identity !== null);
}

/** A readable manifest: settled by its state alone, or to be proven against the live processes. */
export function decideManifest(m: Manifest, platform: Platform): Outcome | { do: 'prove' } {
  if (m.state === 'quarantined') return quarantined(m.quarantine.reason, m.quarantine.field, false);
  if (!platform.provable) {
    if (platform.allowUnprovable && provenLike(m)) return { do: 'adopt', why: 'unprovable', rewrite: false };
    return quarantined('unprovable', undefined, true);
  }
  return { do: 'prove' };
}

/** What is known so far of a running manifest's process; each fact is read only when the decider asks for it. */
export interface RunningFacts {
  /** The recorded pid, and ours. */
  pid: number;
  selfPid: number;
  /** Whether the manifest is in the current format (an older one is rewritten once proven). */
  current: boolean;
  /** A starting manifest with the confirmed identity: adopted, it is rewritten as running. */
  starting?: boolean;
  /** The declared paths, which re-prove a live argv that disagrees with the recorded one. */
  paths: string[];
  /** verify() of the recorded identity against the live process. */
  verdict?: VerifyResult;
  /**
   * Both the recorded and the live identity carry a pidfs id (verify() found them equal): the live process
   * is the recorded one, not a reuse of its pid, whatever cgroup it is in now.
   */
  pidfsId?: boolean;
  /** The recorded cgroup as this supervisor judges by it: the same one, gone, or none to judge by. */
  cgroup?: 'same' | 'gone' | 'none';
  /** The ownership rule on the live process's own marks. */
  judgement?: Judgement;
  /** The live process's argv (with the judgement). */
  liveArgv?: string[];
  /** Where the token is (an env-mode token is no part of a title, so no title change can lose it). */
  tokenMode?: 'argv' | 'env';
  /** Whether the recorded argv itself lacks the token: the record of a title that was repaired as renamed. */
  recordedTitle?: boolean;
  /** The live process runs as neither our uid nor the one the launch declared (or its target dropped to). */
  foreignUid?: boolean;
  /**
   * The recorded process was named by MAINPID= (the manifest's handedOff): a member of the instance that may
   * carry no token, and may have exec'd after it was named. Only the kernel's word proves it.
   */
  handedOff?: boolean;
}

export type RunningStep = Outcome | { do: 'read'; what: 'process' | 'cgroup' | 'ownership' };

const MISMATCH = new Set(['token', 'expect', 'exe', 'cgroup']);
/** What a program that rewrites its title (redis, a re-exec on reload) may lose of the marks it was launched with. */
const TITLE_MARKS = new Set(['token', 'expect', 'argv']);
const TITLE_MARKS_ENV_TOKEN = new Set(['expect', 'argv']);
const PID_REJECTION = new Set(['init', 'self', 'ancestor']);
/** What a main process handed off by MAINPID= may lack of the launch's marks: it never had to carry them. */
const HANDED_OFF_MARKS = new Set(['token', 'expect', 'exe', 'argv', 'program', 'environ']);

/** A running manifest: adopted, repaired, cleaned or quarantined, or the next fact to read. */
export function decideRunning(f: RunningFacts): RunningStep {
  // Our own pid is never the recorded process, whatever it shows.
  if (f.pid === f.selfPid) return quarantined('unprovable', 'pid', true);
  const v = f.verdict;
  if (!v) return { do: 'read', what: 'process' };
  switch (v.verdict) {
    case 'gone':
    case 'rebooted':
      return { do: 'clean', reason: v.verdict, graceMs: 0 };
    case 'unprovable':
      // Recorded in another pid namespace: its pid names some other process
      // here. Quarantined in memory only, so a supervisor back in that
      // namespace can still adopt it; release() is the operator's way out.
      return quarantined('unprovable', v.field, false);
    case 'unrecorded':
    case 'reused':
      return quarantined(v.verdict, v.field, true);
  }
  // Its cgroup first: an instance recorded in one must be in it (the same cgroup, by id).
  if (!f.cgroup) return { do: 'read', what: 'cgroup' };
  if (f.cgroup === 'gone') return quarantined('mismatch', 'cgroup', true);
  // Verified (or a mismatch of exe/argv with equal start ticks): it must
  // still pass the ownership rule on its own marks (token, uid, not pid 1,
  // not us or an ancestor).
  const j = f.judgement;
  if (!j) return { do: 'read', what: 'ownership' };
  // The recorded main is the instance's by identity in any cgroup: one that moved itself out of its cgroup
  // (root can) is adopted where its pidfs id proves it is the very process recorded, and stopped later
  // through its pin. Without one (js backend, kernels before 6.9) start ticks and argv are no such proof.
  if (!j.ours && j.why === 'cgroup' && v.verdict === 'ok' && f.pidfsId) return { ...adopted(f), leftCgroup: true };
  // The very process launched, by the kernel's word (its pidfs id, or its
  // instance cgroup, which nothing outside can join), under a title of its
  // own making: renamed, not a stranger. Where only start ticks match, a
  // title is not enough and the token and paths must re-prove it (below).
  // A pidfs id proves the process the record names, not that the record is ours: another uid's process is
  // never taken on a record's word for its title (the same rule as for its uid).
  const kernelProof =
    (f.pidfsId === true && f.foreignUid !== true) || (f.cgroup === 'same' && (j.ours || j.why !== 'cgroup'));
  // Its title may lack the token for good once renamed (and recorded so): the same proof takes it, for a
  // title only (another executable is no rename).
  const titleOnly = v.verdict === 'ok' ? f.recordedTitle === true : v.field === 'argv';
  const marks = f.tokenMode === 'env' ? TITLE_MARKS_ENV_TOKEN : TITLE_MARKS;
  const renamed = !j.ours && kernelProof && titleOnly && marks.has(j.why);
  // Handed off by MAINPID=, it was taken for being a member, not for its marks: the kernel's proof alone
  // takes it back as it was recorded. Another executable or title since (a launcher's fork named before its
  // exec) only by its pidfs id, never another uid's process.
  if (f.handedOff && (j.ours || HANDED_OFF_MARKS.has(j.why))) {
    if (v.verdict === 'ok' && kernelProof) return adopted(f);
    const execd = v.verdict === 'mismatch' && (v.field === 'exe' || v.field === 'argv');
    if (execd && f.pidfsId === true && f.foreignUid !== true)
      return { do: 'repair', field: v.field ?? 'exe', reason: 'renamed' };
  }
  if ((j.ours || renamed) && kernelProof && v.verdict === 'mismatch' && v.field === 'argv')
    return { do: 'repair', field: 'argv', reason: 'renamed' };
  if (!j.ours && !renamed) {
    // An environment that may not be read proves nothing: unprovable (field environ), never "no token".
    const reason = MISMATCH.has(j.why) ? 'mismatch' : 'unprovable';
    const field =
      v.verdict === 'mismatch' && reason === 'mismatch' ? v.field : PID_REJECTION.has(j.why) ? 'pid' : j.why;
    return quarantined(reason, field, true);
  }
  if (v.verdict === 'ok') return adopted(f);
  // A mismatch is re-proved by the token (judged above) and the declared paths in its live argv; start
  // ticks are never repaired.
  const argv = f.liveArgv ?? [];
  if (!f.paths.every((p) => argv.some((a) => a.includes(p)))) return quarantined('mismatch', v.field, true);
  return { do: 'repair', field: v.field ?? 'argv', reason: 'mismatch' };
}

/** A verified process adopted: a launch cut off before readiness is rewritten as running, an older format as current. */
function adopted(f: RunningFacts): Extract<Outcome, { do: 'adopt' }> {
  return f.starting
    ? { do: 'adopt', why: 'starting', rewrite: true }
    : { do: 'adopt', why: 'verified', rewrite: !f.current };
}

/** What is known so far of an interrupted launch. */
export interface StartingFacts {
  pidSource: Manifest['pidSource'];
  /** Whether the manifest names the target's program. */
  executable: boolean;
  /** The recorded cgroup: the same one, gone, or none to judge by. */
  cgroup: 'same' | 'gone' | 'none';
  /** Token carriers found (counted only where no target can be proven). */
  carriers?: number;
  /** Whether the last look found the target (undefined: not looked since the last wait). */
  found?: boolean;
  /** Candidates still worth waiting for after the last look; whether the confirm bound has passed. */
  waitable?: number;
  timedOut?: boolean;
  /** Whether the launch's own carriers (outside a cgroup) have been ended. */
  ended?: boolean;
  /** Whether the pidfile, the one thing that names a pidfile launch's target, was refused (a FIFO, a symlink, not a pid). */
  pidfileRefused?: boolean;
  /** Candidates whose environment may not be read. */
  unreadable: number;
  /**
   * Processes that may be the launch's child short of its exec: forks showing the layout of the
   * supervisor that wrote it, or ours caught inside an execve; undefined: not looked at since the last wait.
   */
  preExec?: number;
  /** Whether one of those was seen past its exec while recovery waited, and is among the launch's candidates. */
  forkExecd?: boolean;
}

export type StartingStep =
  | Outcome
  | { do: 'count-carriers' }
  | { do: 'look-forks' }
  | { do: 'look' }
  | { do: 'wait' }
  | { do: 'end-carriers' };

/**
 * An interrupted launch: its target found and adopted, or, once none can be
 * (the carriers are gone or the confirm bound passed), what is provably the
 * launch's ended and the state cleaned; quarantined where it cannot be told.
 */
export function decideStarting(f: StartingFacts): StartingStep {
  // Placed before exec, nothing of the launch ran outside its cgroup, and a
  // cgroup with a process in it cannot be removed: what of it still runs was
  // moved out (root can), and outside its cgroup nothing is signalled. Its
  // target, found by its own marks, is recorded (quarantined) rather than
  // cleaned away while it runs. (A pid function's target may live
  // elsewhere: it is looked for as without one.)
  if (f.cgroup === 'gone' && f.pidSource !== 'function') {
    if (f.pidfileRefused) return quarantined('unprovable', 'pidfile', true);
    if (f.found === undefined) return { do: 'look' };
    if (f.found) return quarantined('mismatch', 'cgroup', true);
    if (f.unreadable > 0) return quarantined('unprovable', 'environ', true);
    return { do: 'clean', reason: 'gone', graceMs: 0 };
  }
  // The launch's child may still be a fork of the dead supervisor, cut off
  // between clone and exec: no token yet, and it may exec into the target (or
  // its launcher) at any moment. Nothing is decided before it has: a clean
  // now would orphan what it becomes. Within the bound it is waited for;
  // past it the launch is deferred, never cleaned, the fork never signalled.
  // In its cgroup it is a member, looked at and ended as members are.
  if (f.cgroup !== 'same') {
    if (f.preExec === undefined) return { do: 'look-forks' };
    if (f.preExec > 0) {
      if (!f.timedOut) return { do: 'wait' };
      const detail = `${f.preExec} process(es) that may be its child had not exec'd within the confirm bound`;
      return { do: 'defer', error: errnoError('EAGAIN', 'execve', undefined, detail) };
    }
  }
  if (f.pidSource === 'function' && !f.executable) {
    // The pid came from a function recovery cannot call again, and nothing
    // else names the target's program: no carrier can be proven the target.
    if (f.carriers === undefined) return { do: 'count-carriers' };
    if (f.carriers === 0) return { do: 'clean', reason: 'gone', graceMs: LEFTOVER_GRACE_MS };
    return quarantined('unprovable', 'executable', true);
  }
  if (f.pidfileRefused) return quarantined('unprovable', 'pidfile', true);
  if (f.found === undefined) return { do: 'look' };
  if (f.found) return { do: 'adopt', why: 'starting', rewrite: true };
  if ((f.waitable ?? 0) > 0 && !f.timedOut) return { do: 'wait' };
  // A child that exec'd late in the bound left its launcher, or its pidfile, no time of its own:
  // deferred, never ended on a bound it did not have.
  if (f.forkExecd && f.timedOut) {
    const detail = "its child exec'd late in the confirm bound; its target is not found yet";
    return { do: 'defer', error: errnoError('EAGAIN', 'execve', undefined, detail) };
  }
  // Without a cgroup, carriers that never became a target (a launcher whose target never exec'd) are
  // ended as abandon would have; with one, its members are, by the clean.
  const inCgroup = f.cgroup === 'same' && f.pidSource !== 'function';
  if (!inCgroup && !f.ended) return { do: 'end-carriers' };
  // A process whose environment may not be read may be the launch's: unprovable, never "gone".
  if (f.unreadable > 0) return quarantined('unprovable', 'environ', true);
  return { do: 'clean', reason: 'gone', graceMs: LEFTOVER_GRACE_MS };
}
/** What is known so far of a stop that was cut off (a `stopping` manifest); the main process's facts as for a running one. */
export interface StoppingFacts extends RunningFacts {
  /** Whether the members the ownership rule proves have been ended (TERM, bounded wait, KILL). */
  ended?: boolean;
  /** Token carriers whose environment may not be read, found while ending. */
  unreadable?: number;
}

export type StoppingStep = RunningStep | { do: 'end-members'; main: boolean } | { do: 'end-main' };

/**
 * A stop cut off halfway (a crash, EMFILE) is finished: every member still
 * alive that the ownership rule proves is ended, then the state goes
 * (`stopped`). What cannot be proven is quarantined, as a running manifest's
 * process would be; a kernel that cannot answer defers it (decideFailure).
 */
export function decideStopping(f: StoppingFacts): StoppingStep {
  if (f.pid === f.selfPid) return quarantined('unprovable', 'pid', true);
  // The cgroup is the instance: what is in it is ended with it, whatever the main process became. One that
  // is gone held nothing any more (a populated cgroup cannot be removed): the stop had ended it all.
  if (!f.cgroup) return { do: 'read', what: 'cgroup' };
  if (f.cgroup === 'same') return stoppingInCgroup(f);
  if (f.cgroup === 'gone') return { do: 'clean', reason: 'stopped', graceMs: 0 };
  if (f.ended) {
    // A carrier whose environment may not be read may be the instance's: unprovable, never "stopped".
    if ((f.unreadable ?? 0) > 0) return quarantined('unprovable', 'environ', true);
    return { do: 'clean', reason: 'stopped', graceMs: 0 };
  }
  // Without a cgroup, the main process is judged as a running one's: proven (verified, or re-proved by its
  // token and paths), it is ended with its members; gone (the first half of the stop killed it), what it
  // left that the rule proves is; anything else is no proof, and nothing is signalled.
  const main = decideRunning(f);
  if (main.do === 'read') return main;
  if (main.do === 'adopt' || main.do === 'repair') return { do: 'end-members', main: true };
  if (main.do === 'clean' && main.reason === 'gone') return { do: 'end-members', main: false };
  return main;
}

/**
 * A stop cut off with the cgroup still there: what is in it is ended with it. The main process may have left
 * it (root can): where its pidfs id proves it is the recorded one, it is still the instance's and is ended
 * through its pin first; without that proof, outside the cgroup is a bystander's place, and nothing is signalled.
 */
function stoppingInCgroup(f: StoppingFacts): StoppingStep {
  const over: Outcome = { do: 'clean', reason: 'stopped', graceMs: LEFTOVER_GRACE_MS };
  if (f.ended) return over;
  if (!f.verdict) return { do: 'read', what: 'process' };
  if (f.verdict.verdict !== 'ok' || !f.pidfsId) return over;
  if (!f.judgement) return { do: 'read', what: 'ownership' };
  return !f.judgement.ours && f.judgement.why === 'cgroup' ? { do: 'end-main' } : over;
}
