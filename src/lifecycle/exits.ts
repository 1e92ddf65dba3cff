/**
 * A tracked instance's main process and its exit: watching it once it runs
 * (launched or adopted), and, when it exits on its own, the cleanup as
 * systemd does it for a service: what it left in its cgroup (or, without
 * one, in the session it led) is ended, its declared paths and its state go.
 * The cleanup is a stop like any other: the `stopping` manifest is written
 * before anything is signalled, and one that fails halfway leaves the
 * instance `stopping` for the next stop() to finish.
 */
import { holdsLoop } from '../options.js';
import { awaitedExit } from '../process/awaited.js';
import { describeExit, resultOf } from '../process/exit.js';
import { holdExit, type ProcessHandle, releaseExit } from '../process/handle.js';
import type { InstanceCgroup } from '../process/cgroup.js';
import { removeCgroup } from '../process/cgroup-tree.js';
import { sessionLeftovers, terminateMembers } from '../process/tree.js';
import { errorTail, type LogFiles, logPaths, OUTPUT_TAIL_BYTES } from '../state/logs.js';
import { removeDeclaredPaths } from '../state/paths.js';
import type { Manifest } from '../state/manifest.js';
import type { ExitStatus, OutputTails } from '../types.js';
import type { LifecycleHost } from './host.js';
import { type AfterExitHook, persistStopping, type Exited, type Life, type Running } from './instances.js';
import { rest, settleEnd, viewOf } from './ends.js';
import type { Instance } from './launch.js';
import { terminateInstance } from './stop.js';

/** Empty declared paths, shared by every instance that has none. */
const NO_PATHS: readonly string[] = Object.freeze([]);

/** The longest an exited main's session scan is waited for (its zombie is held meanwhile; a busy table takes tens of ms). */
const LEFTOVER_SCAN_MS = 500;

/** Registers an adopted or launched process as running and watches its exit. */
export function track(
  host: LifecycleHost,
  manifest: Manifest,
  handle: ProcessHandle,
  cgroup: InstanceCgroup | null,
  { life, afterExit }: { life?: Life | undefined; afterExit?: AfterExitHook | undefined } = {},
): Instance {
  const identity = manifest.identity;
  if (!identity) throw new Error(`internal: ${manifest.id} is tracked without a recorded identity`);
  const fresh: Instance = {
    id: manifest.id,
    pid: handle.pid,
    token: manifest.token,
    identity,
    exited: life ? life.exited : awaitedExit(handle),
    cgroup: cgroup?.path ?? null,
    lastExit: null,
    restarts: 0,
  };
  // With a restart policy, the one Instance the agent holds follows each run.
  const instance = life ? viewOf(life, fresh) : fresh;
  const running: Running = {
    status: 'running',
    instance,
    handle,
    cgroup,
    session: manifest.session ?? null,
    paths: manifest.paths.length ? manifest.paths : NO_PATHS,
    logFiles: manifest.logs === null ? null : logPaths(host.logs.stateDir, manifest.id),
    ...(life ? { life } : {}),
    ...(afterExit ? { afterExit } : {}),
  };
  host.table.move(manifest.id, running);
  if (!holdsLoop(host.options)) handle.unref();
  // Bound rather than a closure: one small object per instance, no context.
  void handle.exited.then(onExit.bind(null, host, instance, handle));
  holdExitOf(host, running);
  void host.logs.watch(manifest.id, manifest.logs);
  return instance;
}

/**
 * Without a cgroup, the session its main process leads (a detached launch's) is what holds the instance's
 * other processes: its zombie is kept when it exits on its own, so that what it left there is found while
 * the session's id can be no one else's (onGone). Native only (the js backend's libuv reaps at once).
 */
export function holdExitOf(host: LifecycleHost, t: Running): void {
  if (t.cgroup || t.session === null || t.session !== t.handle.pid) return;
  holdExit(t.handle, onGone.bind(null, host, t));
}

/** The main process exited on its own, its zombie held: find what it left in its session, then reap it. */
async function onGone(host: LifecycleHost, t: Running): Promise<void> {
  const { id } = t.instance;
  const ours = () => host.table.get(id) === t && !host.closed;
  // A stop in flight keeps the zombie to its end (it anchors the session; terminateTree reaps it).
  const stopOwns = () => {
    const now = host.table.get(id);
    return now?.status === 'stopping' && now.from === t;
  };
  if (stopOwns()) return;
  try {
    if (!ours() || t.session === null) return;
    const found = await sessionLeftovers(t.session, LEFTOVER_SCAN_MS);
    // A stop that began meanwhile owns the instance now.
    if (ours()) t.leftovers = found;
    else for (const h of found) h.close();
  } catch (err) {
    host.emit('warning', {
      id,
      message: `could not look for what ${id} left in its session: ${(err as Error).message}`,
    });
  } finally {
    // Reaped: onExit follows.
    if (!stopOwns()) releaseExit(t.handle);
  }
}

