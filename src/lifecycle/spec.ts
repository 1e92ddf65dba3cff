/**
 * A LaunchSpec's checks: everything launch() refuses is refused here, before
 * anything exists (no manifest, no process, no cgroup).
 */
import { InvalidArgError, UnsupportedError } from '../errors.js';
import { backend } from '../backend/index.js';
import { assertLogOptions } from '../state/logs.js';
import { assertId } from '../state/manifest.js';
import type { CgroupLimits } from '../process/cgroup.js';
import { EXEC_ATTRIBUTE_KEYS, execAttrs } from '../process/exec-attrs.js';
import type { LogOptions } from '../state/logs.js';
import {
  assertCwd,
  assertDuration,
  assertEnv,
  assertFlag,
  assertKnownKeys,
  assertString,
  assertStringArray,
} from '../validate.js';
import { validateHealth } from './health.js';
import { validateRestart } from './restart-policy.js';
import type { LaunchSpec, SocketReady } from './launch.js';

const LAUNCH_SPEC_KEYS: Record<keyof LaunchSpec, true> = {
  id: true,
  command: true,
  args: true,
  expect: true,
  token: true,
  executable: true,
  ready: true,
  health: true,
  watchdogMs: true,
  restart: true,
  afterExit: true,
  afterExitTimeoutMs: true,
  pid: true,
  launcherExits: true,
  paths: true,
  confirmTimeoutMs: true,
  attempts: true,
  env: true,
  cwd: true,
  stdout: true,
  stderr: true,
  logs: true,
  uid: true,
  detached: true,
  processGroup: true,
  abandonGraceMs: true,
  readyTimeoutMs: true,
  limits: true,
  signal: true,
  ...EXEC_ATTRIBUTE_KEYS,
};
const SOCKET_READY_KEYS: Record<keyof SocketReady, true> = { socket: true, timeoutMs: true, probe: true };
const PIDFILE_KEYS: Record<'file', true> = { file: true };
const LOG_KEYS: Record<keyof LogOptions, true> = { maxBytes: true, keep: true };
const LIMIT_KEYS: Record<keyof CgroupLimits, true> = { memoryMax: true, pidsMax: true, cpuMax: true };
const CPU_MAX_KEYS: Record<keyof NonNullable<CgroupLimits['cpuMax']>, true> = { quotaUsec: true, periodUsec: true };

/** The nested objects a spec may hold, checked for unknown keys like the spec itself. */
function assertKnownSpecKeys(spec: LaunchSpec): void {
  assertKnownKeys(spec, LAUNCH_SPEC_KEYS, 'LaunchSpec');
  const isObject = (v: unknown): v is object => !!v && typeof v === 'object';
  if (isObject(spec.ready)) assertKnownKeys(spec.ready, SOCKET_READY_KEYS, 'LaunchSpec.ready');
  if (isObject(spec.pid)) assertKnownKeys(spec.pid, PIDFILE_KEYS, 'LaunchSpec.pid');
  if (isObject(spec.logs)) assertKnownKeys(spec.logs, LOG_KEYS, 'LaunchSpec.logs');
  if (isObject(spec.limits)) {
    assertKnownKeys(spec.limits, LIMIT_KEYS, 'LaunchSpec.limits');
    if (isObject(spec.limits.cpuMax)) assertKnownKeys(spec.limits.cpuMax, CPU_MAX_KEYS, 'LaunchSpec.limits.cpuMax');
  }
}

/** SupervisorOptions.specs: each a valid LaunchSpec, under its own id. */
export function validateSpecs(specs: unknown): void {
  if (specs === undefined) return;
  if (!specs || typeof specs !== 'object' || Array.isArray(specs))
    throw new InvalidArgError('specs must be an object of LaunchSpecs by id');
  for (const [id, spec] of Object.entries(specs as Record<string, LaunchSpec>)) {
    validateSpec(spec);
    if (spec.id !== id)
      throw new InvalidArgError(`specs[${JSON.stringify(id)}] is the spec of ${JSON.stringify(spec.id)}`);
  }
}

