// A supervisor killed between its launch child's clone and its exec: the
// child is then a fork of a dead process, with the supervisor's argv and
// memory and no token, and it may exec into the target at any moment. strace
// holds it at the entry of its execve for a set time, in a PID namespace
// whose init reaps orphans. Recovery must wait for it and adopt what it
// becomes (1.5 s, within the 3 s confirm bound), or defer the launch and
// leave it untouched (7 s), never clean the state and orphan it; the
// supervisor's own retry (1 s on, doubling) then adopts what it became,
// with nobody calling recover().
import { execFileSync } from 'node:child_process';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { recoverInNamespace } from '../helpers/supervisor.js';
import { hasUnshare, isRoot, tmpDir } from '../helpers/procs.js';

expectNoLeaks();

const STRACE = (() => {
  try {
    return execFileSync('sh', ['-c', 'command -v strace'], { encoding: 'utf8' }).trim();
  } catch {
    return '';
  }
})();

describe(`a supervisor killed before its child's exec (${backend.name})`, () => {
  it('recovery waits for the fork and adopts what it execs into; past the bound it defers, untouched', {
    timeout: 90_000,
  }, async (ctx) => {
    ctx.skip(!(isRoot() && hasUnshare()), 'needs root and unshare --pid: the orphaned fork must come to an init');
    ctx.skip(STRACE === '', 'needs strace (.ci/run installs it): it holds the child at its execve');
    const dir = tmpDir('custody-preexec-');
    try {
      const r = await recoverInNamespace('preexec', dir.path, 2, { timeoutMs: 80_000, extra: [STRACE] });
      console.log(`${backend.name}: ${JSON.stringify(r.reports)}`);
      expect(r.errors).toEqual([]);
      expect(r.trials).toBe(2);
      const byDelay = new Map(r.reports.map((x: { delayMs: number }) => [x.delayMs, x]));
      const within = byDelay.get(1500) as Record<string, unknown> & { fork: number };
      expect(within).toMatchObject({ adopted: [{ pid: within.fork, reason: 'starting' }], cleaned: 0, deferred: [] });
      const past = byDelay.get(7000) as Record<string, unknown> & { fork: number };
      expect(past).toMatchObject({
        adopted: [],
        cleaned: 0,
        quarantined: 0,
        deferred: ['EAGAIN'],
        forkAfterOpen: 'alive',
        adoptedLater: [{ pid: past.fork }],
        statusLater: 'running',
      });
      // No retry comes sooner than a second after the deferral (made just before open() resolved).
      expect(past.adoptedLaterAfterMs).toBeGreaterThanOrEqual(950);
      expect(r.orphans).toEqual([]);
      expect(r.zombies).toBe(0);
      expect(r.staleManifests).toEqual([]);
    } finally {
      dir.cleanup();
    }
  });
});
