// The /proc reads both backends share (src/backend/procview.ts): none of them
// reads a /proc of another pid namespace; a child forked by a thread other
// than the main one is still a child; an environment read is capped and
// belongs to the pinned process; the two session scans agree.
import { spawn as cpSpawn } from 'node:child_process';
import { mkdirSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import {
  assertOwnProc,
  childrenOf,
  readEnvironOf,
  readStatOf,
  sessionPairsNow,
  sessionPairsOf,
} from '../../src/backend/procview.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { exited, killAndWait, MARKER, tmpDir, untilReady, waitFor } from '../helpers/procs.js';
import { PERL, PYTHON } from '../helpers/supervisor.js';

const cleanups = cleanupAfterEach({ marker: MARKER });

const foreign = expect.objectContaining({ code: 'ERR_CUSTODY_FOREIGN_PROC' });

/** Pairs [pid, session, ...] as a map. */
function sessions(pairs: Int32Array): Map<number, number> {
  const out = new Map<number, number>();
  for (let i = 0; i + 1 < pairs.length; i += 2) out.set(pairs[i]!, pairs[i + 1]!);
  return out;
}

describe(`/proc reads (${backend.name})`, () => {
  it('never reads a /proc whose self is not this process, or that has no self for us', async () => {
    const dir = tmpDir('custody-procroot-');
    cleanups.push(dir.cleanup);
    const other = join(dir.path, 'other');
    mkdirSync(join(other, '1'), { recursive: true });
    writeFileSync(join(other, '1', 'stat'), '1 (init) S 0 1 1 0 -1 4194560 0 0 0 0 0 0 0 0 20 0 1 0 1 0 0');
    symlinkSync('1', join(other, 'self'));
    expect(() => assertOwnProc(other)).toThrow(foreign);
    expect(() => readStatOf(1, other)).toThrow(foreign);
    expect(() => childrenOf(1, other)).toThrow(foreign);
    await expect(sessionPairsOf(other)).rejects.toMatchObject({ code: 'ERR_CUSTODY_FOREIGN_PROC' });
    // A /proc (it has a stat) with no self for us: another namespace's.
    const absent = join(dir.path, 'absent');
    mkdirSync(absent);
    writeFileSync(join(absent, 'stat'), 'cpu 0');
    expect(() => assertOwnProc(absent)).toThrow(foreign);
    // No /proc at all is not a namespace question: the read's own ENOENT says it.
    expect(() => assertOwnProc(join(dir.path, 'none'))).not.toThrow();
    expect(() => assertOwnProc()).not.toThrow();
  });

  it('counts a child forked by a thread that is not the main one', async () => {
    // The second thread forks its child: the kernel lists it in that thread's task/<tid>/children only.
    // The thread stays alive: a thread's children go to another thread of the process when it exits.
    const prog = `
import subprocess, sys, threading
kids, spawned, done = [], threading.Event(), threading.Event()
child = lambda: kids.append(subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(60)', sys.argv[1]]))
def forker():
    child(); spawned.set(); done.wait()
t = threading.Thread(target=forker)
t.start(); spawned.wait()
child()
print(' '.join(str(k.pid) for k in kids), flush=True)
sys.stdin.read()
for k in kids: k.kill(); k.wait()
done.set(); t.join()
`;
    const parent = cpSpawn(PYTHON, ['-c', prog, MARKER], { stdio: ['pipe', 'pipe', 'ignore'] });
    cleanups.push(async () => {
      parent.stdin!.end();
      await exited(parent);
    });
    let line = '';
    parent.stdout!.on('data', (d: Buffer) => (line += d));
    await waitFor(() => line.includes('\n'), 10_000, 'the children');
    const [byThread, byMain] = line.trim().split(' ').map(Number);
    // Both alive (running, not zombies a child list would show too).
    for (const pid of [byThread, byMain]) expect(readStatOf(pid!)?.state).not.toBe('Z');
    expect(childrenOf(parent.pid!).sort()).toEqual([byThread, byMain].sort());
    expect(childrenOf(byThread!)).toEqual([]);
  });

  it("reads at most maxBytes of a pinned process's environment, and refuses once the process is gone", async () => {
    const big = 'x'.repeat(100_000);
    const child = cpSpawn(PYTHON, ['-c', 'import sys; print("ready", flush=True); sys.stdin.read()', MARKER], {
      stdio: ['pipe', 'pipe', 'ignore'],
      env: { ...process.env, CUSTODY_BIG: big },
    });
    cleanups.push(() => killAndWait(child));
    await untilReady(child.stdout!);
    const { ref } = backend.inspectPinned(child.pid!);
    cleanups.push(() => ref.close());
    const head = readEnvironOf(ref, 1000);
    expect(head.length).toBe(1000);
    const all = readEnvironOf(ref, 1 << 20);
    expect(all.subarray(0, 1000)).toEqual(head);
    expect(all.toString('latin1').split('\0')).toContain(`CUSTODY_BIG=${big}`);
    child.stdin!.end();
    await exited(child);
    await ref.gone;
    expect(() => readEnvironOf(ref, 1000)).toThrow(expect.objectContaining({ code: 'ESRCH' }));
  });

  it('the sliced and the one-go session scans agree on a new session and on ours', async () => {
    const leader = cpSpawn(PERL, ['-e', 'sleep 60', MARKER], { stdio: 'ignore', detached: true });
    cleanups.push(() => killAndWait(leader));
    await waitFor(() => readStatOf(leader.pid!)?.session === leader.pid, 5000, 'the new session');
    const sliced = sessions(await sessionPairsOf());
    const now = sessions(sessionPairsNow());
    for (const scan of [sliced, now]) {
      expect(scan.get(leader.pid!), `leader ${leader.pid}`).toBe(leader.pid);
      expect(scan.get(process.pid), `self ${process.pid}`).toBe(readStatOf(process.pid)!.session);
    }
  });
});
