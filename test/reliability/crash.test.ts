import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { recoverInNamespace } from '../helpers/supervisor.js';
import { hasUnshare, isRoot, tmpDir } from '../helpers/procs.js';

expectNoLeaks();

const SOAK = process.env.CUSTODY_SOAK === '1';
const TRIALS = Number(process.env.CUSTODY_CRASH_TRIALS ?? (SOAK ? 200 : 24));

describe(`crash recovery (${backend.name})`, () => {
  it(`${TRIALS} supervisors SIGKILLed mid-lifecycle: no orphan, no zombie, no stale manifest, no signal to a decoy`, {
    timeout: SOAK ? 1_800_000 : 240_000,
  }, async (ctx) => {
    ctx.skip(!(isRoot() && hasUnshare()), 'needs root and unshare --pid: each trial runs in its own PID namespace');
    const dir = tmpDir('custody-chaos-');
    try {
      const r = await recoverInNamespace('chaos', dir.path, TRIALS, { timeoutMs: SOAK ? 1_700_000 : 230_000 });
      const summary = { trials: r.trials, adopted: 0, cleaned: 0, quarantined: 0 };
      for (const rep of r.reports) {
        summary.adopted += rep.adopted;
        summary.cleaned += rep.cleaned;
        summary.quarantined += rep.quarantined.length;
      }
      console.log(`${backend.name}: ${JSON.stringify(summary)}; killed after: ${JSON.stringify(r.killedAt)}`);
      expect(r.errors).toEqual([]);
      expect(r.trials).toBe(TRIALS);
      expect(r.orphans).toEqual([]);
      expect(r.zombies).toBe(0);
      expect(r.staleManifests).toEqual([]);
      expect(r.signals).toEqual([]);
      expect(r.reports.flatMap((x: { quarantined: string[] }) => x.quarantined)).toEqual([]);
    } finally {
      dir.cleanup();
    }
  });
});
