import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { backend } from '../src/backend/index.js';
import { expectNoLeaks } from './helpers/leaks.js';
import { asNamespaceInit, hasUnshare, isRoot, SIGNAL_LOGGER, tmpDir } from './helpers/procs.js';

expectNoLeaks();

const canForceReuse = isRoot() && hasUnshare();
const TRIALS = Number(process.env.CUSTODY_REUSE_TRIALS ?? 20);

describe(`genuine PID reuse in a PID namespace (${backend.name})`, () => {
  it(`${TRIALS} forced reuses: old handles never reach the new owner; verify says reused`, {
    timeout: 30_000 + TRIALS * 1000,
  }, async (ctx) => {
    ctx.skip(!canForceReuse, 'needs root and unshare --pid: forces PID reuse through ns_last_pid in a PID namespace');
    const dir = tmpDir();
    try {
      const fixture = join(import.meta.dirname, 'fixtures', 'reuse.mjs');
      const { stdout } = await promisify(execFile)(
        'unshare',
        asNamespaceInit(fixture, String(TRIALS), join(dir.path, 'signals.log'), SIGNAL_LOGGER),
        { env: { ...process.env, CUSTODY_BACKEND: backend.name }, timeout: 20_000 + TRIALS * 1000 },
      );
      const r = JSON.parse(stdout.trim().split('\n').pop()!);
      expect(r.errors).toEqual([]);
      expect(r.backend).toBe(backend.name);
      expect(r.trials).toBe(TRIALS);
      if (backend.name === 'native') {
        // Through a pidfd a signal reaches the old owner or nobody.
        expect(r.signalsReturnedTrue).toBe(0);
        expect(r.loggedSignals).toEqual([]);
        // Every reuse is detected, the same-tick ones by the pidfs id.
        const verdicts = Object.keys(r.verdicts);
        expect(verdicts.every((v) => v.startsWith('reused'))).toBe(true);
        if (r.pidfsId && r.sameTick > 0) expect(r.verdicts['reused:pidfsId (same tick)']).toBe(r.sameTick);
      } else {
        // The js backend has only start ticks: it detects every reuse in
        // another tick; within one it can only notice the other exe or argv
        // (capabilities().pidfsId is false, raceFreeSignals is false).
        for (const [v, n] of Object.entries(r.verdicts)) {
          if (v.endsWith('(same tick)'))
            expect(['ok (same tick)', 'mismatch:exe (same tick)', 'mismatch:argv (same tick)']).toContain(v);
          else expect([v, n]).toEqual(['reused:startTicks', n]);
        }
        expect(r.signalsReturnedTrue).toBe(r.sameTickSignalsReturnedTrue);
        expect(r.loggedSignals.length).toBe(r.sameTickSignalsReturnedTrue);
      }
      console.log(
        `${backend.name}: ${r.trials} reuses, ${r.sameTick} within one clock tick, verdicts ${JSON.stringify(r.verdicts)}`,
      );
    } finally {
      dir.cleanup();
    }
  });
});
