// Exit watching at scale and at the edges: many children ending in the same
// instant, a watcher dropped while its exit is being reported, a handle that
// does not hold the loop open, and what an 'ignore' slot really is in the
// child. On the native backend every watched pidfd sits in one epoll set that
// reports up to 64 exits per turn, so these are the cases that set must get
// right; the js backend must give the same answers.
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { Socket } from 'node:net';
import { constants as osConstants } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { spawnedChild } from '../../src/backend/addon.js';
import { ExitPoller, type PolledExit } from '../../src/backend/js-exits.js';
import type { NativeBackend } from '../../src/backend/native.js';
import { exitWatchesOf } from '../../src/backend/native-watch.js';
import { encodeArg } from '../../src/bytes.js';
import { holdExit, releaseExit } from '../../src/process/handle.js';
import { spawn } from '../../src/index.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { isGone, killAndWait, procStat, sleeper, startOf, waitFor } from '../helpers/procs.js';

expectNoLeaks();

const dist = join(import.meta.dirname, '..', '..', 'dist', 'index.js');

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

  it('passes long argv words byte-exact through spawn(): pairs and U+FFFD at the end of 254 to 1 000 units', async () => {
    // The public path of the addon's 255-unit copy; UTF-8-valid words, which both backends carry.
    const words = [254, 255, 256, 1000].flatMap((units) => [
      `${'b'.repeat(units - 2)}\u{1f600}`,
      `${'\u00e9'.repeat(units - 1)}\ufffd`,
    ]);
    const h = spawn('/bin/sh', ['-c', 'read x', 'sh', ...words], { stdio: ['pipe', 'ignore', 'ignore'] });
    try {
      const expected = Buffer.from(['/bin/sh', '-c', 'read x', 'sh', ...words].map((w) => `${w}\0`).join(''), 'utf8');
      await waitFor(() => readFileSync(`/proc/${h.pid}/cmdline`).equals(expected) || null, 5000, 'the exec');
    } finally {
      // A line for `read`, which fails (1) at end of file.
      h.stdin?.end('\n');
      expect(await h.exited).toEqual({ code: 0, signal: null });
    }
  });

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

