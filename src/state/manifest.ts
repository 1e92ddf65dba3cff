/**
 * The manifest's schema and its decoder: what a manifest may hold, in which
 * state, and the instance ids that name one. Apart from the store so that
 * what only needs the vocabulary (ids for logs and the CLI, the types for
 * recovery) does not pull in the store's file system work and its events.
 */
import { BadManifestError, InvalidArgError } from '../errors.js';
import type { AfterExitEnd, ExitResult, LastExit, ProcessIdentity } from '../types.js';
import { type RestartBudget, type RestartPolicy, restartRecordProblem } from '../lifecycle/restart-policy.js';
import { pidMax } from '../validate.js';

/**
 * 3 adds the `stopping` state, the confirmed identity of a `starting`
 * manifest and the instance's durable definition (`logs`, `launcherExits`);
 * 2 added `identity.pidNs`. Versions 1 (custody 0.1) and 2 (0.2) are read as
 * they are and rewritten as 3 once recovery proves them.
 */
export const MANIFEST_VERSION = 3;
/** The versions decodeManifest reads. */
const READABLE_VERSIONS: readonly unknown[] = [1, 2, MANIFEST_VERSION];
export const MANIFEST = 'manifest.json';
export const MAX_MANIFEST_BYTES = 1 << 20;
/** The largest uid or gid ((uid_t)-1 means "unchanged" to the kernel). */
const MAX_ID = 2 ** 32 - 2;

/** The state a manifest records (`custody ls`'s STATE). */
export type ManifestState = 'starting' | 'running' | 'stopping' | 'quarantined' | 'backoff' | 'failed';

/** An instance's restart policy and the budget it has used, carried by each of its manifests. */
export interface ManifestRestart extends RestartBudget {
  policy: RestartPolicy;
  /** Its last end, once it has ended. */
  lastExit: LastExit | null;
}

/** What every manifest carries, whatever its state. */
interface ManifestFields {
  version: number;
  id: string;
  /** 128-bit random hex; the launched argv carries it, or (tokenMode 'env') its environment as CUSTODY_TOKEN. */
  token: string;
  /** Where the token proved the process: 'argv' (the default; absent before env mode existed) or 'env'. */
  tokenMode?: 'argv' | 'env';
  command: string;
  args: string[];
  /** argv tokens the confirmed process carries besides the token. */
  expect: string[];
  /** Declared paths (sockets, pidfiles), removed on abandon and stop. */
  paths: string[];
  /** The program the confirmed process runs, when the launch named one. */
  executable: string | null;
  /** A uid the target may run as besides the supervisor's (a launcher that drops privileges). Absent in version 1. */
  uid?: number | null;
  /**
   * The credentials the launch started its child with (LaunchSpec.runAs): the ownership rule expects its uid
   * instead of the supervisor's. Absent where the launch gave none.
   */
  runAs?: { uid: number; gid: number; groups: number[] };
  /** The session custody created for the instance, while the target is in it: its members are the instance's. */
  session?: number | null;
  /** The instance's cgroup (cgroup v2): its absolute path and id (the directory's inode), written before spawn. */
  cgroup?: { path: string; id: string; unit?: true } | null;
  /** Where the pid came from. */
  pidSource: 'child' | 'file' | 'function';
  pidFile: string | null;
  createdAt: string;
  updatedAt: string;
  /** The pid of the supervisor that wrote it. */
  supervisorPid: number;
  /**
   * That supervisor's address-space layout (parseImage), which its fork shows
   * until the exec: recovery waits for such a fork, the launch's child cut
   * off before its exec. null where addresses are not randomized; absent
   * before it was recorded.
   */
  forkImage?: string | null;
  /**
   * The instance's log caps, as the launch gave them (absent before version
   * 3: custody's defaults); null where its stdout and stderr were not
   * custody's log files.
   */
  logs?: { maxBytes: number; keep: number } | null;
  /** A pidfile launch whose launcher stays (pid: { file }, launcherExits: false). Absent before version 3. */
  launcherExits?: boolean;
  /** What keeps it alive that a restarted agent must hand back (open({ specs })): absent where there is none. */
  keepAlive?: { health: boolean; watchdogMs: number | null; afterExit?: boolean };
  /**
   * An end whose afterExit hook has not returned yet: written before the hook runs, gone with the state the
   * end leaves. A supervisor that finds it runs the hook again (from open({ specs })).
   */
  owed?: AfterExitEnd;
  /** Its restart policy and budget: absent where it is never restarted. */
  restart?: ManifestRestart;
  /** The name of its sd_notify socket (ready: 'notify'), bound again at adoption for its watchdog. */
  notify?: string;
  /**
   * Its main process was named by MAINPID= (ready: 'notify'): a member of the instance, which may carry no
   * token and may have exec'd since it was named. Recovery proves it by its pidfs id or its cgroup, not by its
   * marks. Absent otherwise.
   */
  handedOff?: true;
}

