/**
 * A launch as the supervisor runs it: up to `attempts` tries, each one
 * recorded before anything is spawned, confirmed, recorded again with the
 * confirmed identity before readiness, then recorded running; and each
 * failure abandoned cleanly before the next (launch.ts, confirm.ts, ready.ts
 * and abandon.ts have the steps). The attempt holds the instance's definition; its manifests
 * are made from it.
 */
import { randomBytes } from 'node:crypto';
import { backend } from '../backend/index.js';
import {
  AbortError,
  CustodyError,
  DeferredError,
  InvalidArgError,
  LaunchExitedError,
  NotOursError,
  QuarantinedError,
} from '../errors.js';
import type { InstanceCgroup } from '../process/cgroup.js';
import { removeCgroup } from '../process/cgroup-tree.js';
import { execAttrs } from '../process/exec-attrs.js';
import { executableId, type ProcessHandle } from '../process/handle.js';
import { type InstanceLogs, logLimits } from '../state/logs.js';
import { removeDeclaredPaths } from '../state/paths.js';
import {
  ABANDON_LEFT,
  MANIFEST_VERSION,
  type Manifest,
  type QuarantinedManifest,
  type StartingManifest,
} from '../state/manifest.js';
import type { LastExit, ProcessIdentity } from '../types.js';
import { assertStringArray } from '../validate.js';
import { track } from './exits.js';
import type { LifecycleHost } from './host.js';
import { afterExitOf, type Life, type Starting } from './instances.js';
import { restartRecord } from './ends.js';
import { resultOf } from '../process/exit.js';
import { type Abandoned, abandon, type LeftProcess, targetInCgroup } from './abandon.js';
import { unitCgroupOf } from '../process/unit-cgroup.js';
import { confirm } from './confirm.js';
import {
  confirmedIdentity,
  confirmedTarget,
  obtainPid,
  spawned,
  startChild,
  type Attempt,
  type Instance,
  type LaunchSpec,
} from './launch.js';
import { openNotify } from './notify-launch.js';
import { waitReady } from './ready.js';
import { settle } from './settle.js';
import { settleEnd } from './ends.js';
import { probeHealth } from './health.js';
import { watchWatchdog } from './watchdog.js';

/** Launches `spec` (validated by the caller) under a `starting` record that owns its id until it runs or is undone. */
export async function launchInstance(host: LifecycleHost, spec: LaunchSpec, life?: Life): Promise<Instance> {
  const { id } = spec;
  const existing = host.table.get(id);
  if (existing?.status === 'quarantined') throw new QuarantinedError(id, existing.reason);
  if (existing?.status === 'deferred') throw new DeferredError(id, existing.error);
  const over = ['exited', 'backoff', 'failed', 'owed'].includes(existing?.status ?? '');
  if (existing && !over) {
    throw new CustodyError('ERR_CUSTODY_BUSY', `instance ${id} is already ${existing.status}`);
  }
  // A state dir moved or replaced since open would get a record nobody finds.
  host.store.assertInPlace();
  if (existing) host.table.move(id, undefined);
  const placeholder: Starting = life ? { status: 'starting', life } : { status: 'starting' };
  host.table.move(id, placeholder);
  try {
    const attempts = spec.attempts ?? 1;
    let lastError: unknown;
    for (let n = 1; n <= attempts; n++) {
      if (spec.signal?.aborted) throw new AbortError(spec.signal.reason);
      try {
        return await attempt(host, spec, n, life);
      } catch (err) {
        lastError = err;
        // Deferred: an attempt not proven undone; its state waits for recover(), not for another attempt.
        // Quarantined: one that left a process running; its paths are that process's until released.
        const status = host.table.get(id)?.status;
        const ended = status === 'deferred' || status === 'quarantined';
        if (err instanceof AbortError || err instanceof InvalidArgError || host.closed || ended) throw err;
        if (n < attempts)
          host.emit('retry', {
            id,
            attempt: n + 1,
            message: `attempt ${n + 1} of ${attempts} after: ${(err as Error).message}`,
          });
      }
    }
    throw lastError;
  } finally {
    host.table.moveFrom(id, placeholder, undefined);
  }
}

