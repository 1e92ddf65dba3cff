// A program custody spawns holds nothing of the agent's but the stdio it was
// given. The hostile case is what the agent itself inherited. Node marks the
// fds it was started with close-on-exec only up to the first gap past fd 15
// (libuv's uv_disable_stdio_inheritance), so a wrapper script's
// `exec 200>/run/agent.lock; flock 200`, the flock(1) idiom, leaves the
// agent holding that lock, and a caller's pipe at such an fd, without
// O_CLOEXEC. A VM monitor that inherited them would keep the lock held after
// the agent exits, so the agent cannot start again while its VMs run, and
// keep the caller waiting for end-of-file as long as the VM runs.
import { spawn as cpSpawn, execFileSync, spawnSync } from 'node:child_process';
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { join } from 'node:path';
import type { Readable } from 'node:stream';
import { pathToFileURL } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { isGone, isRoot, tmpDir, waitFor } from '../helpers/procs.js';
import { plainEnv } from '../integration/plain-env.js';

expectNoLeaks();

const DIST = pathToFileURL(join(import.meta.dirname, '..', '..', 'dist', 'index.js')).href;

// Spawns a detached sleep (a long-lived daemon of its own session), prints
// its pid and exits, leaving it running.
const AGENT = `
import { spawn } from ${JSON.stringify(DIST)};
const h = spawn('/bin/sleep', ['30'], { detached: true });
h.unref();
process.stdout.write(String(h.pid));
`;

// The wrapper (bash: dash takes fds 0..9 only): the lock at fd 200, the caller's
// pipe (our stdout) also at fd 201, then the agent.
const WRAPPER = 'exec 200>"$0" 201>&1 && flock -n 200 && exec "$1" --input-type=module -e "$2"';

let dir: ReturnType<typeof tmpDir>;
beforeAll(() => {
  dir = tmpDir('custody-fds-');
});
afterAll(() => dir.cleanup());

/** Watches a stream for end-of-file from now on; `within(ms)` says whether it came, waiting at most ms more. */
function watchEnd(stream: Readable): { within(ms: number): Promise<'ended' | 'open'> } {
  let ended = false;
  let wake = () => {};
  // child_process resumes an unread stdio stream when the child exits, so
  // 'end' can come before anyone awaits it: listen from the start.
  stream.once('end', () => {
    ended = true;
    wake();
  });
  stream.resume();
  return {
    within: (ms) =>
      new Promise((resolve) => {
        if (ended) return resolve('ended');
        const timer = setTimeout(() => resolve('open'), ms);
        wake = () => {
          clearTimeout(timer);
          resolve('ended');
        };
      }),
  };
}

/** Kills a process that is not our child (init reaps it) by pid, and waits until it is dead: gone or a zombie. */
async function killOrphan(pid: number): Promise<void> {
  try {
    process.kill(pid, 'SIGKILL');
  } catch {
    return;
  }
  await waitFor(() => isGone(pid), 5000, `pid ${pid} to die after SIGKILL`);
}

