// Its own file: becoming a subreaper is process-wide, and only this test
// worker should be one.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backend } from '../src/backend/index.js';
import { expectNoLeaks, descendantsOf } from './helpers/leaks.js';
import { isGone, MARKER, procStat, waitFor } from './helpers/procs.js';
import { openSupervisor, PERL } from './helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });

describe(`subreaper (${backend.name})`, () => {
  it.skipIf(backend.name !== 'native')('a daemon that double-forks away from its launcher stays visible and is reaped by custody', async () => {
    const ctx = await openSupervisor({ subreaper: true });
    try {
      const pidfile = join(ctx.root, 'daemon.pid');
      // QEMU -daemonize in miniature: fork, write the pidfile, parent exits 0.
      const inst = await ctx.supervisor.launch({
        id: 'daemon',
        command: 'sh',
        args: (t) => ['-c', `( "$0" -e 'sleep 300' "$1" "$2" & echo $! > "$3" ); exit 0`, PERL, t, MARKER, pidfile],
        pid: { file: pidfile },
        executable: PERL,
      });
      // Re-parented to us, not to init.
      await waitFor(() => procStat(inst.pid)?.[1] === String(process.pid), 5000, 're-parenting');
      expect(Number(readFileSync(pidfile, 'utf8'))).toBe(inst.pid);
      const r = await ctx.supervisor.stop('daemon', { graceMs: 2000 });
      expect(r).toEqual({ outcome: 'exited', escalated: false, code: null, signal: 'SIGTERM' });
      // Reaped: no zombie child left.
      await waitFor(() => isGone(inst.pid) && !descendantsOf(process.pid).some((p) => p.pid === inst.pid), 5000, 'reap');
    } finally {
      await ctx.dispose();
    }
  });

  it.skipIf(backend.name !== 'js')('says, as a warning, that the js backend cannot be a subreaper', async () => {
    const ctx = await openSupervisor({ subreaper: true });
    try {
      expect(ctx.events).toContainEqual(expect.objectContaining({ type: 'warning', message: expect.stringMatching(/subreaper needs the native backend/) }));
    } finally {
      await ctx.dispose();
    }
  });
});
