// terminate(), forceEnd() and endedResult() (src/process/terminate.ts): the
// branches the supervisor's stop rests on. Nothing is sent before the call
// is known to be valid and not already aborted; an abort midway ends the
// process rather than leave it half-stopped; a process that outlives even
// the kill wait is an error, never reported gone. Signal logs are read with
// probes (signalsBeforeProbes), so "nothing was sent" is proven, not slept on.
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { AbortError, type ProcessHandle, spawn, terminate } from '../../src/index.js';
import { endedResult, forceEnd } from '../../src/process/terminate.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { isGone, loggedSignals, MARKER, signalLoggerArgs, tmpDir, untilReady, waitFor } from '../helpers/procs.js';
import { signalsBeforeProbes } from '../helpers/quiet.js';
import { PYTHON } from '../helpers/supervisor.js';

const cleanups = cleanupAfterEach({ marker: MARKER });

/** A signal logger that ignores SIGTERM (logging it), killed after the test if still there. */
async function logger(): Promise<{ h: ProcessHandle; log: string }> {
  const dir = tmpDir('custody-terminate-');
  const log = join(dir.path, 'signals.log');
  const h = spawn(PYTHON, signalLoggerArgs(log, true), { stdio: ['ignore', 'pipe', 'ignore'] });
  cleanups.push(async () => {
    h.signal('SIGKILL');
    await h.exited;
    h.close();
    dir.cleanup();
  });
  await untilReady(h.stdout!);
  return { h, log };
}

describe(`terminate (${backend.name})`, () => {
  it('sends nothing when the call is invalid or already aborted', async () => {
    const { h, log } = await logger();
    await expect(terminate(h, { killWaitMs: Number.NaN })).rejects.toMatchObject({ code: 'ERR_CUSTODY_INVALID_ARG' });
    await expect(terminate(h, { killSignal: 'SIGNOPE' as never })).rejects.toMatchObject({
      code: 'ERR_CUSTODY_INVALID_ARG',
    });
    const aborted = new AbortController();
    aborted.abort(new Error('before'));
    await expect(terminate(h, { signal: aborted.signal })).rejects.toMatchObject({
      code: 'ABORT_ERR',
      cause: new Error('before'),
    });
    expect(await signalsBeforeProbes(h.pid, log)).toEqual([]);
    expect(h.isAlive()).toBe(true);
  });

  it('an abort midway forces the end: SIGKILL, the exit awaited, then the AbortError', async () => {
    const { h, log } = await logger();
    const ac = new AbortController();
    const stopping = terminate(h, { graceMs: 30_000, signal: ac.signal });
    // Aborted once the polite signal has arrived (logged), well inside the grace.
    await waitFor(() => loggedSignals(log).length > 0, 10_000, 'the SIGTERM');
    ac.abort(new Error('caller gave up'));
    await expect(stopping).rejects.toBeInstanceOf(AbortError);
    // Gone by the time the AbortError arrives, and by SIGKILL: not left for the caller to finish.
    expect(h.hasExited).toBe(true);
    expect(await h.exited).toEqual({ code: null, signal: 'SIGKILL' });
    expect(loggedSignals(log)).toEqual(['SIGTERM']);
  });

  it('its own signals: a catchable kill signal that is ignored is a StopTimeoutError, never "exited"', async () => {
    const { h, log } = await logger();
    const escalations: Array<{ pid: number; graceMs: number }> = [];
    await expect(
      terminate(h, {
        termSignal: 'SIGHUP',
        graceMs: 100,
        killSignal: 'SIGUSR2',
        killWaitMs: 200,
        onEscalate: (info) => escalations.push(info),
      }),
    ).rejects.toMatchObject({ code: 'ERR_CUSTODY_STOP_TIMEOUT', pid: h.pid });
    expect(escalations).toEqual([{ pid: h.pid, graceMs: 100 }]);
    expect(h.isAlive()).toBe(true);
    expect(await signalsBeforeProbes(h.pid, log)).toEqual(['SIGHUP', 'SIGUSR2']);
    await forceEnd(h, { killWaitMs: 5000 });
    expect(isGone(h.pid)).toBe(true);
    // Ended some other way: the status it ended with, and whether it was alive before.
    expect(await endedResult(h, true, true)).toEqual({
      outcome: 'exited',
      escalated: true,
      code: null,
      signal: 'SIGKILL',
    });
    expect(await endedResult(h, false, false)).toMatchObject({ outcome: 'already-gone', escalated: false });
  });
});