// The js backend's poller of non-children, driven tick by tick: its timer is
// set to an hour so only the test's own tick() calls read. The processes are
// real sleepers; "gone" is their /proc entry's start ticks, as in production.
describe(`the js backend's exit poller (${backend.name})`, () => {
  type Seen = PolledExit & { told: number };
  // Told once gone, it leaves the poller, as a pin that settles does.
  const watched = (poller: ExitPoller, pid: number, startTicks = Number(startOf(pid))): Seen => ({
    pid,
    startTicks,
    told: 0,
    markExited() {
      this.told++;
      poller.delete(this);
    },
  });
  const hourly = (budgetMs: number) => new ExitPoller({ intervalMs: 3_600_000, budgetMs });

  /**
   * n sleepers, started and pinned for `poller` (not yet added), handed to
   * fn; whatever happens, every pin leaves `poller` and every sleeper ends.
   */
  async function withSleepers(
    n: number,
    poller: ExitPoller,
    fn: (refs: Seen[], kids: ReturnType<typeof sleeper>[]) => Promise<void>,
  ): Promise<void> {
    const kids = Array.from({ length: n }, () => sleeper(60));
    const refs: Seen[] = [];
    try {
      await waitFor(() => kids.every((k) => k.pid && startOf(k.pid)), 5000, 'the sleepers');
      refs.push(...kids.map((k) => watched(poller, k.pid as number)));
      await fn(refs, kids);
    } finally {
      for (const r of refs) poller.delete(r);
      await Promise.all(kids.map(killAndWait));
    }
  }

  it('spreads a pass over ticks when the budget is spent, and sees every exit once', async () => {
    // A budget of 0 ms: one pid per tick, whatever the machine's speed.
    const poller = hourly(0);
    await withSleepers(4, poller, async (refs, kids) => {
      for (const r of refs) poller.add(r);
      expect([poller.tick(), poller.tick(), poller.tick(), poller.tick()]).toEqual([1, 1, 1, 1]);
      expect(refs.map((r) => r.told)).toEqual([0, 0, 0, 0]);
      await Promise.all(kids.map(killAndWait));
      // The next pass tells them one tick at a time, in the order they were watched.
      const told: string[] = [];
      for (const _ of refs) {
        expect(poller.tick()).toBe(1);
        told.push(refs.map((r) => r.told).join(''));
      }
      expect(told).toEqual(['1000', '1100', '1110', '1111']);
    });
  });

  it('reads a signalled pid at every tick, ahead of the pass, until it is gone or unwatched', async () => {
    const poller = hourly(0);
    await withSleepers(4, poller, async (refs, kids) => {
      for (const r of refs) poller.add(r);
      const [, , third, fourth] = refs as [Seen, Seen, Seen, Seen];
      // Not watched: nothing to hurry.
      poller.expedite(process.pid);
      poller.expedite(fourth.pid);
      poller.expedite(third.pid);
      // Both signalled, and the pass's first (one pid a tick at a budget of 0).
      expect(poller.tick()).toBe(3);
      await killAndWait(kids[3]!);
      expect(poller.tick()).toBe(3); // the two signalled, then the pass's next: the second
      expect(refs.map((r) => r.told)).toEqual([0, 0, 0, 1]);
      // Told and so unwatched: no longer read; the third still is, every tick, and the pass skips it.
      expect(poller.tick()).toBe(1); // the third; the pass ends on it, read already
      expect(poller.tick()).toBe(2); // the third, and the new pass's first
      poller.delete(third);
      expect(poller.tick()).toBe(1); // the pass's next, the second
      expect(refs.map((r) => r.told)).toEqual([0, 0, 0, 1]);
    });
  });

  it('reads each pid once a tick, skips one unwatched mid-pass, and takes a new one at the next pass', async () => {
    const oneEach = hourly(0);
    const unbounded = hourly(60_000);
    await withSleepers(3, oneEach, async (refs, kids) => {
      const [a, b, c] = refs as [Seen, Seen, Seen];
      // Two watches on one pid share its read; one with the wrong start ticks is a reused pid.
      const shared = [a, watched(unbounded, a.pid), b, watched(unbounded, b.pid, b.startTicks + 1)];
      try {
        for (const r of shared) unbounded.add(r);
        expect(unbounded.tick()).toBe(2);
        expect(shared.map((r) => r.told)).toEqual([0, 0, 0, 1]);
      } finally {
        for (const r of shared) unbounded.delete(r);
      }

      oneEach.add(a);
      oneEach.add(b);
      expect(oneEach.tick()).toBe(1); // a: the pass is [a, b]
      oneEach.delete(b);
      oneEach.add(c);
      await killAndWait(kids[2]!);
      // b was unwatched and c came after the pass began: this tick ends the pass having read nothing.
      expect(oneEach.tick()).toBe(0);
      expect(oneEach.tick()).toBe(1); // the next pass: [a, c]
      expect(c.told).toBe(0);
      expect(oneEach.tick()).toBe(1);
      expect(c.told).toBe(1);
    });
  });
});