/**
 * Written before anything is spawned (identity null), and again once exec is
 * confirmed, before readiness (identity recorded): recovery judges the second
 * as it judges a running one.
 */
export interface StartingManifest extends ManifestFields {
  state: 'starting';
  identity: ProcessIdentity | null;
  quarantine: null;
}

/** Written once exec is confirmed: the identity from the inspection that confirmed it. */
export interface RunningManifest extends ManifestFields {
  state: 'running';
  identity: ProcessIdentity;
  quarantine: null;
}

/**
 * A stop (or the end of an exited instance) began: written before the first
 * signal, so one that fails halfway or is cut off by a crash is finished by
 * the next stop() or by recovery, never taken for a process that is gone.
 */
export interface StoppingManifest extends ManifestFields {
  state: 'stopping';
  identity: ProcessIdentity;
  quarantine: null;
  /** When the stop began. */
  stoppingSince: string;
  /**
   * Why: `stopped` (stop()), `health` or `watchdog` (custody's own stop), or the result of an exit whose
   * leftovers are being ended. Recovery that finishes it restarts by it where the policy says so. Absent
   * before it was recorded: `stopped`.
   */
  stoppingFor?: ExitResult;
}

/**
 * A quarantine's reason besides recovery's verdicts (`bad-manifest`, `unprovable`, `mismatch`, `reused`,
 * `unrecorded`): a failed launch's abandon left running a carrier of its token that it would not signal
 * (another uid's, say: a daemon that dropped to one the launch did not declare). Its field names the pids;
 * the declared paths were kept for them.
 */
export const ABANDON_LEFT = 'abandon-left';

/** Why an instance is quarantined, as its manifest records it. */
export interface Quarantine {
  reason: string;
  field?: string;
  at: string;
}

/**
 * Recovery could not prove it, or an abandon left a process running: kept for the operator, never signalled.
 * A launch quarantined while starting has no identity.
 */
export interface QuarantinedManifest extends ManifestFields {
  state: 'quarantined';
  identity: ProcessIdentity | null;
  quarantine: Quarantine;
}

/**
 * Ended, and waiting for its restart: written (fsync'd) once every process of the ended run is proven gone and
 * its paths removed, in place of removing its state. No identity: no process is its.
 */
export interface BackoffManifest extends ManifestFields {
  state: 'backoff';
  identity: null;
  quarantine: null;
  restart: ManifestRestart;
  /** When the restart is due. */
  restartAt: string;
  /** Set where a supervisor that recovered it had no spec to launch it from: it waits for launch(). */
  waiting?: 'no-spec';
}

/** Ended more often than its limit allows: kept with its last end until launch() or remove(). */
export interface FailedManifest extends ManifestFields {
  state: 'failed';
  identity: null;
  quarantine: null;
  restart: ManifestRestart;
}

/** One instance's record; narrow on `state` for the fields that state has. */
export type Manifest =
  | StartingManifest
  | RunningManifest
  | StoppingManifest
  | QuarantinedManifest
  | BackoffManifest
  | FailedManifest;

