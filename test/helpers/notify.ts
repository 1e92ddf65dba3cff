/**
 * What the ready: 'notify' suites share: the sd_notify daemon fixture, finding it once it runs with its
 * NOTIFY_SOCKET, and a launch of it held before READY=1 until a file exists.
 */
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import type { Supervisor } from '../../src/index.js';
import { processesWithMarker } from './leaks.js';
import { MARKER, waitFor } from './procs.js';
import { FIXTURES, PYTHON } from './supervisor.js';

export const DAEMON = join(FIXTURES, 'notify-daemon.py');

/** NOTIFY_SOCKET as the daemon got it, read from its environment. */
export function notifySocketOf(pid: number): string {
  const env = readFileSync(`/proc/${pid}/environ`, 'latin1').split('\0');
  return env.find((kv) => kv.startsWith('NOTIFY_SOCKET='))!.slice('NOTIFY_SOCKET='.length);
}

/** The launched daemon (found by its token; not a shell that launches it), once it runs, and the NOTIFY_SOCKET it was given. */
export async function daemonOf(
  token: () => string,
): Promise<{ daemon: { pid: number; cmd: string }; address: string }> {
  const daemon = await waitFor(
    () =>
      processesWithMarker(MARKER).find(
        (p) => p.cmd.includes(DAEMON) && !!token() && p.cmd.includes(token()) && !p.cmd.startsWith('/bin/sh'),
      ),
    5000,
    'the daemon',
  );
  const address = await waitFor(
    () => {
      try {
        return notifySocketOf(daemon.pid);
      } catch {
        return null;
      }
    },
    5000,
    'its NOTIFY_SOCKET',
  );
  return { daemon, address };
}

/** Launches the daemon, which says READY=1 only once `go` exists; `token()` is the launch's once spawned. */
export function launchHeld(
  supervisor: Supervisor,
  id: string,
  go: string,
  extra: string[] = [],
  readyTimeoutMs = 20_000,
) {
  let token = '';
  const launching = supervisor.launch({
    id,
    command: PYTHON,
    args: (t) => {
      token = t;
      return [DAEMON, MARKER, t, '--wait-file', go, ...extra, '--lifetime', '30'];
    },
    ready: 'notify',
    readyTimeoutMs,
  });
  return { launching, token: () => token };
}