/** The definition of one attempt: the spec with its token, its argv and its declared paths settled. */
function definition(spec: LaunchSpec): Attempt {
  const token = randomBytes(16).toString('hex');
  const argv = typeof spec.args === 'function' ? spec.args(token) : spec.args;
  assertStringArray(argv, 'args');
  const pidSpec = spec.pid ?? 'child';
  const tokenMode = spec.token ?? 'argv';
  // Only where the child's own argv is the target's can it be checked up
  // front: a launcher may assemble the target's argv (and its token) from
  // its own, and only the confirmed target must carry it. In env mode the
  // environment carries it, whatever the argv.
  if (tokenMode === 'argv' && pidSpec === 'child' && !argv.some((a) => a.includes(token))) {
    throw new InvalidArgError(
      `args of ${spec.id} must carry the launch token: pass args as a function of the token ` +
        `((token) => [..., token]), or, for a program whose argv is fixed (sleep, a daemon that rejects ` +
        `an extra argument), set token: 'env' to carry it in the environment (CUSTODY_TOKEN) instead`,
    );
  }
  const paths = [...(spec.paths ?? [])];
  if (spec.ready && typeof spec.ready === 'object') paths.push(spec.ready.socket);
  if (typeof pidSpec === 'object') paths.push(pidSpec.file);
  const executable = spec.executable ? executableId(spec.executable, spec.env ?? process.env, spec.cwd) : null;
  return {
    id: spec.id,
    token,
    tokenMode,
    command: spec.command,
    argv,
    uid: spec.uid ?? null,
    exec: execAttrs(spec, 'LaunchSpec'),
    session: null,
    expect: spec.expect ?? [],
    executable: executable ? { dev: executable.dev, ino: executable.ino } : null,
    executablePath: spec.executable ?? null,
    paths: [...new Set(paths)],
    pidSpec,
    launcherExits: spec.launcherExits !== false,
    child: null,
    target: null,
    identity: null,
    cgroup: null,
    stderrTail: () => undefined,
    stdoutTail: () => undefined,
    notify: null,
  };
}

/** The manifest written before anything is spawned: the attempt's definition, and what recovery needs besides. */
function startingManifest(a: Attempt, spec: LaunchSpec, life: Life | undefined): StartingManifest {
  const now = new Date().toISOString();
  const { pidSpec } = a;
  return {
    version: MANIFEST_VERSION,
    id: a.id,
    token: a.token,
    tokenMode: a.tokenMode,
    state: 'starting',
    identity: null,
    command: a.command,
    args: a.argv,
    expect: a.expect,
    paths: a.paths,
    executable: a.executablePath,
    uid: a.uid,
    // What recovery's ownership rule needs: the uid the target was started as instead of ours.
    ...(a.exec?.runAs ? { runAs: { ...a.exec.runAs, groups: [...a.exec.runAs.groups] } } : {}),
    pidSource: pidSpec === 'child' ? 'child' : typeof pidSpec === 'function' ? 'function' : 'file',
    pidFile: typeof pidSpec === 'object' ? pidSpec.file : null,
    createdAt: now,
    updatedAt: now,
    supervisorPid: process.pid,
    // What the child shows until its exec: a crash in between leaves recovery a fork to wait for.
    forkImage: backend.ownForkImage(),
    quarantine: null,
    // What the agent needs of the launch after a restart: the log caps, the launcher's role.
    logs: spec.stdout === undefined || spec.stderr === undefined ? logCaps(spec.logs) : null,
    launcherExits: a.launcherExits,
    ...(spec.health || spec.watchdogMs !== undefined || spec.afterExit
      ? {
          keepAlive: {
            health: spec.health !== undefined,
            watchdogMs: spec.watchdogMs ?? null,
            ...(spec.afterExit ? { afterExit: true } : {}),
          },
        }
      : {}),
    ...(a.cgroup ? { cgroup: { path: a.cgroup.path, id: a.cgroup.id } } : {}),
    ...(life ? { restart: restartRecord(life) } : {}),
  };
}

