/**
 * Recovery after a restart. Every manifest ends in exactly one of adopted,
 * repaired, cleaned, quarantined or deferred, with a reason and, where a
 * field decided, the field. Nothing unproven is ever signalled: quarantine
 * only records.
 *
 * Cost: the manifests are read once; interrupted launches are found by
 * token in ONE process-table scan per recover(), indexed by token, and only
 * candidates are inspected (under a pin) after it. An env-mode launch's
 * token is in environments: from the same scan, only the processes whose
 * argv fits the launch have theirs read. Ownership is decided by the
 * ownership module, as at launch.
 *
 * Instance cgroups: an adopted instance gets its recorded cgroup back (the
 * same directory, the same cgroup id); an interrupted launch's candidates
 * are the members of its cgroup, never a token carrier outside it; the
 * leftovers of an instance whose main process is gone are ended with it. A
 * cgroup of this supervisor's that no manifest names is removed when empty,
 * and reported (never signalled) when something runs in it.
 */
import { statSync } from 'node:fs';
import { fsPath } from '../bytes.js';
import { backend, capabilities } from '../backend/index.js';
import type { PidRef, ProcEntry, RawIdentity } from '../backend/types.js';
import type { CgroupRoot, InstanceCgroup } from '../process/cgroup.js';
import { BadManifestError, BadPidfileError, errnoError } from '../errors.js';
import type { Emit } from '../events.js';
import { ProcessHandle, resolveExecutable } from '../process/handle.js';
import { isNoProcess, isTransient, toIdentity, verify } from '../process/identity.js';
import { startedAtMs } from '../process/proc.js';
import { environOf } from '../lifecycle/launch.js';
import {
  describeRejection,
  envToken,
  indexByToken,
  isMember,
  judge,
  mayCarryEnvToken,
  type Claim,
  type DevIno,
  type Judgement,
} from '../process/ownership.js';
import { removeDeclaredPaths } from '../state/paths.js';
import { readPidfile } from '../lifecycle/pidfile.js';
import {
  IncompleteInstanceError,
  MANIFEST_VERSION,
  type Manifest,
  type QuarantinedManifest,
  type RunningManifest,
  type StartingManifest,
  type StateStore,
} from '../state/store.js';
import { terminateCgroup, terminateMembers } from '../process/tree.js';
import { backoff } from '../timing.js';
import type { ProcessIdentity, VerifyResult } from '../types.js';

export interface RecoveryEntry {
  id: string;
  pid?: number;
  reason?: string;
  field?: string;
}

export interface RecoveryReport {
  adopted: RecoveryEntry[];
  repaired: RecoveryEntry[];
  cleaned: RecoveryEntry[];
  quarantined: RecoveryEntry[];
  /** Not decided now (the kernel could not answer: EMFILE, ENOMEM, EIO...); a later recover() decides them. */
  deferred: Array<RecoveryEntry & { error: Error }>;
}

/** The few things recovery needs from its supervisor: no more. */
export interface RecoveryHost {
  readonly store: StateStore;
  readonly emit: Emit;
  /** Adopt without proof where the platform cannot prove identity (a warning each time). */
  readonly allowUnprovable: boolean;
  /** The supervisor's cgroup root, where it has one. */
  readonly cgroups: CgroupRoot | null;
  /** Whether a cgroup (by path) belongs to an instance the supervisor tracks or is launching right now. */
  usesCgroup(path: string): boolean;
  /** Whether recovery should (re)consider this id: not tracked, or deferred earlier. */
  wants(id: string): boolean;
  adopt(manifest: RunningManifest, handle: ProcessHandle, cgroup: InstanceCgroup | null): void;
  quarantine(id: string, manifest: Manifest | null, reason: string, field?: string): void;
  defer(id: string, error: Error): void;
  /** Recovery cleaned this id's state (or found none of custody's): a deferral of it is over. */
  forget(id: string): void;
}

/** A process read under a pin; `environ` reads its environment under the same pin. */
type Pinned = { identity: ProcessIdentity; handle: ProcessHandle; environ: () => Buffer };

function pin(pid: number): Pinned | null {
  let pinned: { raw: RawIdentity; ref: PidRef };
  try {
    pinned = backend.inspectPinned(pid, { reapIfChild: true });
  } catch (err) {
    if (isNoProcess(err)) return null;
    throw err;
  }
  return pinnedOf(pid, pinned);
}

function pinnedOf(pid: number, { raw, ref }: { raw: RawIdentity; ref: PidRef }): Pinned {
  try {
    const identity = toIdentity(pid, raw, backend.bootId());
    return { identity, handle: new ProcessHandle(ref, { identity }), environ: environOf(ref) };
  } catch (err) {
    ref.close();
    throw err;
  }
}

/** Whether a pinned process has not been reaped: signal 0 through its pin; EPERM (another uid's) proves it is there. */
function stillThere(ref: PidRef): boolean {
  try {
    return ref.signal(0);
  } catch {
    return true;
  }
}

/** Pids per batch of pins taken ahead, and batches on the threadpool at once (see PinsAhead). */
const PIN_BATCH = 128;
const PIN_BATCHES_IN_FLIGHT = 2;