/** No leading dot: a dot-name is hidden from ls and could be `.` or `..`. */
const ID_RE = /^[A-Za-z0-9_-][A-Za-z0-9._-]{0,127}$/;
export const ID_RULE = '1-128 characters of [A-Za-z0-9._-], not starting with a dot';

export function isValidId(id: unknown): id is string {
  return typeof id === 'string' && ID_RE.test(id);
}

export function assertId(id: unknown): asserts id is string {
  if (!isValidId(id))
    throw new InvalidArgError(`id must be ${ID_RULE}, got ${JSON.stringify(String(id)).slice(0, 80)}`);
}

/**
 * What release() accepts: any name an entry of a state dir can have (a
 * quarantined `bad id` or `.vm` included), but never one that reaches
 * outside it.
 */
export function assertEntryName(name: unknown): asserts name is string {
  const ok =
    typeof name === 'string' &&
    name !== '' &&
    name !== '.' &&
    name !== '..' &&
    !name.includes('/') &&
    !name.includes('\0') &&
    Buffer.byteLength(name) <= 255;
  if (!ok)
    throw new InvalidArgError(
      `not a name in a state dir (no "/", NUL, "." or ".."; at most 255 bytes): ${JSON.stringify(String(name)).slice(0, 80)}`,
    );
}

const isObj = (v: unknown): v is Record<string, unknown> => typeof v === 'object' && v !== null && !Array.isArray(v);
const isStrArr = (v: unknown): v is string[] => Array.isArray(v) && v.every((s) => typeof s === 'string');
const isInt = (v: unknown, min: number) => typeof v === 'number' && Number.isSafeInteger(v) && v >= min;

/** Validates a decoded identity; returns a reason when it is malformed. Missing bootId/startTicks are allowed (verify says unrecorded). */
function identityProblem(v: unknown): string | null {
  if (!isObj(v)) return 'identity is not an object';
  if (!isInt(v.pid, 1) || (v.pid as number) > pidMax()) return `identity.pid is not an integer from 1 to ${pidMax()}`;
  if (v.bootId !== undefined && v.bootId !== null && typeof v.bootId !== 'string')
    return 'identity.bootId is not a string';
  if (v.startTicks !== undefined && v.startTicks !== null && !isInt(v.startTicks, 0))
    return 'identity.startTicks is not a non-negative integer';
  if (v.exe !== null && v.exe !== undefined && !(isObj(v.exe) && isInt(v.exe.dev, 0) && isInt(v.exe.ino, 0)))
    return 'identity.exe is malformed';
  if (v.pidfsId !== null && v.pidfsId !== undefined && !(typeof v.pidfsId === 'string' && /^\d{1,20}$/.test(v.pidfsId)))
    return 'identity.pidfsId is malformed';
  if (!isStrArr(v.argv)) return 'identity.argv is not a list of strings';
  if (v.pidNs !== undefined && v.pidNs !== null && !isInt(v.pidNs, 0)) return 'identity.pidNs is malformed';
  if (v.processPidNs !== undefined && v.processPidNs !== null && !isInt(v.processPidNs, 0))
    return 'identity.processPidNs is malformed';
  return null;
}

const RESULTS: readonly unknown[] = [
  'success',
  'exit-code',
  'signal',
  'core-dump',
  'oom-kill',
  'health',
  'watchdog',
  'stopped',
  'unknown',
];

function isLastExit(v: unknown): v is LastExit {
  if (!isObj(v) || !RESULTS.includes(v.result)) return false;
  const codeOk = v.code === null || (isInt(v.code, 0) && (v.code as number) <= 255);
  const signalOk = v.signal === null || (typeof v.signal === 'string' && /^SIG[A-Z0-9+-]{1,12}$/.test(v.signal));
  return codeOk && signalOk && (v.coreDumped === undefined || v.coreDumped === true);
}