async function attempt(host: LifecycleHost, spec: LaunchSpec, attemptNo: number, life?: Life): Promise<Instance> {
  const a = definition(spec);
  // Stale paths of an earlier run would make readiness lie.
  removeDeclaredPaths(a.paths, host.emit, spec.id);
  // Before the manifest: a log dir that cannot be trusted fails the launch with nothing to undo.
  const logged = spec.stdout === undefined || spec.stderr === undefined;
  // A restart appends to the logs (only launch() rotates them): a crash loop keeps every crash's output.
  const logs = host.logs.prepare(spec.id, logged ? spec.logs : false, !life?.relaunching);
  // The cgroup before the manifest that names it: a crash between the two leaves an empty cgroup, which recovery removes.
  const made = host.cgroups?.create(spec.id, a.token, spec.limits) ?? null;
  a.cgroup = made;
  if (made) host.launching.add(made.path);
  try {
    return await run(host, spec, attemptNo, a, logs, life);
  } finally {
    if (made) host.launching.delete(made.path);
  }
}

/**
 * The starting manifest with the confirmed target: written (fsync'd) before readiness, and again when a
 * MAINPID= hands the target off, with the uid the handed-off process runs as.
 */
function confirmedManifest(manifest: StartingManifest, a: Attempt, cgroup: InstanceCgroup | null): StartingManifest {
  const identity = confirmedIdentity(a);
  const handedOff = a.handedOff
    ? { handedOff: true as const, uid: runningUid(manifest.uid ?? null, identity, identity, true) }
    : {};
  return {
    ...manifest,
    ...(a.notify ? { notify: a.notify.name } : {}),
    identity,
    ...placement(a, identity, cgroup),
    ...handedOff,
    updatedAt: new Date().toISOString(),
  };
}

/**
 * A pid function's target outside the attempt's cgroup, in a systemd unit of the launch's (its name carries the
 * token, root owns it): the unit's cgroup is the instance's from here on, and the one made for the launcher
 * (with a cgroup root) is only the launcher's.
 */
function inUnit(a: Attempt): void {
  if (typeof a.pidSpec !== 'function' || (a.cgroup && targetInCgroup(a))) return;
  const unit = unitCgroupOf(confirmedIdentity(a), a.token);
  if (unit) {
    a.launcherCgroup = a.cgroup;
    a.cgroup = unit;
    return;
  }
  if (!a.cgroup) return;
  // Anywhere else, with an instance cgroup made for it: not the instance's (whoever put it there owns it), and
  // never signalled: the abandon that follows ends only what is in the instance cgroup.
  const target = confirmedTarget(a);
  const where = backend.cgroupOf(target.pid);
  target.close();
  a.target = null;
  a.identity = null;
  throw new NotOursError(
    a.id,
    target.pid,
    `pid ${target.pid} is in cgroup ${where ?? '(gone)'}, neither the instance's (${a.cgroup.node}) nor a systemd unit's named for its token`,
  );
}

/** Where the confirmed target is recorded: the session only while the target is in it, the cgroup only if it is in it. */
function placement(a: Attempt, identity: ProcessIdentity, cgroup: InstanceCgroup | null) {
  return {
    session: a.session !== null && identity.session === a.session ? a.session : null,
    cgroup: cgroup ? { path: cgroup.path, id: cgroup.id, ...(cgroup.unit ? { unit: true as const } : {}) } : null,
  };
}

