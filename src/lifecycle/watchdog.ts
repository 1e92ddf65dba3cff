/**
 * The sd_notify watchdog (systemd's WatchdogSec=), for an instance launched
 * with `ready: 'notify'` and `watchdogMs`: once it runs, WATCHDOG=1 from its
 * processes must come at least every watchdogMs (WATCHDOG_USEC tells it how
 * often). A miss, or WATCHDOG=trigger, is SIGABRT to the main process, as
 * systemd sends it (room for a core dump and a stack trace); the end it
 * brings says `result: 'watchdog'`. One that outlives the SIGABRT by as long
 * again is ended through the stop path, told the same. The watch belongs to
 * the instance's life as `running`, like its notify socket; an adopted
 * instance's socket is bound again under its recorded name and the timer
 * starts afresh (src/lifecycle/adopted.ts).
 */
import { TIMED_OUT, within } from '../timing.js';
import type { LifecycleHost } from './host.js';
import type { Running } from './instances.js';
import type { NotifyChannel } from './notify.js';
import { stopFor } from './stop.js';

export function watchWatchdog(host: LifecycleHost, t: Running, notify: NotifyChannel, watchdogMs: number): void {
  const { id } = t.instance;
  const pid = t.handle.pid;
  const current = () => host.table.get(id) === t && !host.closed;
  let fired = false;
  const fire = async (why: string): Promise<void> => {
    if (fired || !current()) return;
    fired = true;
    clearTimeout(timer);
    t.endedBy = 'watchdog';
    host.emit('warning', { id, pid, message: `watchdog: ${why}; SIGABRT to pid ${pid}` });
    t.handle.signal('SIGABRT');
    if ((await within(t.handle.gone, watchdogMs)) !== TIMED_OUT || !current()) return;
    await stopFor(host, t, 'watchdog', 1000).catch((err: unknown) =>
      host.emit('warning', { id, message: `ending ${id} after its watchdog fired: ${(err as Error).message}` }),
    );
  };
  // Unref'd: the watchdog never keeps the agent alive by itself.
  const timer = setTimeout(() => void fire(`no WATCHDOG=1 within ${watchdogMs} ms`), watchdogMs).unref();
  notify.onWatchdog((kind) => {
    if (kind === 'trigger') void fire('WATCHDOG=trigger');
    else if (!fired) timer.refresh();
  });
  void t.handle.gone.then(() => clearTimeout(timer));
}
