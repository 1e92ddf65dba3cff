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
import type { ExecAttrs, RlimitName, SpawnedChild, SpawnRequest } from './types.js';

/**
 * The exec attributes as addon.spawn() takes them (native/spawn.cc, kExecUmask): one array of numbers,
 * [which, umask, oomScoreAdj, uid, gid, groupCount, ...groups, (resource, soft, hard)...]; null for none.
 */
export function execArray(addon: NativeAddon, x: ExecAttrs | null | undefined): number[] | null {
  if (!x) return null;
  const c = addon.constants;
  const which =
    (x.umask !== null ? c.EXEC_UMASK : 0) |
    (x.oomScoreAdj !== null ? c.EXEC_OOM_SCORE_ADJ : 0) |
    (x.noNewPrivileges ? c.EXEC_NO_NEW_PRIVS : 0) |
    (x.runAs ? c.EXEC_RUN_AS : 0);
  const groups = x.runAs?.groups ?? [];
  const out = [which, x.umask ?? 0, x.oomScoreAdj ?? 0, x.runAs?.uid ?? 0, x.runAs?.gid ?? 0, groups.length, ...groups];
  for (const l of x.rlimits) out.push(c[RESOURCE[l.name]], l.soft, l.hard);
  return out;
}

const RESOURCE = {
  nofile: 'RLIMIT_NOFILE',
  memlock: 'RLIMIT_MEMLOCK',
  core: 'RLIMIT_CORE',
  nproc: 'RLIMIT_NPROC',
  as: 'RLIMIT_AS',
  fsize: 'RLIMIT_FSIZE',
  stack: 'RLIMIT_STACK',
  cpu: 'RLIMIT_CPU',
} as const satisfies Record<RlimitName, string>;

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
        execArray(addon, req.exec),
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
