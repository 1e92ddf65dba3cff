/**
 * The native backend's spawn path: the child's stdio and pipes, its cgroup,
 * and the pidfd the addon's clone returns, made a pin. Its own module
 * because it owns fds only until the child and its streams do, and every
 * exit from it must close the rest.
 */
import { closeSync, constants as fsc, openSync } from 'node:fs';
import { Socket } from 'node:net';
import { join } from 'node:path';
import { type NativeAddon, spawnedChild } from './addon.js';
import { NativePidRef, type PinContext } from './native-pin.js';
import type { SpawnedChild, SpawnRequest } from './types.js';

/** Spawns req through the addon; the child comes back pinned on `pins`, watched until it is reaped. */
export function spawnNative(addon: NativeAddon, pins: PinContext, req: SpawnRequest): SpawnedChild {
  const c = addon.constants;
  // The child's 0..2; -1: the addon's own /dev/null, already where the child can take it without a dup.
  const fds = [-1, -1, -1];
  // Our end of each pipe, until its stream owns it.
  const ours: Array<number | null> = [null, null, null];
  try {
    for (let i = 0; i < 3; i++) {
      const target = req.stdio[i];
      if (target === 'ignore' || target === undefined) continue;
      if (target === 'inherit') fds[i] = i;
      else if (target === 'pipe') {
        const [r, w] = addon.pipe();
        fds[i] = i === 0 ? r : w;
        ours[i] = i === 0 ? w : r;
      } else fds[i] = target.fd;
    }
    const flags = (req.newSession ? c.SPAWN_NEW_SESSION : 0) | (req.newGroup ? c.SPAWN_NEW_GROUP : 0);
    // Opened here, written by the child: it allocates nothing and opens nothing.
    const procs = req.cgroup ? openSync(join(req.cgroup, 'cgroup.procs'), fsc.O_WRONLY) : -1;
    let packed: number;
    try {
      packed = addon.spawn(
        req.file,
        req.argv,
        req.env,
        req.cwd ?? null,
        fds[0] ?? -1,
        fds[1] ?? -1,
        fds[2] ?? -1,
        flags,
        procs,
      );
    } finally {
      if (procs >= 0) closeSync(procs);
    }
    const { pid, pidfd } = spawnedChild(addon, packed);
    const ref = new NativePidRef(pins, pid, pidfd, 'spawned');
    const stream = (i: number): Socket | null => {
      const fd = ours[i];
      if (fd === null || fd === undefined) return null;
      ours[i] = null;
      return new Socket({ fd, readable: i !== 0, writable: i === 0 });
    };
    return { ref, stdin: stream(0), stdout: stream(1), stderr: stream(2) };
  } finally {
    // The child's ends of the pipes (it holds its own copies now, or never ran), and ours if no stream took them.
    for (let i = 0; i < 3; i++) {
      const child = fds[i] ?? -1;
      if (req.stdio[i] === 'pipe' && child >= 0) closeSync(child);
      const parent = ours[i];
      if (parent !== null && parent !== undefined) closeSync(parent);
    }
  }
}