/** Runs the agent under `wrapper` (bash -c: $0 the lock, $1 node, $2 the agent); resolves once it exited, with the daemon's pid and the caller's pipe. */
async function runAgent(
  wrapper: string,
  lock: string,
): Promise<{ daemon: number; caller: ReturnType<typeof watchEnd> }> {
  const agent = cpSpawn('/bin/bash', ['-c', wrapper, lock, process.execPath, AGENT], {
    env: { ...process.env, CUSTODY_BACKEND: backend.name },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  const stdout = agent.stdout as Readable;
  let out = '';
  stdout.setEncoding('utf8');
  stdout.on('data', (d: string) => {
    out += d;
  });
  const caller = watchEnd(stdout);
  const code = await new Promise<number | null>((r) => agent.once('exit', (c) => r(c)));
  expect(code).toBe(0);
  const daemon = Number(out);
  expect(Number.isInteger(daemon) && daemon > 0).toBe(true);
  expect(readlinkSync(`/proc/${daemon}/exe`)).toBe('/usr/bin/sleep');
  return { daemon, caller };
}

const lockIsFree = (lock: string) => spawnSync('flock', ['-n', lock, 'true']).status === 0;

describe('a program spawned by an agent whose wrapper left it a lock and a pipe at fds above 15', () => {
  it('holds neither: the lock is free and the caller sees end-of-file as soon as the agent exits', async () => {
    const lock = join(dir.path, 'agent.lock');
    const { daemon, caller } = await runAgent(WRAPPER, lock);
    try {
      // The daemon still runs; the lock and the pipe must be free anyway.
      expect(lockIsFree(lock)).toBe(true);
      expect(await caller.within(5000)).toBe('ended');
      const held = readdirSync(`/proc/${daemon}/fd`).map((fd) => [
        Number(fd),
        readlinkSync(`/proc/${daemon}/fd/${fd}`),
      ]);
      // stdio 'ignore' is /dev/null on both backends. Above it, the native
      // spawn closes everything (close_range); child_process cannot close an
      // fd, so the js backend hands the program /dev/null in its place.
      if (backend.name === 'native') expect(held.filter(([fd]) => (fd as number) > 2)).toEqual([]);
      for (const [, target] of held) expect(target).toBe('/dev/null');
    } finally {
      await killOrphan(daemon);
    }
  });

  it('still spawns when the fd limit was lowered below those fds; the native spawn still closes them', async () => {
    // child_process cannot put anything at an fd at or above the soft limit:
    // the js backend leaves those as child_process does rather than fail.
    const lock = join(dir.path, 'low-limit.lock');
    const { daemon, caller } = await runAgent(WRAPPER.replace('&& exec "$1"', '&& ulimit -n 64 && exec "$1"'), lock);
    try {
      expect(readFileSync(`/proc/${daemon}/limits`, 'utf8')).toMatch(/^Max open files\s+64\s/m);
      if (backend.name === 'native') {
        expect(lockIsFree(lock)).toBe(true);
        expect(await caller.within(5000)).toBe('ended');
      }
    } finally {
      await killOrphan(daemon);
    }
  });

  it('still spawns where the agent has no /proc of its own to read its fds from', async (ctx) => {
    // A mount namespace with an empty tmpfs over /proc: what a minimal
    // container, or a /proc of a pid namespace we are not in, gives. The
    // fds cannot be read there; the spawn must not fail for it.
    ctx.skip(!isRoot(), 'needs root: unshare --mount');
    const agent = `
      import { spawn } from ${JSON.stringify(DIST)};
      const h = spawn('/bin/true', [], { stdio: 'ignore' });
      process.stdout.write(JSON.stringify(await h.exited));`;
    const out = execFileSync(
      'unshare',
      [
        '--mount',
        '/bin/sh',
        '-c',
        'mount -t tmpfs none /proc && exec "$0" --input-type=module -e "$1"',
        process.execPath,
        agent,
      ],
      // Without the sanitizer run's preload: LeakSanitizer itself needs /proc.
      { env: { ...plainEnv(), CUSTODY_BACKEND: backend.name }, encoding: 'utf8', timeout: 30_000 },
    );
    expect(JSON.parse(out)).toEqual({ code: 0, signal: null });
  });

  it('a spawn without fds to spare fails with EMFILE, never as a missing program', () => {
    // The native spawn needs one fd (the pidfd): none spare. The js one, given
    // one spare, has too few for the child's stdio, and child_process says so
    // only on the next tick, the program unnamed.
    const spare = backend.name === 'js' ? 1 : 0;
    const agent = `
      import { openSync, closeSync } from 'node:fs';
      import { spawn } from ${JSON.stringify(DIST)};
      const hog = [];
      try { for (let i = 0; i < 100000; i++) hog.push(openSync('/dev/null', 'r')); } catch {}
      for (let i = 0; i < ${spare}; i++) closeSync(hog.pop());
      let code = 'spawned';
      try { spawn('/bin/true', [], { stdio: 'ignore' }); } catch (err) { code = err.code; }
      for (const fd of hog) closeSync(fd);
      process.stdout.write(code);`;
    const out = execFileSync(
      'bash',
      ['-c', 'ulimit -n 256 && exec "$0" --input-type=module -e "$1"', process.execPath, agent],
      {
        env: { ...process.env, CUSTODY_BACKEND: backend.name },
        encoding: 'utf8',
        timeout: 30_000,
      },
    );
    expect(out).toBe('EMFILE');
  });
});
