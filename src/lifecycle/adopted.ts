/**
 * An instance recovery proved and hands over: tracked as running, with what
 * keeps it alive that its manifest cannot hold (functions) taken from the
 * spec the application handed back (open({ specs })): its health probe, its
 * afterExit hook, its restart policy's next runs. The recorded policy and
 * budget govern the run it adopts, and so does its recorded watchdog: its
 * notify socket is bound again. Without a spec, what was recorded but cannot
 * run is said, as a warning, once.
 */
import type { InstanceCgroup } from '../process/cgroup.js';
import type { ProcessHandle } from '../process/handle.js';
import type { Manifest } from '../state/manifest.js';
import { recordedLife } from './ends.js';
import { track } from './exits.js';
import { probeHealth } from './health.js';
import type { LifecycleHost } from './host.js';
import { afterExitOf, type Running } from './instances.js';
import { type NotifyLaunch, NotifyChannel } from './notify.js';
import { watchWatchdog } from './watchdog.js';
import { recordedClaim } from '../recovery/claims.js';
import type { LaunchSpec } from './launch.js';

export function adopt(
  host: LifecycleHost,
  m: Manifest,
  handle: ProcessHandle,
  cgroup: InstanceCgroup | null,
  spec: LaunchSpec | null,
): void {
  const life = m.restart ? recordedLife(m.restart, spec) : undefined;
  track(host, m, handle, cgroup, { life, afterExit: afterExitOf(spec) });
  const t = host.table.get(m.id);
  if (t?.status !== 'running') return;
  const was = m.keepAlive;
  const warn = (message: string) => host.emit('warning', { id: m.id, message });
  if (spec?.health) probeHealth(host, t, spec.health);
  else if (was?.health)
    warn(`${m.id} was launched with a health probe; without its spec in open({ specs }) it is not probed`);
  if (was?.afterExit && !spec?.afterExit)
    warn(`${m.id} was launched with an afterExit hook; without its spec in open({ specs }) none runs when it ends`);
  if (was?.watchdogMs != null) watchAgain(host, t, m, was.watchdogMs, warn);
}

/**
 * The watchdog of an adopted instance: its notify socket bound again under the name recorded at launch (the
 * instance's NOTIFY_SOCKET), its senders judged by the recorded claim, and the timer started afresh (its
 * WATCHDOG_USEC is the recorded one). A name another process holds now, or none recorded: a warning, and
 * no watchdog.
 */
function watchAgain(host: LifecycleHost, t: Running, m: Manifest, watchdogMs: number, warn: (s: string) => void): void {
  if (!m.notify || !m.identity) {
    warn(`${m.id}'s watchdog is not bound again: its manifest records no notify socket (written before custody 0.3)`);
    return;
  }
  const identity = m.identity;
  const adopted: NotifyLaunch = {
    id: m.id,
    child: () => null,
    target: () => ({ handle: t.handle, identity }),
    session: () => t.session,
    claim: () => recordedClaim(m, t.cgroup?.node ?? null),
    // Running: a MAINPID= is refused before it gets here.
    handOff: (next) => next.handle.close(),
    exitedError: async () => new Error(`${m.id} exited`),
  };
  let channel: NotifyChannel;
  try {
    channel = NotifyChannel.open(adopted, host.emit, m.notify);
  } catch (err) {
    warn(
      `${m.id}'s watchdog is off: its notify socket @${m.notify} could not be bound again (${(err as Error).message})`,
    );
    return;
  }
  channel.keep();
  host.notifiers.add(channel);
  void t.handle.gone.then(() => host.notifiers.delete(channel));
  watchWatchdog(host, t, channel, watchdogMs);
}
