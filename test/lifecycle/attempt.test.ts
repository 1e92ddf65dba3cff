// The confirmed identity reaches the disk at confirm, before readiness: a supervisor killed while an instance
// boots leaves the proven identity behind, not a starting manifest that names no process.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import type { CustodyEventOf } from '../../src/events.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { MARKER, waitFor } from '../helpers/procs.js';
import { openSupervisor, PERL } from '../helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });

let ctx: Awaited<ReturnType<typeof openSupervisor>>;
afterEach(async () => {
  await ctx?.dispose();
});

const manifestOf = (id: string) => JSON.parse(readFileSync(join(ctx.stateDir, id, 'manifest.json'), 'utf8'));

describe(`the attempt's records (${backend.name})`, () => {
  it('writes the confirmed identity into the starting manifest while readiness is pending', async () => {
    ctx = await openSupervisor();
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    let asked = false;
    const launching = ctx.supervisor.launch({
      id: 'boot',
      command: PERL,
      args: (t) => ['-e', 'sleep 300', t, MARKER],
      ready: async () => {
        asked = true;
        await gate;
      },
    });
    try {
      await waitFor(() => asked, 5000, 'the ready check');
      const during = manifestOf('boot');
      expect(during.state).toBe('starting');
      expect(during.identity).not.toBeNull();
      const confirmed = ctx.events.find((e): e is CustodyEventOf<'confirm'> => e.type === 'confirm' && e.id === 'boot');
      expect(confirmed?.identity).toBeDefined();
      // The very identity the confirming inspection recorded, and the one the running manifest keeps.
      expect(during.identity).toEqual(JSON.parse(JSON.stringify(confirmed!.identity)));
      expect(during.session).toBe(during.identity.pid);
      expect(ctx.supervisor.list()).toEqual([{ id: 'boot', status: 'starting', pid: null, ppid: null }]);
    } finally {
      release();
    }
    const inst = await launching;
    const after = manifestOf('boot');
    expect(after.state).toBe('running');
    expect(after.identity).toEqual(JSON.parse(JSON.stringify(inst.identity)));
    expect(await ctx.supervisor.stop('boot', { graceMs: 2000 })).toMatchObject({ outcome: 'exited' });
  });
});