describe.skipIf(backend.name !== 'native')('the native watch set', () => {
  const addon = () => (backend as NativeBackend).addon;
  const watches = () => exitWatchesOf(addon());
  const CLD_EXITED = 1;
  const CLD_KILLED = 2;

  /** A raw child of the addon. */
  function rawSpawn(argv: string[], stdin = -1, stdout = -1): { pid: number; pidfd: number } {
    const a = addon();
    return spawnedChild(a, a.spawn(argv[0] ?? '', argv, null, null, stdin, stdout, -1, 0, -1));
  }

  /** A child blocked on a pipe, with the write end that ends it. */
  function rawChild(): { pid: number; pidfd: number; release: number } {
    const a = addon();
    const [r, w] = a.pipe();
    const child = rawSpawn(['/bin/sh', '-c', 'read x'], r);
    a.close(r);
    return { ...child, release: w };
  }

  /** Reaps a child whose watch did not, and closes its pidfd. */
  function reap(c: { pidfd: number }): void {
    const a = addon();
    a.waitid(c.pidfd, a.constants.WEXITED);
    a.close(c.pidfd);
  }

  /** Resolves with the (code, status) a watch of `fd` reports. */
  function reported(fd: number, reapIt: boolean): Promise<[number, number]> {
    return new Promise((resolve) => {
      watches().watch(fd, reapIt, { exitReported: (code, status) => resolve([code, status]) });
    });
  }

  it('never tells a listener that an earlier listener of the same batch unwatched', async () => {
    const a = addon();
    const one = rawChild();
    const two = rawChild();
    const calls: string[] = [];
    let ids: Record<string, number> = {};
    const done = new Promise<void>((resolve) => {
      const listener = (name: string, other: string) => ({
        exitReported: () => {
          calls.push(name);
          watches().unwatch(ids[other] ?? 0);
          resolve();
        },
      });
      ids = {
        one: watches().watch(one.pidfd, false, listener('one', 'two')),
        two: watches().watch(two.pidfd, false, listener('two', 'one')),
      };
    });
    // Both end before the loop turns: one epoll_wait reports both.
    a.close(one.release);
    a.close(two.release);
    await done;
    // A child spawned now exits in a later turn of the loop: once it is reported, the batch of one and two is over.
    const later = rawSpawn(['/bin/sh', '-c', 'exit 0']);
    expect(await reported(later.pidfd, true)).toEqual([CLD_EXITED, 0]);
    a.close(later.pidfd);
    expect(calls).toHaveLength(1);
    reap(one);
    reap(two);
  });

  it('refuses a second watch on a pending pidfd, and re-arms one that already fired', async () => {
    const a = addon();
    const c = rawChild();
    const quiet = { exitReported: () => {} };
    const first = watches().watch(c.pidfd, false, quiet);
    expect(() => watches().watch(c.pidfd, false, quiet)).toThrow(expect.objectContaining({ code: 'EEXIST' }));
    watches().unwatch(first);
    const fired = reported(c.pidfd, false);
    a.close(c.release);
    expect(await fired).toEqual([0, 0]);
    // Fired: its entry stays in the set, disarmed, until the pidfd closes. A
    // new watch re-arms it and, the process having exited, fires at once.
    await reported(c.pidfd, false);
    reap(c);
  });

  it('reaps as it reports: the exit code, or the signal, and no zombie after', async () => {
    const a = addon();
    const exits = rawSpawn(['/bin/sh', '-c', 'exit 7']);
    expect(await reported(exits.pidfd, true)).toEqual([CLD_EXITED, 7]);
    const killed = rawSpawn(['/bin/sleep', '30']);
    const report = reported(killed.pidfd, true);
    a.pidfdSendSignal(killed.pidfd, 9);
    expect(await report).toEqual([CLD_KILLED, 9]);
    for (const c of [exits, killed]) {
      // Reaped: nothing is left to wait for, and no zombie holds the pid.
      expect(() => a.waitid(c.pidfd, a.constants.WEXITED | a.constants.WNOHANG)).toThrow(
        expect.objectContaining({ code: 'ECHILD' }),
      );
      // No zombie of ours holds the pid (a process there now is a stranger's, with another parent).
      expect(procStat(c.pid)?.[1]).not.toBe(String(process.pid));
      a.close(c.pidfd);
    }
  });

  it("reports -ECHILD for another's child, and leaves it to its own parent", async () => {
    const a = addon();
    // A grandchild: sh forks sleep, prints its pid and waits for it.
    const [r, w] = a.pipe();
    const parent = rawSpawn(['/bin/sh', '-c', 'sleep 30 & echo $!; wait $!'], -1, w);
    a.close(w);
    const pid = Number(
      await new Promise<string>((resolve) => {
        const s = new Socket({ fd: r, readable: true, writable: false });
        let out = '';
        s.on('data', (d) => {
          out += String(d);
          if (out.includes('\n')) {
            s.destroy();
            resolve(out);
          }
        });
      }),
    );
    const fd = a.pidfdOpen(pid);
    const report = reported(fd, true);
    a.pidfdSendSignal(fd, 9);
    const [code] = await report;
    expect(code).toBe(-osConstants.errno.ECHILD);
    // Its parent, sh, reaped it and exits in turn.
    expect(await reported(parent.pidfd, true)).toEqual([CLD_EXITED, 137]);
    a.close(fd);
    a.close(parent.pidfd);
  });

  it('tells the rest of a batch when one listener throws, then surfaces the error as uncaught', () => {
    // A fresh node: the uncaught exception is what is observed.
    const script = `
      const { createRequire } = require('node:module');
      import(${JSON.stringify(join(import.meta.dirname, '..', '..', 'dist', 'backend', 'native-watch.js'))}).then((m) => {
        const a = require(process.env.CUSTODY_ADDON_PATH ?? ${JSON.stringify(join(import.meta.dirname, '..', '..', 'build', 'Release', 'custody.node'))});
        const w = m.exitWatchesOf(a);
        const [r, wr] = a.pipe();
        const told = [];
        process.on('uncaughtException', (e) => { setTimeout(() => { console.log(JSON.stringify({ error: e.message, told })); process.exit(0); }, 100); });
        for (let i = 0; i < 3; i++) {
          const fd = a.spawn('/bin/sh', ['sh', '-c', 'read x; exit 5'], null, null, r, -1, -1, 0, -1) % a.constants.SPAWN_PID_SCALE;
          w.watch(fd, true, { exitReported: (code, status) => { told.push(status); if (i === 0) throw new Error('listener failed'); } });
        }
        a.close(r);
        a.close(wr);
      });`;
    const out = execFileSync(process.execPath, ['-e', script], { encoding: 'utf8', timeout: 20_000 });
    expect(JSON.parse(out)).toEqual({ error: 'listener failed', told: [5, 5, 5] });
  });

  it('range-checks spawn: stdio below -1 and unknown flags are refused, nothing is run', () => {
    const a = addon();
    expect(() => a.spawn('/bin/true', ['true'], null, null, -2, -1, -1, 0, -1)).toThrow(
      expect.objectContaining({ code: 'ERR_OUT_OF_RANGE' }),
    );
    expect(() => a.spawn('/bin/true', ['true'], null, null, -1, -1, -1, 8, -1)).toThrow(
      expect.objectContaining({ code: 'ERR_OUT_OF_RANGE' }),
    );
    expect(() => a.spawn('/bin/true', ['true'], null, null, -1, -1, -1, 0, -2)).toThrow(
      expect.objectContaining({ code: 'ERR_OUT_OF_RANGE' }),
    );
  });

  it("returns the child's pid and its pidfd in one number, exact at the largest pid and fd", () => {
    const a = addon();
    // The largest pid (PID_MAX_LIMIT - 1 on 64-bit) and the largest fd an int holds: the sum is 2^53 - 1.
    expect(spawnedChild(a, 4194303 * a.constants.SPAWN_PID_SCALE + 2147483647)).toEqual({
      pid: 4194303,
      pidfd: 2147483647,
    });
    const c = rawChild();
    try {
      // The pidfd names the child (its fdinfo's Pid), and the child is ours (its ppid).
      expect(readFileSync(`/proc/self/fdinfo/${c.pidfd}`, 'utf8')).toMatch(new RegExp(`^Pid:\\t${c.pid}$`, 'm'));
      expect(procStat(c.pid)?.[1]).toBe(String(process.pid));
    } finally {
      a.close(c.release);
      reap(c);
    }
  });

  it('passes argv words on both sides of the 255-unit copy byte-exact: escapes, pairs and U+FFFD at the edge', async () => {
    const a = addon();
    // The addon copies a word of up to 254 UTF-16 units in one call and takes a longer one whole:
    // each word ends in what a cut copy would get wrong (an escaped byte, half of a surrogate pair).
    const words = [254, 255, 256, 1000].flatMap((units) => [
      `${'a'.repeat(units - 1)}\udcff`,
      `${'b'.repeat(units - 2)}\u{1f600}`,
      `${'\u00e9'.repeat(units - 1)}\ufffd`,
    ]);
    const argv = ['/bin/sh', '-c', 'read x', 'sh', ...words];
    const [r, w] = a.pipe();
    const c = rawSpawn(argv, r);
    a.close(r);
    try {
      const expected = Buffer.concat(argv.map((w) => Buffer.concat([encodeArg(w), Buffer.from([0])])));
      await waitFor(() => readFileSync(`/proc/${c.pid}/cmdline`).equals(expected) || null, 5000, 'the exec');
      // The same words as a sweep's pattern find it: matchArgv encodes them the same way.
      expect(await (backend as NativeBackend).matchArgv(argv)).toEqual([c.pid]);
    } finally {
      a.close(w);
      reap(c);
    }
  });

  it("refuses a second dispatcher: the first one's pending watches would report to a table without them", async () => {
    // A pending watch, so the first dispatcher is registered and in use.
    const pending = spawn('sleep', ['30']);
    try {
      expect(() => addon().watchDispatch(() => {})).toThrow(/already called/);
    } finally {
      pending.signal('SIGKILL');
      // Still reported to the first dispatcher, after the refusal.
      expect((await pending.exited).signal).toBe('SIGKILL');
    }
  });

  it.skipIf(backend.name !== 'native')(
    'holds an exited child as a zombie until released, then reaps it with its status; never past the bound',
    async () => {
      const kid = spawn('/bin/sh', ['-c', 'read x; exit 7'], { stdio: ['pipe', 'ignore', 'ignore'] });
      expect(holdExit(kid)).toBe(true);
      let exited = false;
      void kid.exited.then(() => (exited = true));
      kid.stdin?.end();
      await kid.gone;
      // Seen, not reaped: the zombie holds the pid while a child that exits after it is reaped.
      const after = spawn('/bin/sh', ['-c', 'exit 0']);
      expect(await after.exited).toEqual({ code: 0, signal: null });
      expect(exited).toBe(false);
      expect(procStat(kid.pid)?.[0]).toBe('Z');
      releaseExit(kid);
      expect(await kid.exited).toEqual({ code: 7, signal: null });
      expect(isGone(kid.pid)).toBe(true);
      // Nobody releases this one: reaped at the bound all the same, with its status.
      const late = spawn('/bin/sh', ['-c', 'exit 3']);
      expect(holdExit(late)).toBe(true);
      const t0 = Date.now();
      expect(await late.exited).toEqual({ code: 3, signal: null });
      expect(Date.now() - t0).toBeGreaterThanOrEqual(1500);
      expect(isGone(late.pid)).toBe(true);
      // Closed while held: reaped at once.
      const closed = spawn('/bin/sh', ['-c', 'exit 0']);
      holdExit(closed);
      await closed.gone;
      closed.close();
      await waitFor(() => isGone(closed.pid), 1000, 'the closed handle to reap its zombie');
    },
  );

  it.skipIf(backend.name !== 'js')('cannot hold a child as a zombie: libuv reaps it', async () => {
    const kid = spawn('/bin/sh', ['-c', 'exit 0']);
    expect(holdExit(kid)).toBe(false);
    expect(await kid.exited).toEqual({ code: 0, signal: null });
  });
});
