// Crashes: a supervisor process SIGKILLed at a random moment of a random
// lifecycle (launch, confirm, ready, abandon, escalation, stop), inside a
// PID namespace whose init reaps orphans as a real init would. After each,
// a new supervisor recovers. `npm test` runs a few dozen trials; `npm run
// soak` runs 200 (CUSTODY_SOAK=1).
import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { asNamespaceInit, hasUnshare, isRoot, SIGNAL_LOGGER, tmpDir } from '../helpers/procs.js';
import { FAKE_VM, FIXTURES, LAUNCHER, PERL, PYTHON } from '../helpers/supervisor.js';

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
      const { stdout } = await promisify(execFile)(
        'unshare',
        asNamespaceInit(
          join(FIXTURES, 'recover-ns.mjs'),
          'chaos',
          join(dir.path, 'state'),
          String(TRIALS),
          SIGNAL_LOGGER,
          LAUNCHER,
          PERL,
          join(dir.path, 'decoys.log'),
          FAKE_VM,
          PYTHON,
        ),
        {
          env: { ...process.env, CUSTODY_BACKEND: backend.name },
          timeout: SOAK ? 1_700_000 : 230_000,
          maxBuffer: 16 << 20,
        },
      );
      const r = JSON.parse(stdout.trim().split('\n').pop()!);
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
