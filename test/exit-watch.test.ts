// Exit watching at scale and at the edges: many children ending in the same
// instant, a watcher dropped while its exit is being reported, a handle that
// does not hold the loop open, and what an 'ignore' slot really is in the
// child. On the native backend every watched pidfd sits in one epoll set that
// reports up to 64 exits per turn, so these are the cases that set must get
// right; the js backend must give the same answers.
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backend } from '../src/backend/index.js';
import type { NativeBackend } from '../src/backend/native.js';
import { spawn } from '../src/index.js';
import { expectNoLeaks } from './helpers/leaks.js';

expectNoLeaks();

const dist = join(import.meta.dirname, '..', 'dist', 'index.js');

describe(`exit watching (${backend.name})`, () => {
  it('reports every one of 150 children that exit together, each with its own status', async () => {
    // More than one epoll batch (64) ends in the same moment: all of them
    // block on one pipe that is closed at once.
    const n = 150;
    const kids = Array.from({ length: n }, (_, i) =>
      spawn('/bin/sh', ['-c', `read x; exit ${i % 7}`], { stdio: ['pipe', 'ignore', 'ignore'] }),
    );
    for (const k of kids) k.stdin?.end();
    const statuses = await Promise.all(kids.map((k) => k.exited));
    expect(statuses).toEqual(kids.map((_, i) => ({ code: i % 7, signal: null })));
  }, 60_000);

  it('gives an ignored slot /dev/null and a piped one its pipe', async () => {
    const h = spawn('/bin/ls', ['-l', '/proc/self/fd'], { stdio: ['ignore', 'pipe', 'ignore'] });
    let out = '';
    for await (const chunk of h.stdout!) out += String(chunk);
    expect(await h.exited).toEqual({ code: 0, signal: null });
    const targets = new Map([...out.matchAll(/ (\d+) -> (.*)$/gm)].map((m) => [m[1], m[2]]));
    expect(targets.get('0')).toBe('/dev/null');
    expect(targets.get('2')).toBe('/dev/null');
    // A pipe on native, a socketpair on js (libuv's choice for stdio).
    expect(targets.get('1')).toMatch(/^(pipe|socket):\[\d+\]$/);
  });

  it('lets the loop end while an unref()d child runs, and still reaps it later', () => {
    // A fresh node: the loop's end is what is observed. The child outlives it
    // by design and is reaped by whoever inherits it; its pid comes back so
    // the test can end it.
    const script = `import(${JSON.stringify(dist)}).then((c) => {
      const h = c.spawn('/bin/sleep', ['30']);
      h.unref();
      console.log(h.pid);
    })`;
    const t0 = Date.now();
    const out = execFileSync(process.execPath, ['-e', script], {
      env: { ...process.env, CUSTODY_BACKEND: backend.name },
      encoding: 'utf8',
      timeout: 20_000,
    });
    const pid = Number(out.trim());
    expect(pid).toBeGreaterThan(1);
    // The node ended long before its 30 s child: the unref'd watch did not hold it.
    expect(Date.now() - t0).toBeLessThan(20_000);
    try {
      process.kill(pid, 'SIGKILL');
    } catch {
      // already gone
    }
  });
});

describe.skipIf(backend.name !== 'native')('the native watch set', () => {
  const addon = () => (backend as NativeBackend).addon;

  /** A child blocked on a pipe, as a raw { pid, pidfd } with the write end that ends it. */
  function rawChild(): { pid: number; pidfd: number; release: number } {
    const a = addon();
    const [r, w] = a.pipe();
    const child = a.spawn('/bin/sh', ['sh', '-c', 'read x'], null, {
      stdio: [r, -1, -1],
      newSession: false,
      newGroup: false,
    });
    a.close(r);
    return { ...child, release: w };
  }

  function reap(c: { pidfd: number }): void {
    const a = addon();
    a.waitid(c.pidfd, a.constants.WEXITED);
    a.close(c.pidfd);
  }

  it('never calls a watcher that an earlier callback of the same batch unwatched', async () => {
    const a = addon();
    const one = rawChild();
    const two = rawChild();
    const calls: string[] = [];
    let ids: Record<string, number> = {};
    const done = new Promise<void>((resolve) => {
      const onExit = (name: string, other: string) => () => {
        calls.push(name);
        a.unwatch(ids[other] ?? 0);
        resolve();
      };
      ids = { one: a.watch(one.pidfd, onExit('one', 'two')), two: a.watch(two.pidfd, onExit('two', 'one')) };
    });
    // Both end before the loop turns: one epoll_wait reports both.
    a.close(one.release);
    a.close(two.release);
    await done;
    await new Promise((r) => setTimeout(r, 200));
    expect(calls).toHaveLength(1);
    reap(one);
    reap(two);
  });

  it('refuses a second watcher on a pending pidfd, and re-arms one that already fired', async () => {
    const a = addon();
    const c = rawChild();
    const first = a.watch(c.pidfd, () => {});
    expect(() => a.watch(c.pidfd, () => {})).toThrow(expect.objectContaining({ code: 'EEXIST' }));
    a.unwatch(first);
    await new Promise<void>((resolve) => {
      a.watch(c.pidfd, () => resolve());
      a.close(c.release);
    });
    // Fired: its entry stays in the set, disarmed, until the pidfd closes. A
    // new watch re-arms it and, the process having exited, fires at once.
    await new Promise<void>((resolve) => a.watch(c.pidfd, () => resolve()));
    reap(c);
  });

  it('range-checks its stdio fds: -1 is its own /dev/null, below that is refused', () => {
    const a = addon();
    expect(() =>
      a.spawn('/bin/true', ['true'], null, { stdio: [-2, -1, -1], newSession: false, newGroup: false }),
    ).toThrow(expect.objectContaining({ code: 'ERR_OUT_OF_RANGE' }));
  });
});