/** Decodes manifest text (version 1 or 2); throws BadManifestError naming what is wrong. Never trusts a field it has not checked. */
export function decodeManifest(text: string, path: string, expectedId?: string): Manifest {
  let v: unknown;
  try {
    v = JSON.parse(text);
  } catch (err) {
    throw new BadManifestError(path, 'not valid JSON', { cause: err });
  }
  if (!isObj(v)) throw new BadManifestError(path, 'not a JSON object');
  if (!READABLE_VERSIONS.includes(v.version))
    throw new BadManifestError(path, `unknown schema version ${JSON.stringify(v.version)}`);
  const bad = (why: string) => new BadManifestError(path, why);
  if (!isValidId(v.id)) throw bad('id is malformed');
  if (expectedId !== undefined && v.id !== expectedId)
    throw bad(`id ${JSON.stringify(v.id)} does not match its directory ${JSON.stringify(expectedId)}`);
  if (typeof v.token !== 'string' || !/^[0-9a-f]{32}$/.test(v.token)) throw bad('token is not 32 hex digits');
  const states =
    v.version === MANIFEST_VERSION
      ? ['starting', 'running', 'stopping', 'quarantined', 'backoff', 'failed']
      : ['starting', 'running', 'quarantined'];
  if (!states.includes(v.state as string)) throw bad(`unknown state ${JSON.stringify(v.state)}`);
  if (typeof v.command !== 'string' || v.command === '') throw bad('command is malformed');
  if (!isStrArr(v.args)) throw bad('args is not a list of strings');
  if (v.tokenMode !== undefined && v.tokenMode !== 'argv' && v.tokenMode !== 'env') throw bad('tokenMode is malformed');
  // An env-mode launch's argv is fixed (the token is in its environment); a launcher's may assemble the token.
  if (v.tokenMode !== 'env' && v.pidSource === 'child' && !v.args.some((a) => a.includes(v.token as string))) {
    throw bad('args do not carry the token');
  }
  if (!isStrArr(v.expect)) throw bad('expect is not a list of strings');
  if (!isStrArr(v.paths)) throw bad('paths is not a list of strings');
  if (v.pidSource !== 'child' && v.pidSource !== 'file' && v.pidSource !== 'function')
    throw bad('pidSource is malformed');
  if (v.pidFile !== null && !(typeof v.pidFile === 'string' && v.pidFile.startsWith('/')))
    throw bad('pidFile is not an absolute path');
  if (v.executable !== null && !(typeof v.executable === 'string' && v.executable !== ''))
    throw bad('executable is malformed');
  if (!isInt(v.supervisorPid, 1)) throw bad('supervisorPid is malformed');
  if (v.uid !== undefined && v.uid !== null && !isInt(v.uid, 0)) throw bad('uid is malformed');
  if (v.runAs !== undefined) {
    const r = v.runAs;
    const id = (x: unknown) => isInt(x, 0) && (x as number) <= MAX_ID;
    const ok = isObj(r) && id(r.uid) && id(r.gid) && Array.isArray(r.groups) && r.groups.length <= 65536;
    if (!ok || !(r.groups as unknown[]).every(id)) throw bad('runAs is malformed');
  }
  if (
    v.forkImage !== undefined &&
    v.forkImage !== null &&
    !(typeof v.forkImage === 'string' && /^[1-9]\d{0,19}(:[1-9]\d{0,19}){2}$/.test(v.forkImage))
  )
    throw bad('forkImage is malformed');
  if (v.session !== undefined && v.session !== null && !(isInt(v.session, 1) && (v.session as number) <= pidMax()))
    throw bad('session is malformed');
  if (v.cgroup !== undefined && v.cgroup !== null) {
    const c = v.cgroup;
    const ok = isObj(c) && typeof c.path === 'string' && c.path.startsWith('/') && !c.path.includes('\0');
    if (!ok || typeof c.id !== 'string' || !/^\d{1,20}$/.test(c.id)) throw bad('cgroup is malformed');
    if (c.unit !== undefined && c.unit !== true) throw bad('cgroup.unit is malformed');
  }
  if (v.identity !== null) {
    const problem = identityProblem(v.identity);
    if (problem) throw bad(problem);
  }
  if (v.quarantine !== null && !(isObj(v.quarantine) && typeof v.quarantine.reason === 'string'))
    throw bad('quarantine is malformed');
  // Each state has the fields custody writes in it, and only those: a mix is no state custody was ever in.
  if (v.logs !== undefined && v.logs !== null) {
    const l = v.logs;
    if (!(isObj(l) && isInt(l.maxBytes, 0) && isInt(l.keep, 0))) throw bad('logs is malformed');
  }
  if (v.launcherExits !== undefined && typeof v.launcherExits !== 'boolean') throw bad('launcherExits is malformed');
  if (v.keepAlive !== undefined) {
    const k = v.keepAlive;
    if (!(isObj(k) && typeof k.health === 'boolean' && (k.watchdogMs === null || isInt(k.watchdogMs, 1))))
      throw bad('keepAlive is malformed');
    if (k.afterExit !== undefined && typeof k.afterExit !== 'boolean') throw bad('keepAlive is malformed');
  }
  if (v.notify !== undefined && !(typeof v.notify === 'string' && /^custody\/notify\/[0-9a-f]{32}$/.test(v.notify)))
    throw bad('notify is malformed');
  if (v.handedOff !== undefined && !(v.handedOff === true && v.notify !== undefined))
    throw bad('handedOff is malformed');
  if (v.owed !== undefined) {
    const o = v.owed;
    const ok =
      isObj(o) &&
      o.id === v.id &&
      (o.pid === null || (isInt(o.pid, 1) && (o.pid as number) <= pidMax())) &&
      typeof o.token === 'string' &&
      /^[0-9a-f]{32}$/.test(o.token) &&
      typeof o.restarting === 'boolean' &&
      isLastExit({ code: o.code, signal: o.signal, result: o.result });
    if (!ok) throw bad('owed is malformed');
  }
  if (v.restart !== undefined) {
    const problem = restartRecordProblem(v.restart);
    if (problem) throw bad(problem);
    const last = (v.restart as Record<string, unknown>).lastExit;
    if (last !== null && !isLastExit(last)) throw bad('restart.lastExit is malformed');
  }
  if (v.state === 'backoff' || v.state === 'failed') {
    if (v.identity !== null) throw bad(`a ${v.state} manifest has an identity`);
    if (v.restart === undefined) throw bad(`a ${v.state} manifest has no restart record`);
  }
  if (v.state === 'backoff' && !(typeof v.restartAt === 'string' && Number.isFinite(Date.parse(v.restartAt))))
    throw bad('restartAt is malformed');
  if (v.waiting !== undefined && !(v.state === 'backoff' && v.waiting === 'no-spec')) throw bad('waiting is malformed');
  if ((v.state === 'running' || v.state === 'stopping') && v.identity === null)
    throw bad(`a ${v.state} manifest has no identity`);
  if (v.state === 'stopping' && !(typeof v.stoppingSince === 'string')) throw bad('stoppingSince is malformed');
  if (v.stoppingFor !== undefined && !(v.state === 'stopping' && RESULTS.includes(v.stoppingFor)))
    throw bad('stoppingFor is malformed');
  // Before version 3 a starting manifest never held the confirmed identity.
  if (v.state === 'starting' && v.identity !== null && v.version !== MANIFEST_VERSION)
    throw bad('a starting manifest has an identity');
  if (v.state === 'quarantined' && v.quarantine === null) throw bad('a quarantined manifest has no quarantine');
  if (v.state !== 'quarantined' && v.quarantine !== null) throw bad(`a ${v.state} manifest has a quarantine`);
  return v as unknown as Manifest;
}

/**
 * An instance dir without a manifest: a crash between creating the dir (or
 * writing the temp file) and the rename. Nothing is spawned before the
 * first manifest is renamed into place, so there is no process to find.
 */
export class IncompleteInstanceError extends BadManifestError {
  constructor(path: string) {
    super(path, 'no manifest (a write interrupted before its rename)');
  }
}
