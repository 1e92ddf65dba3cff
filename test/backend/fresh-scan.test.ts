// FreshScan: the session scan a tree stop needs is shared by every stop in
// flight, but never one that began before the caller asked (it could miss a
// process forked just before the ask). Unit tests with a scripted scan; then
// the real scans against session leaders of our own.
import { spawn } from 'node:child_process';
import { mkdirSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { FreshScan, sessionPairsNow, sessionPairsOf } from '../../src/backend/procview.js';
import { backend } from '../../src/backend/index.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { killAndWait, MARKER, tmpDir } from '../helpers/procs.js';
import { PERL } from '../helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });

/** A scan whose runs the test finishes by hand, numbered from 1. */
function scripted() {
  const runs: Array<(v: number) => void> = [];
  const fails: Array<(e: Error) => void> = [];
  const scan = new FreshScan(
    () =>
      new Promise<number>((resolve, reject) => {
        runs.push(resolve);
        fails.push(reject);
      }),
  );
  return { scan, runs, fails };
}

const tick = () => new Promise((r) => setImmediate(r));

describe('FreshScan', () => {
  it('shares one run among callers that come while none runs yet, and starts the next for late callers', async () => {
    const { scan, runs } = scripted();
    const a = scan.fresh();
    expect(runs).toHaveLength(1);
    // b and c come while run 1 is in flight: both get run 2, which starts only once run 1 is over.
    const b = scan.fresh();
    const c = scan.fresh();
    expect(runs).toHaveLength(1);
    runs[0]?.(1);
    expect(await a).toBe(1);
    await tick();
    expect(runs).toHaveLength(2);
    runs[1]?.(2);
    expect(await b).toBe(2);
    expect(await c).toBe(2);
    // Nothing in flight: a new caller starts a run of its own.
    const d = scan.fresh();
    expect(runs).toHaveLength(3);
    runs[2]?.(3);
    expect(await d).toBe(3);
  });

  it('gives a failed run to its own callers only; those waiting for the next still get one', async () => {
    const { scan, runs, fails } = scripted();
    const a = scan.fresh();
    const b = scan.fresh();
    fails[0]?.(new Error('EMFILE'));
    await expect(a).rejects.toThrow('EMFILE');
    await tick();
    expect(runs).toHaveLength(2);
    runs[1]?.(7);
    expect(await b).toBe(7);
  });
});

describe(`session scans (${backend.name})`, () => {
  it('lists our own session with us in it, from both the backend and the plain reads', async () => {
    const pairs = await sessionPairsOf();
    const ours = Number(
      (await import('node:fs')).readFileSync('/proc/self/stat', 'latin1').split(') ')[1]?.split(' ')[3],
    );
    const inPairs: number[] = [];
    for (let i = 0; i < pairs.length; i += 2) if (pairs[i + 1] === ours) inPairs.push(pairs[i] as number);
    expect(inPairs).toContain(process.pid);
    expect(await backend.sessionMembers(new Set([ours]))).toContain(process.pid);
  });

  it('every process once, with its own session: twelve session leaders, read on the pool and on this thread', async () => {
    const leaders = Array.from({ length: 12 }, () =>
      spawn(PERL, ['-e', 'sleep 30', MARKER], { stdio: 'ignore', detached: true }),
    );
    try {
      const sessions = new Set(leaders.map((c) => c.pid!));
      for (const pairs of [await sessionPairsOf(), sessionPairsNow()]) {
        const pids = Array.from({ length: pairs.length / 2 }, (_, i) => pairs[2 * i] as number);
        // No slot lost to another's read, none written twice.
        expect(new Set(pids).size).toBe(pids.length);
        const led = new Map<number, number>();
        for (let i = 0; i < pairs.length; i += 2)
          if (sessions.has(pairs[i] as number)) led.set(pairs[i] as number, pairs[i + 1] as number);
        expect(led).toEqual(new Map([...sessions].map((p) => [p, p])));
      }
      const want = [...sessions].sort((a, b) => a - b);
      expect((await backend.sessionMembers(sessions)).sort((a, b) => a - b)).toEqual(want);
      expect(backend.sessionMembersNow(sessions).sort((a, b) => a - b)).toEqual(want);
    } finally {
      await Promise.all(leaders.map(killAndWait));
    }
  });

  it("the js backend's scan lets the loop turn while it reads, and reads every entry once", async () => {
    // A /proc of 3 000 stat files (self names us, as assertOwnProc wants): tens of ms of reads at any speed.
    const { path: root, cleanup } = tmpDir('custody-fakeproc-');
    try {
      symlinkSync(String(process.pid), join(root, 'self'));
      const n = 3000;
      for (let pid = 1; pid <= n; pid++) {
        mkdirSync(join(root, String(pid)));
        // pid (comm) state ppid pgrp session, then 16 more fields up to starttime (field 22).
        const tail = Array.from({ length: 16 }, (_, i) => i).join(' ');
        writeFileSync(join(root, String(pid), 'stat'), `${pid} (a) b) S 1 ${pid} ${1000 + (pid % 7)} ${tail}\n`);
      }
      let turns = 0;
      let done = false;
      const count = () => {
        if (done) return;
        turns++;
        setImmediate(count);
      };
      setImmediate(count);
      const pairs = await sessionPairsOf(root);
      done = true;
      expect(turns).toBeGreaterThan(0);
      const bySession = new Map<number, number>();
      for (let i = 0; i < pairs.length; i += 2) bySession.set(pairs[i] as number, pairs[i + 1] as number);
      expect(bySession.size).toBe(n);
      for (let pid = 1; pid <= n; pid++) expect(bySession.get(pid)).toBe(1000 + (pid % 7));
      expect([...sessionPairsNow(root)]).toEqual([...pairs]);
    } finally {
      cleanup();
    }
  });
});
