import { execFile, execFileSync, spawn as cpSpawn } from 'node:child_process';
import { closeSync, openSync, readdirSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { inspect } from '../../src/process/identity.js';
import { pin } from '../../src/process/pin.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import {
  asNamespaceInit,
  exited,
  hasUnshare,
  isRoot,
  killAndWait,
  MARKER,
  procStat,
  unusedPid,
  waitFor,
} from '../helpers/procs.js';

expectNoLeaks();

/** A perl that forks a child which exits at once and is never waited for: it prints the zombie's pid, then sleeps. */
function zombieParent() {
  return cpSpawn('perl', ['-e', '$| = 1; my $p = fork; exit 0 unless $p; print "$p\\n"; sleep 60', MARKER], {
    stdio: ['ignore', 'pipe', 'ignore'],
  });
}

async function firstLine(stream: NodeJS.ReadableStream): Promise<string> {
  let seen = '';
  for await (const chunk of stream) {
    seen += String(chunk);
    if (seen.includes('\n')) break;
  }
  return seen.split('\n')[0] as string;
}

const nofile = () =>
  execFileSync('prlimit', ['--pid', String(process.pid), '--nofile', '--raw', '--noheadings', '--output=SOFT,HARD'], {
    encoding: 'utf8',
  })
    .trim()
    .split(/\s+/);

/** The lowest fd number not open in this process: the one the next open() gets, as this one got it. */
function lowestFreeFd(): number {
  const fd = openSync('/dev/null', 'r');
  closeSync(fd);
  return fd;
}

const SLEEPER_ARGV = ['perl', '-e', 'sleep 60', MARKER];

/** A sleeper past its exec: until then its cmdline is the fork's (or empty, inside execve). */
async function execdSleeper() {
  const child = cpSpawn(SLEEPER_ARGV[0] as string, SLEEPER_ARGV.slice(1), { stdio: 'ignore' });
  await waitFor(() => inspect(child.pid!).argv.includes(MARKER), 5000, 'the sleeper to exec');
  return child;
}

describe(`pin (${backend.name})`, () => {
  it('pins a live process with the identity read under the pin, and signals through it', async () => {
    const child = await execdSleeper();
    try {
      const pinned = pin(child.pid!);
      expect(pinned).not.toBeNull();
      const { identity, handle } = pinned!;
      try {
        // The same process as a separate read names (its scheduling state may move between the two).
        const { state: _now, ...again } = inspect(child.pid!);
        expect(identity).toMatchObject(again);
        expect(identity.argv).toEqual(SLEEPER_ARGV);
        expect(handle.pid).toBe(child.pid);
        expect(handle.identity).toBe(identity);
        expect(handle.signal('SIGKILL')).toBe(true);
        await handle.gone;
      } finally {
        handle.close();
      }
      await exited(child);
    } finally {
      await killAndWait(child);
    }
  });

  it('pins a zombie as the exited process it is, not as gone', async () => {
    const parent = zombieParent();
    try {
      const zombie = Number(await firstLine(parent.stdout!));
      await waitFor(() => procStat(zombie)?.[0] === 'Z', 5000, 'the fork to exit');
      const pinned = pin(zombie);
      expect(pinned).not.toBeNull();
      try {
        expect(pinned!.identity.state).toBe('Z');
        expect(pinned!.identity.ppid).toBe(parent.pid);
        // Its exit is seen through the pin (a pidfd polls readable; the js poller reads Z).
        await pinned!.handle.gone;
      } finally {
        pinned!.handle.close();
      }
    } finally {
      await killAndWait(parent);
    }
  });

  it('returns null for a pid with no process', () => {
    expect(pin(unusedPid())).toBeNull();
  });

  it('takes a thread id for gone by default, and refuses it as ERR_CUSTODY_NOT_A_PROCESS when asked to', () => {
    const tid = Number(readdirSync(`/proc/${process.pid}/task`).find((t) => t !== String(process.pid)));
    expect(tid).toBeGreaterThan(0);
    const before = readdirSync('/proc/self/fd').length;
    expect(pin(tid)).toBeNull();
    expect(() => pin(tid, { thread: 'refuse' })).toThrow(
      expect.objectContaining({ code: 'ERR_CUSTODY_NOT_A_PROCESS', tgid: process.pid }),
    );
    expect(readdirSync('/proc/self/fd')).toHaveLength(before);
  });

  it('throws EMFILE, never null, when no fd can be opened, and leaves nothing open', async () => {
    const child = await execdSleeper();
    const [soft, hard] = nofile();
    // Kept open while the limit is low, closed before it is raised again: the fds prlimit's spawn needs.
    const reserve = Array.from({ length: 8 }, () => openSync('/dev/null', 'r'));
    let lowered = false;
    try {
      const limit = lowestFreeFd();
      execFileSync('prlimit', ['--pid', String(process.pid), `--nofile=${limit}:${hard}`], { stdio: 'ignore' });
      lowered = true;
      expect(() => pin(child.pid!)).toThrow(expect.objectContaining({ code: 'EMFILE' }));
      expect(() => pin(child.pid!, { reapIfChild: true, thread: 'refuse' })).toThrow(
        expect.objectContaining({ code: 'EMFILE' }),
      );
    } finally {
      for (const fd of reserve) closeSync(fd);
      if (lowered)
        execFileSync('prlimit', ['--pid', String(process.pid), `--nofile=${soft}:${hard}`], { stdio: 'ignore' });
      await killAndWait(child);
    }
    expect(nofile()).toEqual([soft, hard]);
  });

  it('pins the new owner of a reused pid as another process, never with the old identity', {
    timeout: 60_000,
  }, async (ctx) => {
    ctx.skip(!(isRoot() && hasUnshare()), 'needs root and unshare --pid: forces PID reuse through ns_last_pid');
    const trials = 3;
    const { stdout } = await promisify(execFile)(
      'unshare',
      asNamespaceInit(join(import.meta.dirname, '..', 'fixtures', 'pin-reuse.mjs'), String(trials)),
      { env: { ...process.env, CUSTODY_BACKEND: backend.name }, timeout: 50_000 },
    );
    const r = JSON.parse(stdout.trim().split('\n').pop() as string);
    expect(r.errors).toEqual([]);
    expect(r.trials).toBe(trials);
    expect(r.samePinnedIdentity).toBe(0);
    if (backend.name === 'native') {
      // The pidfs id tells them apart even within one clock tick, and the old pidfd reaches nobody.
      for (const v of Object.keys(r.verdicts)) expect(['reused:pidfsId', 'reused:pidfsId (same tick)']).toContain(v);
      expect(r.oldPinSignalled).toBe(0);
    } else {
      // Start ticks alone: within one tick only the argv tells them apart, and the old pin may reach the new owner.
      for (const v of Object.keys(r.verdicts)) expect(['reused:startTicks', 'mismatch:argv (same tick)']).toContain(v);
      expect(r.oldPinSignalled).toBeLessThanOrEqual(r.sameTick);
    }
  });
});
