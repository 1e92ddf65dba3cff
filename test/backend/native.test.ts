// The native backend (src/backend/native.ts): a pin is a pidfd, closed when
// the pin is; a process that is not our child still ends with its real
// status where the kernel keeps it (PIDFD_GET_INFO, Linux >= 6.15); our own
// children are ours to reap and nobody else's until they are reaped. The js
// project has no native backend to exercise: there these are skipped, and
// its leak check still runs.
import { spawn as cpSpawn } from 'node:child_process';
import { readdirSync, readlinkSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { backend, capabilities } from '../../src/backend/index.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { exited, killAndWait, MARKER, procStat, untilReady, waitFor } from '../helpers/procs.js';
import { PYTHON } from '../helpers/supervisor.js';

const cleanups = cleanupAfterEach({ marker: MARKER });

const pidfds = () =>
  readdirSync('/proc/self/fd').filter((fd) => {
    try {
      return readlinkSync(`/proc/self/fd/${fd}`) === 'anon_inode:[pidfd]';
    } catch {
      return false;
    }
  }).length;

/** A child_process child (not the addon's) that exits with `code` once its stdin closes. */
async function waiter(code: number) {
  const child = cpSpawn(
    PYTHON,
    ['-c', `import sys; print("ready", flush=True); sys.stdin.read(); sys.exit(${code})`, MARKER],
    {
      stdio: ['pipe', 'pipe', 'ignore'],
    },
  );
  cleanups.push(() => killAndWait(child));
  await untilReady(child.stdout!);
  return child;
}

describe.skipIf(backend.name !== 'native')('the native backend', () => {
  it('a pin holds one pidfd, given back when the pin is closed', async () => {
    const child = await waiter(0);
    const before = pidfds();
    const { ref } = backend.inspectPinned(child.pid!);
    expect(pidfds()).toBe(before + 1);
    expect(ref.signal(0)).toBe(true);
    ref.close();
    expect(pidfds()).toBe(before);
    expect(ref.signal(0)).toBe(false);
  });

  it.skipIf(!capabilities().exitInfoOfNonChildren)(
    'a process that is not our child ends with its own exit code, from the kernel',
    async () => {
      const child = await waiter(3);
      const { ref } = backend.inspectPinned(child.pid!);
      cleanups.push(() => ref.close());
      child.stdin!.end();
      await exited(child);
      expect(child.exitCode).toBe(3);
      expect(await ref.exited).toEqual({ code: 3, signal: null });
    },
  );

  it('its own child is marked spawned here until reaped, and reaped with its status', async () => {
    const spawned = backend.spawn({
      file: '/bin/sh',
      argv: ['sh', '-c', 'read x; exit 4', MARKER],
      env: null,
      cwd: undefined,
      stdio: ['pipe', 'ignore', 'ignore'],
      newSession: true,
      newGroup: false,
    });
    const { pid } = spawned.ref;
    cleanups.push(async () => {
      spawned.ref.signal(9);
      await spawned.ref.exited;
      spawned.ref.close();
    });
    expect(backend.spawnedHere(pid)).toBe(true);
    expect(procStat(pid)?.[3]).toBe(String(pid)); // its own session
    spawned.stdin!.end();
    expect(await spawned.ref.exited).toEqual({ code: 4, signal: null });
    await waitFor(() => procStat(pid)?.[1] !== String(process.pid), 5000, 'the reap');
    expect(backend.spawnedHere(pid)).toBe(false);
  });
});
