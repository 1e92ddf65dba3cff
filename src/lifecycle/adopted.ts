/**
 * An instance recovery proved and hands over: tracked as running, with what
 * keeps it alive that its manifest cannot hold (functions) taken from the
 * spec the application handed back (open({ specs })): its health probe, its
 * afterExit hook, its restart policy's next runs. The recorded policy and
 * budget govern the run it adopts. Without a spec, what was recorded but
 * cannot run is said, as a warning, once.
 */
import type { InstanceCgroup } from '../process/cgroup.js';
import type { ProcessHandle } from '../process/handle.js';
import type { Manifest } from '../state/manifest.js';
import { recordedLife } from './ends.js';
import { track } from './exits.js';
import { probeHealth } from './health.js';
import type { LifecycleHost } from './host.js';
import { afterExitOf } from './instances.js';
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
  if (was?.watchdogMs != null)
    warn(
      `${m.id}'s watchdog is not bound again after an agent restart: its notify socket went with the supervisor that launched it`,
    );
}