async function run(
  host: LifecycleHost,
  spec: LaunchSpec,
  attemptNo: number,
  a: Attempt,
  logs: ReturnType<InstanceLogs['prepare']>,
  life: Life | undefined,
): Promise<Instance> {
  const { token, pidSpec } = a;
  const manifest = startingManifest(a, spec, life);
  // Written, and fsync'd, before anything is spawned: a supervisor killed
  // from here on leaves a record recovery can find the process by.
  try {
    await host.store.write(manifest);
  } catch (err) {
    if (a.cgroup) await removeCgroup(a.cgroup, host.emit, spec.id);
    throw err;
  }
  host.emit('launch', {
    id: spec.id,
    attempt: attemptNo,
    token,
    message: `attempt ${attemptNo}: starting manifest written; spawning ${spec.command}`,
  });
  const confirmTimeoutMs = spec.confirmTimeoutMs ?? 3000;
  const signal = spec.signal;
  // The instance cgroup as confirm found the target in it (null: none, or the target outside it).
  let confirmedCgroup: InstanceCgroup | null = null;
  try {
    // Bound before the spawn, so nothing the instance sends is lost; closed on failure below, else with the instance.
    // A MAINPID= hand-off is recorded as confirm is, before the wait goes on.
    if (spec.ready === 'notify')
      a.notify = openNotify(a, host.emit, () => host.store.write(confirmedManifest(manifest, a, confirmedCgroup)));
    startChild(a, spec, logs);
    const child = spawned(a);
    host.emit('spawn', {
      id: spec.id,
      pid: child.pid,
      message: `spawned pid ${child.pid} (${pidSpec === 'child' ? 'the target itself' : 'a launcher; the target pid comes from it'})`,
    });
    const deadline = Date.now() + confirmTimeoutMs;
    let pid = await obtainPid(a, deadline, confirmTimeoutMs, signal);
    await confirm(a, pid, deadline, confirmTimeoutMs, signal);
    inUnit(a);
    const cgroup = a.cgroup && targetInCgroup(a) ? a.cgroup : null;
    confirmedCgroup = cgroup;
    // Recorded, fsync'd, before readiness: a supervisor killed while it waits leaves the proven identity.
    await host.store.write(confirmedManifest(manifest, a, cgroup));
    host.emit('confirm', {
      id: spec.id,
      pid,
      identity: a.identity,
      message: `pid ${pid} exec'd into the expected argv; identity recorded from that inspection`,
    });
    const instance: Instance = {
      id: spec.id,
      pid,
      token,
      identity: confirmedIdentity(a),
      exited: confirmedTarget(a).exited,
      cgroup: cgroup?.path ?? null,
      lastExit: null,
      restarts: life?.budget.restarts ?? 0,
    };
    if (spec.ready) {
      const alias = typeof spec.ready === 'object' ? spec.ready.timeoutMs : undefined;
      const readyTimeoutMs = spec.readyTimeoutMs ?? alias ?? 10_000;
      await waitReady(a, instance, spec.ready, readyTimeoutMs, signal);
      // A notify launch's MAINPID= may have made another pid the target (re-confirmed).
      pid = confirmedTarget(a).pid;
      const how = spec.ready === 'notify' ? 'ready: READY=1 from the instance' : 'ready';
      host.emit('ready', { id: spec.id, pid, message: how });
    }
    // Closed while launching: nobody would watch it; undo rather than orphan it.
    if (host.closed)
      throw new CustodyError('ERR_CUSTODY_CLOSED', `the supervisor was closed while ${spec.id} was launching`);
    const target = confirmedTarget(a);
    const identity = settledIdentity(host, spec.id, confirmedIdentity(a), child === target, a.handedOff === true);
    // The session is recorded only while the target is in it: stop and recovery then count its members.
    const running: Manifest = {
      ...manifest,
      ...(a.notify ? { notify: a.notify.name } : {}),
      state: 'running',
      identity,
      uid: runningUid(manifest.uid ?? null, identity, confirmedIdentity(a), a.handedOff === true),
      ...(a.handedOff ? { handedOff: true as const } : {}),
      ...placement(a, identity, cgroup),
      updatedAt: new Date().toISOString(),
    };
    await host.store.write(running);
    if (child !== target) {
      // The launcher is ours to reap whenever it ends; it holds nothing.
      child.unref();
      child.close();
      const launcherCgroup = a.launcherCgroup ?? (a.cgroup && !cgroup ? a.cgroup : null);
      if (launcherCgroup) removeLauncherCgroup(host, spec.id, child, launcherCgroup);
    }
    const tracked = track(host, running, target, cgroup, { life, afterExit: afterExitOf(spec) });
    const live = host.table.get(spec.id);
    if (spec.health && live?.status === 'running') probeHealth(host, live, spec.health);
    const notify = a.notify;
    if (notify) {
      // STATUS= updates and barriers keep working while the instance runs; closed with it, or with us.
      notify.keep();
      host.notifiers.add(notify);
      void target.gone.then(() => host.notifiers.delete(notify));
      if (spec.watchdogMs !== undefined && live?.status === 'running') {
        watchWatchdog(host, live, notify, spec.watchdogMs);
      }
    }
    // What the launch left re-parented to us (-daemonize's zombie fork) is reapable now that its sessions are known.
    host.reap();
    host.emit('running', { id: spec.id, pid, message: 'running; identity manifest written' });
    return tracked;
  } catch (err) {
    // Nothing said from here on counts.
    a.notify?.close();
    let undone: Abandoned;
    try {
      undone = await host.withRoom(() => abandon(a, spec.abandonGraceMs ?? 2000, host.emit));
      // Proven empty: the cgroup goes (a unit's is systemd's to remove), then the state.
      if (a.cgroup) await removeCgroup(a.cgroup, host.emit, spec.id);
      if (a.launcherCgroup) await removeCgroup(a.launcherCgroup, host.emit, spec.id);
    } catch (abandonErr) {
      // Something of the attempt would not die: its manifest stays, for a
      // later recover() to decide; until then the id is refused.
      host.emit('warning', {
        id: spec.id,
        message: `abandon of ${spec.id} failed (${(abandonErr as Error).message}); its manifest is kept`,
      });
      host.table.move(spec.id, { status: 'deferred', error: abandonErr as Error });
      throw err;
    }
    if (undone.left.length > 0) {
      await quarantineLeft(host, manifest, undone.left, err);
      throw err;
    }
    // State goes only now: every process of the attempt is proven gone. A restart's failed launch is one more
    // end of the instance: its state says backoff or failed instead (a launch undone by close() is not counted).
    const run = {
      id: spec.id,
      life: life?.relaunching ? life : undefined,
      afterExit: afterExitOf(spec),
      pid: a.target?.pid ?? a.child?.pid ?? null,
      token: a.token,
    };
    const after = await settleEnd(host, run, failedLaunch(err), { count: !host.closed });
    if (life?.relaunching) life.pending = after;
    host.emit('abandon', {
      id: spec.id,
      attempt: attemptNo,
      pids: undone.ended,
      error: err,
      message: (err as Error).message,
    });
    throw err;
  }
}