/**
 * The pins of the recorded pids of running manifests, taken ahead, in the
 * order recovery will want them, in batches on the backend's threadpool:
 * each is tens of microseconds of /proc reads, thousands of them at a
 * restart, done while this thread reads manifests and decides. A pin taken
 * ahead is what pin() would have read then, and the pidfd keeps it the same
 * process; one whose process has been reaped since is read again, now, as
 * pin() reads (its pid may be someone else's by then). A few batches at a
 * time: what is taken ahead holds a pidfd per live process until taken.
 */
class PinsAhead {
  readonly #pending = new Map<number, Promise<{ raw: RawIdentity; ref: PidRef } | Error>>();
  readonly #batches: number[][] = [];
  readonly #pinMany: NonNullable<typeof backend.inspectPinnedMany> | undefined;

  /** Where the backend reads only on this thread, nothing is taken ahead: pin() reads each when it is wanted. */
  constructor(pids: readonly number[]) {
    this.#pinMany = backend.inspectPinnedMany?.bind(backend);
    if (!this.#pinMany) return;
    const unique = [...new Set(pids)];
    for (let k = 0; k < unique.length; k += PIN_BATCH) this.#batches.push(unique.slice(k, k + PIN_BATCH));
    for (let k = 0; k < PIN_BATCHES_IN_FLIGHT; k++) this.#next();
  }

  #next(): void {
    const batch = this.#batches.shift();
    if (!batch || !this.#pinMany) return;
    const rows = this.#pinMany(batch, { reapIfChild: true });
    void rows.then(
      () => this.#next(),
      () => this.#next(),
    );
    batch.forEach((pid, k) => {
      const row = rows.then((r) => r[k] as { raw: RawIdentity; ref: PidRef } | Error);
      // Taken or not, never an unhandled rejection: take() and close() see the error.
      row.catch(() => {});
      this.#pending.set(pid, row);
    });
  }

  /** The pin of pid as pin() reads it; undefined where none was taken ahead (or it was taken already). */
  async take(pid: number): Promise<Pinned | null | undefined> {
    const row = this.#pending.get(pid);
    if (!row) return undefined;
    this.#pending.delete(pid);
    const r = await row;
    if (r instanceof Error) {
      if (isNoProcess(r)) return null;
      throw r;
    }
    if (!stillThere(r.ref)) {
      r.ref.close();
      return pin(pid);
    }
    return pinnedOf(pid, r);
  }

  /** Releases every pin not taken, once its batch is in. */
  async close(): Promise<void> {
    this.#batches.length = 0;
    const rest = [...this.#pending.values()];
    this.#pending.clear();
    for (const row of rest) {
      const r = await row.catch((err: unknown) => err as Error);
      if (!(r instanceof Error)) r.ref.close();
    }
  }
}

function fileId(path: string | null, env: NodeJS.ProcessEnv = process.env): DevIno | null {
  if (!path) return null;
  try {
    const st = statSync(fsPath(path.includes('/') ? path : resolveExecutable(path, env)));
    return { dev: st.dev, ino: st.ino };
  } catch {
    return null;
  }
}

/** What the manifest's target must show: as the launch judged it (src/lifecycle/launch.ts claimOf). */
function targetClaim(m: Manifest): Claim {
  const exe = fileId(m.executable);
  return {
    token: m.token,
    expect: m.expect,
    program: exe ? { exe } : m.pidSource === 'child' ? { argv: [m.command, ...m.args] } : null,
    launcherExe: m.pidSource === 'child' ? null : fileId(m.command),
    uid: m.uid ?? null,
    tokenMode: m.tokenMode ?? 'argv',
  };
}

/** The launcher custody spawned (or its fork before exec): exactly the recorded argv. */
function launcherClaim(m: Manifest): Claim {
  const tokenMode = m.tokenMode ?? 'argv';
  const program = { argv: [m.command, ...m.args] };
  return { token: m.token, expect: [], program, launcherExe: null, uid: m.uid ?? null, tokenMode };
}

/**
 * What of a scan may be a fork of a supervisor that has not become its program yet: by image, the
 * processes that showed one of the images asked for (never this process); and every process caught
 * inside an execve, which shows no argv and no layout at all, so whose fork it was cannot be told.
 */
interface Forks {
  byImage: Map<string, number[]>;
  inExec: ProcEntry[];
}

function forksOf(rows: ProcEntry[]): Forks {
  const out: Forks = { byImage: new Map(), inExec: [] };
  for (const row of rows) {
    if (row.pid === process.pid || row.kernelThread) continue;
    if (row.image !== undefined) out.byImage.set(row.image, [...(out.byImage.get(row.image) ?? []), row.pid]);
    else if (inExec(row)) out.inExec.push(row);
  }
  return out;
}

/** Cleaned instances' removals under way at once: enough to keep libuv's threadpool (4 threads) fed, few enough to leave it to the scan and the pins. */
const REMOVALS_IN_FLIGHT = 8;

/** The most layouts one scan compares (native/scan.cc kMaxImages). */
const MAX_SCAN_IMAGES = 1 << 16;

/** How much earlier than its manifest's createdAt a launch's child may seem to start: btime is whole seconds. */
const START_SLACK_MS = 2000;

/**
 * Whether a process caught inside an execve may be this launch's child: it
 * runs as we do (a fork has its supervisor's uid until its exec), or as the
 * launch's uid, and started no earlier than the launch did. A process of
 * another uid, or an old one that lost its argv for good (stuck in its exit,
 * one that unmapped it), is no launch's child and holds nothing up.
 */
function mayBeChildOf(row: ProcEntry, m: Manifest, bootMs: number | null): boolean {
  if (row.uid !== process.geteuid?.() && row.uid !== m.uid) return false;
  return bootMs === null || startedAtMs(row.startTicks, bootMs) >= Date.parse(m.createdAt) - START_SLACK_MS;
}

/** No argv while alive, and no kernel thread: inside an execve (or an exit) for now. */
const inExec = (row: ProcEntry) =>
  row.argv.length === 0 && row.state !== 'Z' && row.state !== 'X' && row.kernelThread !== true;

/** Env tokens found in one scan: CUSTODY_TOKEN's value -> pids, and the processes whose environment may not be read. */
interface EnvIndex {
  byToken: Map<string, number[]>;
  unreadable: ProcEntry[];
}

/**
 * Reads, under a pin, the environment of each scanned process that fits one of the env-mode launches (its
 * argv is the launch's, or its argv[0] names the executable), once however many launches it fits; every
 * other process's environment is never read.
 */
function envIndex(rows: ProcEntry[], launches: Manifest[]): EnvIndex {
  const out: EnvIndex = { byToken: new Map(), unreadable: [] };
  if (launches.length === 0) return out;
  const fits = launches.map((m) => ({ launched: [m.command, ...m.args], executable: m.executable }));
  for (const row of rows) {
    if (!fits.some((f) => mayCarryEnvToken(row.argv, f.launched, f.executable))) continue;
    const p = pin(row.pid);
    if (!p) continue;
    try {
      const token = envToken(p.environ());
      if (token !== null) out.byToken.set(token, [...(out.byToken.get(token) ?? []), row.pid]);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'EACCES' || code === 'EPERM') out.unreadable.push(row);
      else if (!isNoProcess(err)) throw err;
    } finally {
      p.handle.close();
    }
  }
  return out;
}

/** How long recovery gives an interrupted launch to exec into its expected argv (the launch's own confirm bound). */
export const STARTING_CONFIRM_MS = 3000;
/** How long what is left of an instance proven over gets after SIGTERM before SIGKILL (abandon's default). */
const LEFTOVER_GRACE_MS = 2000;

/*
 * Decision and effect. The deciders below are pure: from what was read (the
 * manifest or why it could not be read, the verdict on the live process, the
 * cgroup, the ownership judgement) they say what recovery does with the
 * manifest, or which fact they need read next. recover() reads those facts in
 * that order and carries the outcome out (signals, removals, writes, events);
 * it decides nothing itself.
 */

/** Where every manifest ends. */
export type Outcome =
  | { do: 'adopt'; why: 'verified' | 'unprovable' | 'starting'; rewrite: boolean }
  | { do: 'repair'; field: string }
  | { do: 'clean'; reason: 'gone' | 'rebooted' | 'incomplete'; graceMs: number }
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

/** A readable manifest: settled by its state alone, or to be proven against the live processes. */
export function decideManifest(m: Manifest, platform: Platform): Outcome | { do: 'prove' } {
  if (m.state === 'quarantined') return quarantined(m.quarantine.reason, m.quarantine.field, false);
  if (!platform.provable) {
    if (platform.allowUnprovable && m.state === 'running') return { do: 'adopt', why: 'unprovable', rewrite: false };
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
  /** The declared paths, which re-prove a live argv that disagrees with the recorded one. */
  paths: string[];
  /** verify() of the recorded identity against the live process. */
  verdict?: VerifyResult;
  /** The recorded cgroup as this supervisor judges by it: the same one, gone, or none to judge by. */
  cgroup?: 'same' | 'gone' | 'none';
  /** The ownership rule on the live process's own marks. */
  judgement?: Judgement;
  /** The live process's argv (with the judgement). */
  liveArgv?: string[];
}

export type RunningStep = Outcome | { do: 'read'; what: 'process' | 'cgroup' | 'ownership' };

const MISMATCH = new Set(['token', 'expect', 'exe', 'cgroup']);
const PID_REJECTION = new Set(['init', 'self', 'ancestor']);

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
  if (!j.ours) {
    // An environment that may not be read proves nothing: unprovable (field environ), never "no token".
    const reason = MISMATCH.has(j.why) ? 'mismatch' : 'unprovable';
    const field =
      v.verdict === 'mismatch' && reason === 'mismatch' ? v.field : PID_REJECTION.has(j.why) ? 'pid' : j.why;
    return quarantined(reason, field, true);
  }
  if (v.verdict === 'ok') return { do: 'adopt', why: 'verified', rewrite: !f.current };
  // A mismatch is re-proved by the token (judged above) and the declared paths in its live argv; start
  // ticks are never repaired.
  const argv = f.liveArgv ?? [];
  if (!f.paths.every((p) => argv.some((a) => a.includes(p)))) return quarantined('mismatch', v.field, true);
  return { do: 'repair', field: v.field ?? 'argv' };
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
  // Placed before exec, nothing of the launch ran outside its cgroup, and
  // a cgroup with a process in it cannot be removed: none is left. (A pid
  // function's target may live elsewhere: it is looked for as without one.)
  if (f.cgroup === 'gone' && f.pidSource !== 'function') return { do: 'clean', reason: 'gone', graceMs: 0 };
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

export async function recover(host: RecoveryHost): Promise<RecoveryReport> {
  const report: RecoveryReport = { adopted: [], repaired: [], cleaned: [], quarantined: [], deferred: [] };
  // A read error propagates: open() fails and the next open retries.
  const { emit, store } = host;
  const platform: Platform = { provable: capabilities().proc, allowUnprovable: host.allowUnprovable };

  const quarantine = async (id: string, m: Manifest | null, o: Extract<Outcome, { do: 'quarantine' }>) => {
    const { reason, field } = o;
    const pid = m?.identity?.pid;
    if (m && o.persist && m.state !== 'quarantined') {
      const at = new Date().toISOString();
      const q: QuarantinedManifest = {
        ...m,
        state: 'quarantined',
        quarantine: { reason, ...(field ? { field } : {}), at },
        updatedAt: at,
      };
      try {
        await store.write(q);
        m = q;
      } catch (err) {
        emit('warning', { id, message: `could not persist the quarantine of ${id}: ${(err as Error).message}` });
      }
    }
    host.quarantine(id, m, reason, field);
    const entry: RecoveryEntry = { id, ...(pid ? { pid } : {}), reason, ...(field ? { field } : {}) };
    report.quarantined.push(entry);
    emit('quarantine', {
      ...entry,
      message: `${id} quarantined: ${reason}${field ? ` (${field})` : ''}; it will not be signalled`,
    });
    return entry;
  };

  // Cleaned instances' state is removed on the threadpool, a few at a time, while the next manifests are
  // judged; they share one fsync of the state dir, once all are removed. An instance is reported cleaned
  // once its state is gone; a removal that fails is deferred (transient) or fails recover(), as before.
  let unsynced = false;
  const removing = new Set<Promise<void>>();
  let removalFailure: { error: unknown } | undefined;
  const clean = async (m: Manifest, o: Extract<Outcome, { do: 'clean' }>, pid?: number) => {
    // Whatever is left in its cgroup is provably the instance's, which is over: ended first, then the cgroup goes.
    await endCgroup(m, o.graceMs);
    removeDeclaredPaths(m.paths, emit, m.id);
    while (removing.size >= REMOVALS_IN_FLIGHT) await Promise.race(removing);
    unsynced = true;
    const removal: Promise<void> = store
      .remove(m.id, { sync: false })
      .then(
        () => {
          const entry: RecoveryEntry = { id: m.id, ...(pid ? { pid } : {}), reason: o.reason };
          host.forget(m.id);
          report.cleaned.push(entry);
          emit('clean', { ...entry, message: `${m.id}: ${o.reason}; state cleaned, nothing signalled` });
        },
        (err: unknown) => {
          const failed = decideFailure(err);
          if (failed.do === 'defer') defer(m.id, failed.error);
          else removalFailure ??= { error: err };
        },
      )
      .finally(() => removing.delete(removal));
    removing.add(removal);
  };

  const adopt = (m: RunningManifest, handle: ProcessHandle, cg: InstanceCgroup | null, reason?: string) => {
    host.adopt(m, handle, cg);
    report.adopted.push({ id: m.id, pid: handle.pid, ...(reason ? { reason } : {}) });
  };

  const defer = (id: string, error: Error) => {
    // Nothing was signalled or removed; a later recover() decides.
    host.defer(id, error);
    const entry = { id, reason: (error as NodeJS.ErrnoException).code ?? 'transient', error };
    report.deferred.push(entry);
    emit('warning', {
      id,
      reason: entry.reason,
      message: `${id}: recovery deferred (${error.message}); call recover() again`,
    });
  };

  // Decide, then act: every manifest is read before anything is done.
  const ids = store.ids().filter((id) => host.wants(id));
  const read = await store.readMany(ids);
  const manifests = ids.map(
    (id, k): { id: string; m: Manifest; err?: undefined } | { id: string; m?: undefined; err: unknown } => {
      const r = read[k];
      return r instanceof Error ? { id, err: r } : { id, m: r as Manifest };
    },
  );
  // One scan for all interrupted launches, indexed by their tokens: argv tokens from the argv of every
  // process; env tokens from the environments of the processes that fit an env-mode launch, each read once.
  const starting = manifests.flatMap((e) => (e.m?.state === 'starting' ? [e.m] : []));
  const startingTokens = new Set(starting.flatMap((m) => (m.tokenMode === 'env' ? [] : [m.token])));
  const envLaunches = starting.filter((m) => m.tokenMode === 'env');
  // The same scan finds the forks of the supervisors that wrote them, by their address-space layout.
  // At most as many as a scan compares (one per dead supervisor): past that, only the in-exec rule holds.
  const images = [...new Set(starting.flatMap((m) => (m.forkImage ? [m.forkImage] : [])))].slice(0, MAX_SCAN_IMAGES);
  let scan: Promise<{ index: Map<string, ProcEntry[]>; env: EnvIndex; forks: Forks }> | undefined;
  const scanned = () =>
    (scan ??= backend.listProcesses(undefined, images).then((rows) => ({
      index: indexByToken(rows, startingTokens),
      env: envIndex(rows, envLaunches),
      forks: forksOf(rows),
    })));
  const carriersOf = async (m: Manifest): Promise<number[]> => {
    const { index, env } = await scanned();
    if (m.tokenMode !== 'env') return (index.get(m.token) ?? []).map((p) => p.pid);
    // An environment that cannot be read may be this launch's: the rule decides (unprovable), never the scan.
    const launched = [m.command, ...m.args];
    const unreadable = env.unreadable.filter((p) => mayCarryEnvToken(p.argv, launched, m.executable)).map((p) => p.pid);
    return [...(env.byToken.get(m.token) ?? []), ...unreadable];
  };

  // Forks are taken from the first scan only (a later scan of a busy host would catch new execs), and
  // each one's exec or exit costs one more scan, whichever launches follow it.
  let firstScan: ReturnType<typeof scanned> | undefined;
  const settledForks = new Set<number>();
  // Read once a recover(): a clock stepped since an earlier one moves it.
  let bootMs: number | null | undefined;
  /** What may be the launch's child short of its exec at the first scan: a fork of the supervisor that wrote it, or one of ours inside an execve. */
  const unexecd = async (m: Manifest): Promise<Set<number>> => {
    firstScan ??= scanned();
    const { forks } = await firstScan;
    // The supervisor that wrote it, if it still runs, shows its own layout: it is no fork of itself.
    const byImage = ((m.forkImage && forks.byImage.get(m.forkImage)) || []).filter((pid) => pid !== m.supervisorPid);
    bootMs ??= backend.bootTimeMs();
    const inExec = forks.inExec.filter((row) => mayBeChildOf(row, m, bootMs ?? null)).map((row) => row.pid);
    return new Set([...byImage, ...inExec]);
  };

  // One confirm bound for every interrupted launch, from the first one looked at: all were
  // interrupted by the same crash, and a bystander carrying each token (anyone may read one
  // in /proc) would otherwise hold open() for a bound per manifest.
  let startingDeadline: number | undefined;

  // Per interrupted env-mode launch: the candidates whose environment may not be read.
  const unreadableEnv = new Map<string, Set<number>>();
  const unreadableOf = (m: Manifest) => {
    let set = unreadableEnv.get(m.id);
    if (!set) {
      set = new Set();
      unreadableEnv.set(m.id, set);
    }
    return set;
  };

  // Off this thread from here on: the scan the interrupted launches will want, and the pins of the
  // running instances' recorded pids, in the order they come below.
  if (starting.length > 0) scanned().catch(() => {});
  const ahead = new PinsAhead(
    platform.provable ? manifests.flatMap((e) => (e.m?.state === 'running' ? [e.m.identity.pid] : [])) : [],
  );
  try {
    for (const entry of manifests) {
      try {
        if (entry.m) await recoverOne(entry.m);
        else await unreadable(entry.id, entry.err);
      } catch (e) {
        const o = decideFailure(e);
        if (o.do !== 'defer') throw e;
        defer(entry.id, o.error);
      }
    }
  } finally {
    await ahead.close();
    await Promise.allSettled(removing);
  }
  if (removalFailure) throw removalFailure.error;
  if (unsynced) await store.syncDir();
  if (host.cgroups) await unnamedCgroups(host.cgroups);
  return report;

  /**
   * The recorded cgroup as this supervisor can judge by it: the same
   * directory with the same id; 'gone' where it is no more (nothing can run
   * outside a cgroup it was placed in, and a populated cgroup cannot be
   * removed); null where there is none to judge by: none was recorded, or it
   * is not this supervisor's root's (opened without one, or with another).
   */
  function cgroupOf(m: Manifest): InstanceCgroup | 'gone' | null {
    if (!m.cgroup) return null;
    const root = host.cgroups;
    if (!root?.owns(m.cgroup.path)) {
      emit('warning', {
        id: m.id,
        message: `${m.id}: its cgroup ${m.cgroup.path} is not under this supervisor's cgroup root; judged without it`,
      });
      return null;
    }
    return root.find(m.cgroup) ?? 'gone';
  }

  /** Ends what is in an instance's cgroup (SIGTERM and graceMs first, where given) and removes it. */
  async function endCgroup(m: Manifest, graceMs: number): Promise<void> {
    const cg = m.cgroup && host.cgroups?.owns(m.cgroup.path) ? host.cgroups.find(m.cgroup) : null;
    if (!cg) return;
    const left = cg.procs();
    if (cg.populated()) {
      const roots = graceMs > 0 ? left.flatMap((pid) => memberPin(pid, cg)) : [];
      try {
        await terminateCgroup(cg, roots, {
          graceMs,
          onEscalate: ({ pid }) =>
            emit('escalate', {
              id: m.id,
              pid,
              message: `pid ${pid} in the cgroup of ${m.id} ignored SIGTERM; cgroup.kill`,
            }),
        });
      } finally {
        for (const h of roots) h.close();
      }
      emit('warning', {
        id: m.id,
        pids: left,
        message: `${m.id}: ${left.length} process(es) left in its cgroup were ended with it`,
      });
    }
    await cg.remove();
  }

  /** A pin on a pid proven (under the pin) to be in the cgroup; [] when it is not, or gone. */
  function memberPin(pid: number, cg: InstanceCgroup): ProcessHandle[] {
    const p = pin(pid);
    if (p && isMember(p.identity, { pids: new Set(), cgroup: cg.node })) return [p.handle];
    p?.handle.close();
    return [];
  }

  /**
   * Cgroups of this supervisor's that no manifest names (one deleted by
   * hand, or a crash between creating a cgroup and writing its manifest):
   * removed when empty; reported, and left alone, when something runs in it.
   */
  async function unnamedCgroups(root: CgroupRoot): Promise<void> {
    const named = new Set<string>();
    for (const id of store.ids()) {
      try {
        const m = store.read(id);
        if (m.cgroup) named.add(m.cgroup.path);
      } catch {
        // an unreadable manifest names nothing: its cgroup, if populated, is reported below
      }
    }
    for (const cg of root.list()) {
      if (named.has(cg.path) || host.usesCgroup(cg.path)) continue;
      if (!cg.populated()) {
        await cg.remove(0).catch(() => {});
        continue;
      }
      emit('warning', {
        pids: cg.procs(),
        cgroup: cg.path,
        message: `cgroup ${cg.path} holds processes but no manifest names it: left alone, nothing signalled`,
      });
    }
  }

  async function unreadable(id: string, err: unknown): Promise<void> {
    const o = decideUnreadable(err);
    switch (o.do) {
      case 'rethrow':
        throw err;
      case 'defer':
        throw o.error;
      case 'quarantine': {
        // The decoder's message is the report's field only: the event and the table say the reason.
        const entry = await quarantine(id, null, { ...o, field: undefined });
        entry.field = o.field;
        return;
      }
      case 'clean': {
        // Nothing of custody's there (files a user left): nothing to report.
        const { removed } = await store.remove(id);
        host.forget(id);
        if (!removed) return;
        report.cleaned.push({ id, reason: 'incomplete' });
        emit('clean', {
          id,
          reason: 'incomplete',
          message: `${id}: an interrupted first write left no manifest; nothing was ever spawned; cleaned`,
        });
        return;
      }
      default:
        throw new Error(`recovery cannot ${o.do} an unreadable manifest`);
    }
  }

  async function recoverOne(m: Manifest): Promise<void> {
    const o = decideManifest(m, platform);
    if (o.do === 'quarantine') {
      await quarantine(m.id, m, o);
      return;
    }
    if (o.do === 'adopt' && m.state === 'running') {
      const { id } = m;
      const pid = m.identity.pid;
      adopt(m, new ProcessHandle(backend.unproven(pid), { identity: null }), null, 'unprovable');
      emit('warning', {
        id,
        pid,
        message: `${id} adopted without proof: this platform cannot verify process identity (allowUnprovable)`,
      });
      return;
    }
    if (m.state === 'starting') return recoverStarting(m);
    if (m.state === 'running') return recoverRunning(m);
  }

  async function recoverRunning(m: RunningManifest): Promise<void> {
    const id = m.id;
    const recorded = m.identity;
    const f: RunningFacts = {
      pid: recorded.pid,
      selfPid: process.pid,
      current: m.version === MANIFEST_VERSION,
      paths: m.paths,
    };
    let live: Pinned | null = null;
    let cg: InstanceCgroup | null = null;
    let kept = false;
    try {
      for (;;) {
        const step = decideRunning(f);
        if (step.do !== 'read') return await act(step);
        if (step.what === 'process') {
          const early = await ahead.take(recorded.pid);
          live = early === undefined ? pin(recorded.pid) : early;
          f.verdict = verify(recorded, live?.identity ?? null);
        } else if (step.what === 'cgroup') {
          const c = cgroupOf(m);
          cg = c === 'gone' ? null : c;
          f.cgroup = c === 'gone' ? 'gone' : c ? 'same' : 'none';
        } else {
          if (!live) throw new Error(`recovery of ${id}: ownership asked for without a live process`);
          // The recorded executable, not the launch's argv: a repaired argv is re-proved by the token and paths.
          const exe = fileId(m.executable);
          const claim: Claim = {
            ...targetClaim(m),
            program: exe ? { exe } : null,
            launcherExe: null,
            cgroup: cg?.node ?? null,
          };
          // The recorded identity is the launch's own record of the pid: as good as a pid it was handed.
          f.judgement = judge(claim, live.identity, undefined, true, live.environ);
          f.liveArgv = live.identity.argv;
        }
      }
    } finally {
      if (!kept) live?.handle.close();
    }

    async function act(o: Outcome): Promise<void> {
      if (o.do === 'clean') return clean(m, o, recorded.pid);
      if (o.do === 'quarantine') {
        await quarantine(id, m, o);
        return;
      }
      if (!live || (o.do !== 'adopt' && o.do !== 'repair')) throw new Error(`recovery of ${id} cannot ${o.do}`);
      kept = true;
      if (o.do === 'adopt') {
        // Proven: an older format is rewritten in the current one.
        if (o.rewrite) {
          await store.write(m).catch((err: unknown) =>
            emit('warning', {
              id,
              message: `could not rewrite ${id}'s manifest in the current format: ${(err as Error).message}`,
            }),
          );
        }
        adopt(m, live.handle, cg);
        emit('adopt', { id, pid: recorded.pid, message: `${id} (pid ${recorded.pid}) adopted: identity verified` });
        return;
      }
      const repaired: RunningManifest = {
        ...m,
        identity: { ...live.identity, startTicks: recorded.startTicks },
        updatedAt: new Date().toISOString(),
      };
      try {
        await store.write(repaired);
      } catch (err) {
        kept = false;
        throw err;
      }
      host.adopt(repaired, live.handle, cg);
      report.repaired.push({ id, pid: recorded.pid, reason: 'mismatch', field: o.field });
      emit('repair', {
        id,
        pid: recorded.pid,
        field: o.field,
        message: `${id}: recorded ${o.field} disagreed with the live process; re-proved by its token and paths and rewritten`,
      });
    }
  }

  /**
   * A supervisor died mid-launch. The target is found as launch would have
   * found it: from the pidfile (pidfile launches), else among the token's
   * carriers, judged by the same rule as confirm (a launcher or its fork is
   * never taken for its target; a carrier the rule rejects is left alone).
   * Carriers that never become a target within the confirm bound (a
   * launcher whose target never exec'd) are ended as abandon would have,
   * only where they are provably custody's launcher or target.
   */
  async function recoverStarting(m: StartingManifest): Promise<void> {
    const c = cgroupOf(m);
    const group = c === 'gone' ? null : c;
    const inside = m.pidSource !== 'function' ? group : null;
    const target: Claim = { ...targetClaim(m), cgroup: inside?.node ?? null };
    const f: StartingFacts = {
      pidSource: m.pidSource,
      executable: !!m.executable,
      cgroup: c === 'gone' ? 'gone' : c ? 'same' : 'none',
      unreadable: 0,
    };
    startingDeadline ??= Date.now() + STARTING_CONFIRM_MS;
    const waits = backoff({ firstMs: 5, maxMs: 100, deadline: startingDeadline });
    await waits.next();
    // With a cgroup the candidates are its members: a token carrier outside it is a bystander, never one.
    let candidates: number[] | null = null;
    let chosen: Pinned | null = null;
    let forks: Set<number> | null = null;
    // Which of them were seen past their exec, still running.
    const execd = new Set<number>();
    try {
      for (;;) {
        f.unreadable = unreadableOf(m).size;
        const step = decideStarting(f);
        switch (step.do) {
          case 'count-carriers':
            f.carriers = (await carriersOf(m)).length;
            break;
          case 'look-forks': {
            forks ??= await unexecd(m);
            const image = m.forkImage ?? '';
            let rescan = false;
            for (const pid of [...forks]) {
              const stage = backend.execStage(pid, image);
              if (stage === 'fork' || stage === 'exec') continue;
              forks.delete(pid);
              if (stage === 'done') execd.add(pid);
              // Past its exec, or gone (what it exec'd into may have forked the target and exited): the
              // scan predates it, so the carriers are read again, once, by whichever launch asks next.
              if (settledForks.has(pid)) continue;
              settledForks.add(pid);
              rescan = true;
            }
            if (rescan) scan = undefined;
            f.preExec = forks.size;
            f.timedOut = Date.now() >= startingDeadline;
            break;
          }
          case 'look': {
            const looked: number[] = candidates ?? (inside ? inside.procs() : await carriersOf(m));
            try {
              chosen = await findTarget(m, target, looked, inside !== null);
            } catch (err) {
              // Launch would have failed on it; recovery cannot tell what it named: kept, never signalled.
              if (!(err instanceof BadPidfileError)) throw err;
              f.pidfileRefused = true;
              break;
            }
            f.found = chosen !== null;
            if (chosen) break;
            if (inside) {
              candidates = inside.procs();
              f.waitable = candidates.length;
            } else {
              // Only the candidates (and what they forked since) are looked at again, never the whole table.
              const live = looked.filter((pid) => backend.stat(pid) !== null);
              candidates = [...new Set([...live, ...live.flatMap((pid) => backend.children(pid))])];
              // An environment that may not be read stays so: waiting cannot prove those.
              f.waitable = live.filter((pid) => !unreadableOf(m).has(pid)).length;
            }
            // A fork that exec'd while recovery waited, and is this launch's (a carrier, or a candidate now).
            f.forkExecd = [...execd].some((pid) => looked.includes(pid) || candidates?.includes(pid));
            f.timedOut = Date.now() >= startingDeadline;
            break;
          }
          case 'wait':
            if ((await waits.next()).done) f.timedOut = true;
            else {
              f.found = undefined;
              f.preExec = undefined;
            }
            break;
          case 'end-carriers':
            await endOurs(m, [target, launcherClaim(m)], candidates ?? []);
            f.ended = true;
            break;
          case 'adopt': {
            if (!chosen) throw new Error(`recovery of ${m.id}: adopt without a target`);
            const p = chosen;
            chosen = null;
            return await adoptStarting(m, p, group);
          }
          case 'clean':
            return await clean(m, step);
          case 'quarantine':
            await quarantine(m.id, m, step);
            return;
          case 'defer':
            defer(m.id, step.error);
            return;
          default:
            throw new Error(`recovery of ${m.id} cannot ${step.do} an interrupted launch`);
        }
      }
    } finally {
      chosen?.handle.close();
      await waits.return();
    }
  }

  async function adoptStarting(m: StartingManifest, chosen: Pinned, group: InstanceCgroup | null): Promise<void> {
    const kept = group && isMember(chosen.identity, { pids: new Set(), cgroup: group.node }) ? group : null;
    const running: RunningManifest = {
      ...m,
      state: 'running',
      identity: chosen.identity,
      cgroup: kept ? m.cgroup : null,
      updatedAt: new Date().toISOString(),
    };
    try {
      await store.write(running);
    } catch (err) {
      chosen.handle.close();
      throw err;
    }
    adopt(running, chosen.handle, kept, 'starting');
    emit('adopt', {
      id: m.id,
      pid: chosen.identity.pid,
      message: `${m.id}: a launch interrupted mid-way was found and adopted`,
    });
  }

  /** The interrupted launch's target among the candidates, pinned; null when there is none (yet). Members of its cgroup that are not it are not reported. */
  async function findTarget(m: Manifest, claim: Claim, candidates: number[], members: boolean): Promise<Pinned | null> {
    if (m.pidSource === 'file' && m.pidFile) {
      // As launch does: the pidfile names the target (a -daemonize parent has its exe and argv too).
      const pid = readPidfile(m.pidFile);
      if (pid === null) return null;
      const p = pin(pid);
      const j = p && judge(claim, p.identity, undefined, true, p.environ);
      if (p && j?.ours) return p;
      if (j && !j.ours && j.why === 'environ') unreadableOf(m).add(pid);
      p?.handle.close();
      return null;
    }
    const ours: Pinned[] = [];
    for (const pid of candidates) {
      const p = pin(pid);
      if (!p) continue;
      const j = judge(claim, p.identity, undefined, false, p.environ);
      if (j.ours) ours.push(p);
      else {
        if (!members) reject(m, p.identity.pid, j);
        p.handle.close();
      }
    }
    // A process and its own fork may both qualify: the target is the one that is no other's parent.
    const parents = new Set(ours.map((c) => c.identity.ppid));
    // An env-mode token is inherited by every process the launch starts (a launcher's `sleep 0.6` too), and
    // the child custody spawned is never the child of another carrier: the target is one whose parent is not.
    const spawnedChild = (c: Pinned) =>
      m.tokenMode !== 'env' || m.pidSource !== 'child' || !candidates.includes(c.identity.ppid);
    const chosen = ours.find((c) => !parents.has(c.identity.pid) && spawnedChild(c)) ?? null;
    for (const c of ours) if (c !== chosen) c.handle.close();
    return chosen;
  }

  function reject(m: Manifest, pid: number, j: Judgement): void {
    if (j.ours || j.why === 'gone' || j.why === 'launcher') return;
    if (j.why === 'environ') {
      // Said once per process: the wait for a target may ask again.
      if (unreadableOf(m).has(pid)) return;
      unreadableOf(m).add(pid);
    }
    emit('warning', { id: m.id, pid, reason: j.why, message: `recovery of ${m.id}: ${describeRejection(pid, j.why)}` });
  }

  /** Ends every candidate that is provably this launch's (target or launcher), with what descends from it. */
  async function endOurs(m: Manifest, claims: Claim[], candidates: number[]): Promise<void> {
    const roots: ProcessHandle[] = [];
    for (const pid of candidates) {
      const p = pin(pid);
      if (!p) continue;
      const verdicts = claims.map((c) => judge(c, p.identity, undefined, false, p.environ));
      const first = verdicts[0];
      if (verdicts.some((v) => v.ours)) roots.push(p.handle);
      else {
        if (first) reject(m, pid, first);
        p.handle.close();
      }
    }
    if (roots.length === 0) return;
    try {
      await terminateMembers(roots, {
        session: m.session ?? null,
        graceMs: LEFTOVER_GRACE_MS,
        reapIfChild: true,
        onEscalate: ({ pid }) =>
          emit('escalate', {
            id: m.id,
            pid,
            message: `pid ${pid} of an interrupted launch ignored SIGTERM; sent SIGKILL`,
          }),
      });
    } finally {
      for (const h of roots) h.close();
    }
  }
}