export function validateSpec(spec: LaunchSpec): void {
  if (!spec || typeof spec !== 'object') throw new InvalidArgError('launch() needs a spec object');
  assertKnownSpecKeys(spec);
  assertId(spec.id);
  if (typeof spec.command !== 'string' || spec.command === '' || spec.command.includes('\0')) {
    throw new InvalidArgError('command must be a non-empty string without NUL bytes');
  }
  if (typeof spec.args !== 'function') assertStringArray(spec.args, 'args');
  if (spec.env !== undefined) assertEnv(spec.env);
  assertCwd(spec.cwd);
  assertFlag(spec.detached, 'detached');
  assertFlag(spec.processGroup, 'processGroup');
  if ((spec.stdout as unknown) === 'pipe') {
    // Nobody would read it: an Instance has no streams, and a daemon blocks once the pipe's 64 KiB are full.
    throw new InvalidArgError(
      "stdout: 'pipe' has no reader in a launch; give { file }, { fd }, 'ignore' or the default log",
    );
  }
  if (spec.executable !== undefined) assertString(spec.executable, 'executable');
  if (spec.uid !== undefined && !(Number.isSafeInteger(spec.uid) && spec.uid >= 0 && spec.uid < 2 ** 32 - 1)) {
    throw new InvalidArgError('uid must be an integer from 0 to 4294967294');
  }
  if (spec.expect !== undefined) assertStringArray(spec.expect, 'expect');
  if (spec.paths !== undefined) {
    assertStringArray(spec.paths, 'paths');
    for (const p of spec.paths)
      if (!p.startsWith('/')) throw new InvalidArgError(`paths must be absolute: ${JSON.stringify(p)}`);
  }
  const pid = spec.pid;
  if (
    pid !== undefined &&
    pid !== 'child' &&
    typeof pid !== 'function' &&
    !(pid && typeof pid === 'object' && typeof pid.file === 'string' && pid.file.startsWith('/'))
  ) {
    throw new InvalidArgError("pid must be 'child', { file: absolutePath } or a function");
  }
  const pidFile = !!pid && typeof pid === 'object';
  if (spec.launcherExits !== undefined && (typeof spec.launcherExits !== 'boolean' || !pidFile)) {
    throw new InvalidArgError('launcherExits is a boolean, and only for pid: { file }');
  }
  if (spec.token !== undefined && spec.token !== 'argv' && spec.token !== 'env') {
    throw new InvalidArgError("token must be 'argv' or 'env'");
  }
  if (spec.ready === 'notify') {
    // Refused before anything exists: no manifest, no process.
    if (!backend.capabilities().notify) {
      const why = backend.capabilities().reason ?? backend.name;
      throw new UnsupportedError(`ready: 'notify' needs the native backend (${why})`);
    }
  } else if (spec.ready !== undefined && typeof spec.ready !== 'function') {
    if (!spec.ready || typeof spec.ready.socket !== 'string' || !spec.ready.socket.startsWith('/')) {
      throw new InvalidArgError("ready must be 'notify', { socket: absolutePath, probe?, timeoutMs? } or a function");
    }
    if (spec.ready.probe !== undefined && typeof spec.ready.probe !== 'function') {
      throw new InvalidArgError('ready.probe must be a function');
    }
    if (spec.ready.timeoutMs !== undefined) {
      assertDuration(spec.ready.timeoutMs, 'ready.timeoutMs');
      if (spec.readyTimeoutMs !== undefined) {
        throw new InvalidArgError('give readyTimeoutMs or its alias ready.timeoutMs, not both');
      }
    }
  }
  validateHealth(spec.health);
  validateRestart(spec.restart);
  if (spec.afterExit !== undefined && typeof spec.afterExit !== 'function')
    throw new InvalidArgError('afterExit must be a function');
  if (spec.afterExitTimeoutMs !== undefined) assertDuration(spec.afterExitTimeoutMs, 'afterExitTimeoutMs');
  if (spec.watchdogMs !== undefined) {
    assertDuration(spec.watchdogMs, 'watchdogMs');
    if (spec.watchdogMs < 1) throw new InvalidArgError('watchdogMs must be at least 1 ms');
    if (spec.ready !== 'notify')
      throw new InvalidArgError("watchdogMs needs ready: 'notify' (WATCHDOG=1 comes over it)");
  }
  assertLogOptions(spec.logs);
  if (spec.confirmTimeoutMs !== undefined) assertDuration(spec.confirmTimeoutMs, 'confirmTimeoutMs');
  if (spec.abandonGraceMs !== undefined) assertDuration(spec.abandonGraceMs, 'abandonGraceMs');
  if (spec.readyTimeoutMs !== undefined) assertDuration(spec.readyTimeoutMs, 'readyTimeoutMs');
  if (spec.attempts !== undefined && (!Number.isInteger(spec.attempts) || spec.attempts < 1 || spec.attempts > 100)) {
    throw new InvalidArgError('attempts must be an integer from 1 to 100');
  }
  if (spec.signal !== undefined && !(spec.signal instanceof AbortSignal))
    throw new InvalidArgError('signal must be an AbortSignal');
  execAttrs(spec, 'LaunchSpec');
}

/**
 * Refuses (ERR_CUSTODY_UNSUPPORTED), before anything exists, the exec attributes this backend cannot give a
 * child, placed in a cgroup or not (`cgroup`: the supervisor has a cgroup root).
 */
export function checkExecSupport(spec: LaunchSpec, cgroup: boolean): void {
  const exec = execAttrs(spec, 'LaunchSpec');
  if (exec) backend.checkExec(exec, cgroup);
}
