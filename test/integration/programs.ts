/**
 * Real software no one here wrote, as the integration suites run it: where it
 * is installed (they skip, saying why, where it is not), and how QEMU idles.
 */
import { statSync } from 'node:fs';
import { join } from 'node:path';
import { Supervisor, type CustodyEvent, type SupervisorOptions } from '../../src/index.js';
import { MARKER } from '../helpers/procs.js';

/** A program's path if it is installed (PATH and the sbin dirs a non-login shell may lack). */
export function installed(name: string): string | null {
  for (const dir of [...(process.env.PATH ?? '').split(':'), '/usr/sbin', '/sbin', '/usr/bin']) {
    const p = join(dir, name);
    try {
      if (dir && statSync(p).isFile()) return p;
    } catch {
      // not here
    }
  }
  return null;
}

/** start-stop-daemon's argv for a background start: it forks, writes the pidfile (the fork's pid), then the fork execs. */
export const ssdStart = (pidfile: string, exec: string, args: string[]) => [
  '--start',
  '--background',
  '--make-pidfile',
  '--pidfile',
  pidfile,
  '--exec',
  exec,
  '--',
  ...args,
];

/** A QEMU that idles cheaply: no machine, no devices, no display; QMP on a unix socket; named after the token. */
export const qemuArgs = (token: string, qmp: string, extra: string[] = []) => [
  '-name',
  `${MARKER}-${token}`,
  '-machine',
  'none',
  '-nodefaults',
  '-display',
  'none',
  '-qmp',
  `unix:${qmp},server=on,wait=off`,
  ...extra,
];

/**
 * An agent that restarts: a supervisor on `stateDir`, reopened by open() as a restarted agent would (the
 * last one closed first, its instances left running). `onCleanup` gets what ends it: the instances still
 * running stopped, the supervisor closed.
 */
export function restartingAgent(
  options: Omit<SupervisorOptions, 'onEvent'>,
  onCleanup: (fn: () => Promise<void>) => void,
) {
  const events: CustodyEvent[] = [];
  let current: Supervisor | null = null;
  onCleanup(async () => {
    if (!current) return;
    for (const i of current.list()) if (i.status === 'running') await current.stop(i.id, { graceMs: 5000 });
    await current.close();
  });
  return {
    events,
    async open() {
      await current?.close();
      const r = await Supervisor.open({ ...options, onEvent: (e) => events.push(e) });
      current = r.supervisor;
      return r;
    },
  };
}
