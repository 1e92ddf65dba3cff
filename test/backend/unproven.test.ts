// UnprovenPidRef (src/backend/unproven.ts): a reference by pid alone, for a
// process custody cannot prove. Its exit must still settle (polled with
// signal 0) so a stop returns once the process is gone, with an unknown
// status rather than an invented one; once settled it sends nothing more.
import { spawn as cpSpawn } from 'node:child_process';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { UnprovenPidRef } from '../../src/backend/unproven.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { exited, killAndWait, MARKER, signalLoggerArgs, tmpDir, untilReady } from '../helpers/procs.js';
import { signalsBeforeProbes } from '../helpers/quiet.js';
import { PYTHON } from '../helpers/supervisor.js';

const cleanups = cleanupAfterEach({ marker: MARKER });

/** A signal logger that child_process reaps (so no zombie of ours answers signal 0), and its ref. */
async function referenced() {
  const dir = tmpDir('custody-unproven-');
  const log = join(dir.path, 'signals.log');
  const child = cpSpawn(PYTHON, signalLoggerArgs(log, true), { stdio: ['ignore', 'pipe', 'ignore'] });
  await untilReady(child.stdout!);
  const ref = new UnprovenPidRef(child.pid!);
  cleanups.push(async () => {
    ref.close();
    await killAndWait(child);
    dir.cleanup();
  });
  return { child, ref, log };
}

describe(`an unproven reference (${backend.name})`, () => {
  it('signals by pid, and settles an unknown status once polling finds the process gone', async () => {
    const { child, ref, log } = await referenced();
    expect(ref.hasExited).toBe(false);
    expect(ref.signal(1)).toBe(true); // SIGHUP, logged
    expect(await signalsBeforeProbes(ref.pid, log)).toEqual(['SIGHUP']);
    child.kill('SIGKILL');
    await exited(child);
    expect(await ref.exited).toEqual({ code: null, signal: null });
    await ref.gone;
    expect(ref.exitStatus).toEqual({ code: null, signal: null });
    expect(ref.signal(15)).toBe(false);
  });

  it('a signal that finds no process settles at once, without waiting for the poll', async () => {
    const { child, ref } = await referenced();
    // Polling stopped: only the failed signal can settle it now.
    ref.close();
    child.kill('SIGKILL');
    await exited(child);
    expect(ref.hasExited).toBe(false);
    // Signal 0: the pid is free now and may be given to a stranger, who must get nothing real.
    expect(ref.signal(0)).toBe(false);
    expect(ref.hasExited).toBe(true);
    expect(await ref.exited).toEqual({ code: null, signal: null });
  });
});
