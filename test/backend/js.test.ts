// The pure-JS backend (src/backend/js.ts), exercised directly in both
// projects: where it has no pidfd, the checks it makes instead must hold. A
// thread id is not a process (Tgid), a pin is a (pid, start ticks) pair that
// a zombie no longer answers to, and an argument child_process would
// re-encode is refused before anything is spawned.
import { spawn as cpSpawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { backend, selectBackend } from '../../src/backend/index.js';
import type { JsBackend } from '../../src/backend/js.js';
import { parseStat } from '../../src/process/proc.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { descendantsOf } from '../helpers/leaks.js';
import { exited, MARKER, procStat, waitFor } from '../helpers/procs.js';
import { PYTHON } from '../helpers/supervisor.js';

const cleanups = cleanupAfterEach({ marker: MARKER });
const js = selectBackend({ CUSTODY_BACKEND: 'js' }) as JsBackend;

/** A python process of ours that prints one line of pids, then waits for stdin to close. */
async function python(prog: string) {
  const child = cpSpawn(PYTHON, ['-c', prog, MARKER], { stdio: ['pipe', 'pipe', 'ignore'] });
  cleanups.push(async () => {
    child.stdin!.end();
    await exited(child);
  });
  let line = '';
  child.stdout!.on('data', (d: Buffer) => (line += d));
  await waitFor(() => line.includes('\n'), 10_000, 'the pids');
  return { child, pids: line.trim().split(' ').map(Number) };
}

describe(`the js backend (${backend.name} project)`, () => {
  it("refuses a thread id, and reads a leader's identity as /proc shows it", async () => {
    const { child, pids } = await python(`
import sys, threading
go = threading.Event()
t = threading.Thread(target=go.wait); t.start()
print(t.native_id, flush=True)
sys.stdin.read(); go.set(); t.join()
`);
    const [tid] = pids;
    expect(() => js.inspect(tid!)).toThrow(expect.objectContaining({ code: 'ERR_CUSTODY_NOT_A_PROCESS' }));
    const raw = js.inspect(child.pid!);
    const stat = parseStat(readFileSync(`/proc/${child.pid}/stat`, 'latin1'))!;
    expect(raw).toMatchObject({
      ppid: process.pid,
      session: stat.session,
      startTicks: stat.startTicks,
      argv: [PYTHON, '-c', expect.any(String), MARKER],
      uid: process.getuid!(),
      pidfsId: null,
    });
  });

  it('a pin on a process that became a zombie is gone: no signal, and its exit settles', async () => {
    // The zombie is the python parent's unreaped child: not ours to reap, still in the process table.
    const { pids } = await python(`
import os, sys, time
pid = os.fork()
if pid == 0:
    sys.stdin.close(); time.sleep(60)
print(pid, flush=True)
sys.stdin.read()
os.kill(pid, 9); os.waitpid(pid, 0)
`);
    const [target] = pids;
    const { ref } = js.inspectPinned(target!);
    cleanups.push(() => ref.close());
    expect(ref.signal(0)).toBe(true);
    process.kill(target!, 'SIGKILL');
    await waitFor(() => procStat(target!)?.[0] === 'Z', 5000, 'the zombie');
    // A plain kill(2) would still succeed on the zombie; the pin knows it is gone.
    expect(ref.signal(15)).toBe(false);
    expect(await ref.exited).toEqual({ code: null, signal: null });
  });

  it('refuses an argument, path or environment that is not UTF-8 before spawning anything', () => {
    const before = descendantsOf(process.pid).length;
    const base = {
      file: '/bin/true',
      argv: ['true'],
      env: null,
      cwd: undefined,
      stdio: ['ignore', 'ignore', 'ignore'] as ['ignore', 'ignore', 'ignore'],
      newSession: false,
      newGroup: false,
    };
    for (const req of [
      { ...base, argv: ['true', 'a\udcffb'] },
      { ...base, env: ['A=\udc80'] },
      { ...base, cwd: '/tmp/\udcfe' },
    ]) {
      expect(() => js.spawn(req)).toThrow(expect.objectContaining({ code: 'ERR_CUSTODY_UNSUPPORTED' }));
    }
    expect(descendantsOf(process.pid)).toHaveLength(before);
  });
});