function onExit(host: LifecycleHost, instance: Instance, handle: ProcessHandle, status: ExitStatus): void {
  const { id } = instance;
  const t = host.table.get(id);
  // A stop in flight, or a later launch (or restart) of the id, owns what happens now.
  if (t?.status !== 'running' || t.instance !== instance || t.handle !== handle || host.closed) return;
  host.logs.unwatch(id);
  const { cgroup, session, paths, life, afterExit } = t;
  const exited: Exited = {
    status: 'exited',
    instance,
    handle,
    cgroup,
    session,
    paths,
    exit: status,
    cleanup: Promise.resolve(),
    ...(life ? { life } : {}),
    ...(afterExit ? { afterExit } : {}),
  };
  host.table.move(id, exited);
  // Read before the cleanup removes the cgroup: an OOM kill is counted there, not in the status.
  const result = t.endedBy ?? resultOf(status, oomKillsOf(host, id, cgroup));
  instance.lastExit = { ...status, result };
  exited.cleanup = cleanUpAfter(host, exited, t.leftovers ?? []);
  host.emit('exit', {
    id,
    pid: handle.pid,
    code: status.code,
    signal: status.signal,
    result,
    ...outputTails(t.logFiles),
    message: `exited on its own (${describeExit(status)}; ${result})`,
  });
  // Proven gone (its pidfd said so): stale sockets and state go with it,
  // and, as systemd does when a service's main process exits, whatever it
  // left in its cgroup (the cgroup first: the state goes only once it is empty).
  removeDeclaredPaths(paths, host.emit, id);
}

/** The OOM kills its cgroup counted; a cgroup that cannot be read is a warning and counts none. */
function oomKillsOf(host: LifecycleHost, id: string, cgroup: InstanceCgroup | null): number {
  if (!cgroup) return 0;
  try {
    return cgroup.oomKills();
  } catch (err) {
    host.emit('warning', { id, message: `could not read ${id}'s memory.events: ${(err as Error).message}` });
    return 0;
  }
}

/** What it last wrote, as a failed launch's error carries it: read as it exits, before a next launch rotates the logs. */
function outputTails(files: LogFiles | null): OutputTails {
  const tails: OutputTails = {};
  if (!files) return tails;
  // Absent rather than undefined: an event is a plain record, compared and serialised as such.
  const stderrTail = errorTail(files.stderr, OUTPUT_TAIL_BYTES);
  const stdoutTail = errorTail(files.stdout, OUTPUT_TAIL_BYTES);
  if (stderrTail !== undefined) tails.stderrTail = stderrTail;
  if (stdoutTail !== undefined) tails.stdoutTail = stdoutTail;
  return tails;
}

function cleanUpAfter(host: LifecycleHost, t: Exited, leftovers: ProcessHandle[]): Promise<void> {
  const { id } = t.instance;
  let persisted = false;
  // Pinned still, until endLeftovers has ended and closed them: a failure before that hands them to the next stop().
  let pinned = leftovers;
  return host
    .inFlight(
      (async () => {
        // After the exit event: what follows may write (and fsync) the state on this thread.
        await Promise.resolve();
        const end = t.instance.lastExit ?? { ...t.exit, result: resultOf(t.exit) };
        if (t.cgroup ? t.cgroup.populated() : leftovers.length > 0)
          persisted = await persistStopping(host.store, id, end.result);
        if (t.cgroup) {
          const { leftovers: killed } = await terminateInstance(host, t, 0, undefined);
          if (killed?.length) {
            const message = `${id}: ${killed.length} process(es) its main process left in its cgroup were killed (cgroup.kill)`;
            host.emit('warning', { id, pids: killed, message });
          }
          await removeCgroup(t.cgroup, host.emit, id);
        } else if (leftovers.length > 0) {
          pinned = [];
          await endLeftovers(host, t, leftovers);
        }
        // Its state goes, or says backoff where its policy restarts it; the restart is armed only now.
        const run = { id, life: t.life, afterExit: t.afterExit, pid: t.handle.pid, token: t.instance.token };
        const after = await settleEnd(host, run, end);
        if (after && t.life) rest(host, id, t, after, t.life);
      })(),
    )
    .catch((err: unknown) => {
      host.emit('warning', {
        id,
        message: `could not clean up after an exited instance: ${(err as Error).message}`,
      });
      // Halfway: the next stop() finishes it, as it finishes a stop that failed.
      const failed = err as Error;
      const members = pinned;
      if (!host.table.moveFrom(id, t, { status: 'stopping', from: t, persisted, done: null, failed, members }))
        for (const h of members) h.close();
    });
}

/** Ends what an exited main process left in its session (onGone found and pinned them), as its cgroup's would be. */
async function endLeftovers(host: LifecycleHost, t: Exited, leftovers: ProcessHandle[]): Promise<void> {
  const { id } = t.instance;
  try {
    // The leader is reaped: the session counts only while one of them is in it.
    const { members } = await terminateMembers(leftovers, {
      session: t.session,
      sessionEachPass: true,
      reapIfChild: true,
      graceMs: 0,
    });
    const message = `${id}: ${members.length} process(es) its main process left in its session were killed`;
    host.emit('warning', { id, pids: members, message });
  } catch (err) {
    // One that cannot be signalled (EPERM: another uid's): said, and the main's state goes all the same.
    host.emit('warning', {
      id,
      pids: leftovers.map((h) => h.pid),
      message: `${id}: could not end what its main process left in its session: ${(err as Error).message}`,
    });
  } finally {
    for (const h of leftovers) h.close();
  }
}