/**
 * An abandon that left running a carrier of the token it would not signal (a
 * daemon that dropped to a uid the launch did not declare): the launch ends
 * here, with no further attempt, the declared paths kept for what may be
 * serving on them, and the id quarantined on disk until the operator, who
 * can tell what it is, releases it. The launch's error says so.
 */
async function quarantineLeft(
  host: LifecycleHost,
  manifest: StartingManifest,
  left: LeftProcess[],
  err: unknown,
): Promise<void> {
  const { id } = manifest;
  const at = new Date().toISOString();
  const field = left.map((l) => l.pid).join(',');
  // No identity (what confirm recorded, if anything, was ended), no cgroup (removed, proven empty).
  const quarantined: QuarantinedManifest = {
    ...manifest,
    state: 'quarantined',
    identity: null,
    cgroup: null,
    quarantine: { reason: ABANDON_LEFT, field, at },
    updatedAt: at,
  };
  try {
    await host.store.write(quarantined);
  } catch (writeErr) {
    host.emit('warning', {
      id,
      message: `could not persist the quarantine of ${id} (${(writeErr as Error).message}): it holds in memory only, and recovery judges its starting manifest afresh`,
    });
  }
  host.table.move(id, { status: 'quarantined', manifest: quarantined, reason: ABANDON_LEFT, field });
  const pids = left.map((l) => `pid ${l.pid} (${l.why})`).join(', ');
  const note = `abandon left ${pids} running, never signalled: ${id} is quarantined (${ABANDON_LEFT}) and its declared paths are kept; once what is left is dealt with, \`custody release ${id}\``;
  host.emit('quarantine', { id, reason: ABANDON_LEFT, field, message: note });
  if (err instanceof Error) err.message = `${err.message}; ${note}`;
}

