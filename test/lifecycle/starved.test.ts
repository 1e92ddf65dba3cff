// A deadline measured on a starved event loop: thousands of stops at once
// (or any long synchronous work of the host's) hold the loop past a stop's
// grace or kill wait while the process exits. When the loop turns again its
// timers run before the exit is heard, so the deadline comes first. A stop
// then reads the process fresh: one that has exited (a zombie not yet
// reaped, since reaping waits for this loop) is no escalation and no
// StopTimeoutError. The loop is held here by a busy wait, as the drain did
// by its own work; the processes' exits are real.
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { spawn, terminate, type ProcessHandle } from '../../src/index.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { loggedSignals, MARKER, procStat, signalLoggerArgs, tmpDir, untilReady, waitFor } from '../helpers/procs.js';
import { openSupervisor, PYTHON } from '../helpers/supervisor.js';

const cleanups = cleanupAfterEach({ marker: MARKER });

/** Holds the event loop: nothing else runs on this thread meanwhile, as under a drain's own work. */
function holdLoop(ms: number): void {
  const until = Date.now() + ms;
  while (Date.now() < until) {
    /* busy */
  }
}

/**
 * Holds the loop from its check phase (setImmediate): the next turn then runs its expired timers before it
 * polls for I/O, so the deadline is heard before the exit, as on a loop starved by its own work.
 */
const holdLoopThenTimersFirst = (ms: number) =>
  new Promise<void>((resolve) => setImmediate(() => resolve(holdLoop(ms))));

/** A process that exits argv[2] ms after SIGTERM, logging it first; ready once <log>.ready exists. */
const LATE_EXIT = `
import os, signal, sys, time
log = sys.argv[1]
def term(signo, frame):
    with open(log, 'a') as f:
        f.write('SIGTERM\\n')
    time.sleep(float(sys.argv[2]) / 1000)
    os._exit(0)
signal.signal(signal.SIGTERM, term)
open(log + '.ready', 'w').close()
while True:
    time.sleep(60)
`;

function own(h: ProcessHandle): ProcessHandle {
  cleanups.push(async () => {
    h.signal('SIGKILL');
    await h.exited;
    h.close();
  });
  return h;
}

/** A zombie child of ours: exited, not yet reaped (the reaper waits for this loop). */
const isZombie = (pid: number) => procStat(pid)?.[0] === 'Z';

describe(`a deadline on a starved loop (${backend.name})`, () => {
  it('terminate(): a process that died at SIGTERM while the loop was held is no escalation', async () => {
    // tail following a file named by the marker: idle, and it dies at SIGTERM.
    const h = own(spawn('tail', ['-F', '/dev/null', `idle-${MARKER}`]));
    // Signalled once it runs tail (the js backend's spawn goes through an exec wrapper first).
    await waitFor(() => readFileSync(`/proc/${h.pid}/comm`, 'utf8').trim() === 'tail', 10_000, 'the exec');
    const escalations: number[] = [];
    const stopping = terminate(h, { graceMs: 50, onEscalate: ({ pid }) => escalations.push(pid) });
    // SIGTERM went before terminate() returned; tail dies of it at once, and is a zombie of ours from then on.
    holdLoop(200);
    expect(isZombie(h.pid)).toBe(true);
    const r = await stopping;
    expect(escalations).toEqual([]);
    expect(r).toMatchObject({ outcome: 'exited', escalated: false, signal: 'SIGTERM' });
  });

  it('terminate(): a process that died of SIGKILL while the loop was held past the kill wait is no StopTimeoutError', async () => {
    const dir = tmpDir('custody-starved-');
    cleanups.push(dir.cleanup);
    const log = join(dir.path, 'signals.log');
    const h = own(spawn(PYTHON, signalLoggerArgs(log, true), { stdio: ['ignore', 'pipe', 'ignore'] }));
    await untilReady(h.stdout!);
    const stopping = terminate(h, {
      graceMs: 50,
      killWaitMs: 50,
      // Called just before SIGKILL is sent: the loop is held once the kill wait's timer is armed.
      onEscalate: () => void holdLoopThenTimersFirst(300),
    });
    const r = await stopping;
    expect(r).toMatchObject({ outcome: 'exited', escalated: true, signal: 'SIGKILL' });
    expect(loggedSignals(log)).toContain('SIGTERM');
  });

  it('a supervisor stop whose process exits during a held loop, past its grace, is no escalation', async () => {
    const ctx = await openSupervisor();
    cleanups.push(() => ctx.dispose());
    const log = join(ctx.root, 'late.log');
    const inst = await ctx.supervisor.launch({
      id: 'late',
      command: PYTHON,
      args: (t) => ['-c', LATE_EXIT, log, '150', t, MARKER],
      ready: () => waitFor(() => existsSync(`${log}.ready`), 10_000, 'its SIGTERM handler'),
    });
    const stopping = ctx.supervisor.stop('late', { graceMs: 400 });
    await waitFor(() => loggedSignals(log).includes('SIGTERM'), 10_000, 'the SIGTERM');
    // It exits 150 ms after SIGTERM; the grace ends at 400 ms; the loop is held past both.
    await holdLoopThenTimersFirst(1000);
    expect(isZombie(inst.pid)).toBe(true);
    const r = await stopping;
    expect(ctx.events.filter((e) => e.type === 'escalate')).toEqual([]);
    expect(r).toMatchObject({ outcome: 'exited', escalated: false });
    expect(ctx.supervisor.list()).toEqual([]);
  });
});