/** A pid function's launcher held the cgroup its target is not in: it goes once the launcher has exited, if nothing is left in it. */
function removeLauncherCgroup(host: LifecycleHost, id: string, launcher: ProcessHandle, cg: InstanceCgroup): void {
  void launcher.exited
    .then(() => removeCgroup(cg, host.emit, id))
    .catch((err: unknown) => {
      host.emit('warning', {
        id,
        message: `the launcher's cgroup ${cg.path} was not removed (${(err as Error).message}); what is left in it is not signalled`,
      });
    });
}

/** A failed launch as an end: the status it exited with where it did, else one that cannot be known. */
function failedLaunch(err: unknown): LastExit {
  if (err instanceof LaunchExitedError) {
    const status = { code: err.exitCode, signal: err.signal };
    return { ...status, result: resultOf(status) };
  }
  return { code: null, signal: null, result: 'unknown' };
}

/** The caps the manifest records: null where the launch's output does not go to custody's log files. */
function logCaps(options: LaunchSpec['logs']): { maxBytes: number; keep: number } | null {
  if (options === false) return null;
  const { maxBytes, keep } = logLimits(options);
  return { maxBytes, keep };
}

/**
 * The uid the running manifest records besides ours: the declared one; else one the very process dropped to
 * after its exec, as if the launch had declared it; else, for a main process handed off by MAINPID= (a member
 * of the instance, which may run as whatever uid its launcher gave it), the uid it runs as.
 */
function runningUid(
  declared: number | null,
  identity: ProcessIdentity,
  confirmed: ProcessIdentity,
  handedOff: boolean,
): number | null {
  if (declared !== null) return declared;
  if (identity.uid !== confirmed.uid) return identity.uid;
  return handedOff && identity.uid !== process.getuid?.() ? identity.uid : null;
}

/** The identity the running manifest records: what the target is now, where the kernel proves it the one confirmed. */
function settledIdentity(
  host: LifecycleHost,
  id: string,
  confirmed: ProcessIdentity,
  isChild: boolean,
  handedOff: boolean,
): ProcessIdentity {
  const s = settle(confirmed, isChild, handedOff);
  const pid = confirmed.pid;
  if (s.error) {
    host.emit('warning', {
      id,
      pid,
      message: `${id}: could not look at pid ${pid} again before recording it running (${s.error.message}); the identity confirmed at its exec is recorded`,
    });
  } else if (s.changed.length) {
    host.emit('warning', {
      id,
      pid,
      message: `${id}: pid ${pid} changed its ${s.changed.join(' and ')} since ${handedOff ? 'MAINPID= named it' : 'its exec'} (now uid ${s.identity.uid}, argv ${JSON.stringify(s.identity.argv.join(' ').slice(0, 120))}); recorded as it is now`,
    });
  }
  return s.identity;
}
