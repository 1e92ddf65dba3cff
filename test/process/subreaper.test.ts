// Its own file: becoming a subreaper is process-wide, and only this test
// worker should be one.
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { expectNoLeaks, descendantsOf } from '../helpers/leaks.js';
import { isGone, MARKER, procStat, waitFor } from '../helpers/procs.js';
import { FIXTURES, openSupervisor, PERL, PYTHON } from '../helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });

describe(`subreaper (${backend.name})`, () => {
  it.skipIf(backend.name !== 'native')(
    'a daemon that double-forks away from its launcher stays visible and is reaped by custody',
    async () => {
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
        expect(r).toEqual({ outcome: 'exited', escalated: false, code: null, signal: 'SIGTERM', result: 'stopped' });
        // Reaped: no zombie child left.
        await waitFor(
          () => isGone(inst.pid) && !descendantsOf(process.pid).some((p) => p.pid === inst.pid),
          5000,
          'reap',
        );
      } finally {
        await ctx.dispose();
      }
    },
  );

  it.skipIf(backend.name !== 'native')(
    "reaps the zombie that QEMU's -daemonize fork leaves, and a helper that double-forked away; never a child_process child",
    async () => {
      const ctx = await openSupervisor({ subreaper: true });
      const { spawn: cpSpawn } = await import('node:child_process');
      // Someone else's child of ours: it exits unreaped until child_process reaps it.
      const bystander = cpSpawn('sh', ['-c', 'exit 0'], { stdio: 'ignore' });
      const bystanderExit = new Promise((r) => bystander.once('exit', r));
      try {
        const pidfile = join(ctx.root, 'vm.pid');
        // -daemonize in miniature: the launcher forks child1, which setsids,
        // forks the daemon, writes the pidfile and exits while the launcher
        // still lives (so child1 stays the launcher's zombie); then the
        // launcher exits 0 and the zombie is re-parented to us. The daemon
        // forks a helper that double-forks away from it, into its session.
        const launcher = `
import os, sys, time
perl, token, marker, pidfile = sys.argv[1:5]
if os.fork() == 0:
    os.setsid()
    pid = os.fork()
    if pid == 0:
        os.execv(perl, [perl, '-e', 'if (!fork) { if (!fork) { sleep 30; exit } exit } sleep 30', '--', token, marker])
    open(pidfile, 'w').write(str(pid))
    os._exit(0)
time.sleep(0.3)
`;
        const inst = await ctx.supervisor.launch({
          id: 'vm',
          command: PYTHON,
          args: (t) => ['-c', launcher, PERL, t, MARKER, pidfile],
          pid: { file: pidfile },
          executable: PERL,
        });
        // The zombie of child1 and the helper whose parent exited both come to us.
        const helper = await waitFor(
          () =>
            descendantsOf(process.pid).find(
              (p) => p.ppid === process.pid && p.pid !== inst.pid && p.cmd.includes(MARKER) && p.state !== 'Z',
            ),
          5000,
          'the helper to be re-parented to us',
        );
        // child1's zombie does not linger.
        await waitFor(
          () =>
            !descendantsOf(process.pid).some(
              (p) => p.state === 'Z' && p.ppid === process.pid && p.pid !== bystander.pid,
            ),
          5000,
          'the reaping',
        );
        // Stop ends the helper with the instance, though its tree no longer reaches it.
        await ctx.supervisor.stop('vm', { graceMs: 2000 });
        await waitFor(
          () => isGone(helper.pid) && !descendantsOf(process.pid).some((p) => p.pid === helper.pid),
          5000,
          'the helper ended and reaped',
        );
        await bystanderExit;
        // child_process still got its own child's exit: custody never reaped it.
        expect(bystander.exitCode).toBe(0);
      } finally {
        await ctx.dispose();
      }
    },
  );

  it.skipIf(backend.name !== 'native')(
    "stop reaps the zombie of a helper's setsid'd fork, which its parent never reaped, and ends the helper",
    async () => {
      const ctx = await openSupervisor({ subreaper: true });
      try {
        // The leader exits, a zombie the main never reaps. Both the helper (at once) and, when the main dies,
        // the leader's zombie are re-parented to us.
        const inst = await ctx.supervisor.launch({
          id: 'm',
          command: PYTHON,
          args: (t) => [join(FIXTURES, 'setsid-helper.py'), 'exit', PERL, t, MARKER],
        });
        const helper = await waitFor(
          () => descendantsOf(process.pid).find((p) => p.cmd.endsWith(' helper') && p.ppid === process.pid),
          5000,
          'the helper to be re-parented to us',
        );
        const leader = Number(procStat(helper.pid)?.[3]);
        expect(procStat(leader)?.slice(0, 2)).toEqual(['Z', String(inst.pid)]);
        await ctx.supervisor.stop('m', { graceMs: 2000 });
        // Neither the helper nor the leader's zombie is left, and no zombie at all.
        await waitFor(() => isGone(helper.pid) && isGone(leader), 5000, 'the helper ended and both reaped');
        expect(descendantsOf(process.pid).filter((p) => p.state === 'Z')).toEqual([]);
      } finally {
        await ctx.dispose();
      }
    },
  );

  it.skipIf(backend.name !== 'js')('says, as a warning, that the js backend cannot be a subreaper', async () => {
    const ctx = await openSupervisor({ subreaper: true });
    try {
      expect(ctx.events).toContainEqual(
        expect.objectContaining({
          type: 'warning',
          message: expect.stringMatching(/subreaper needs the native backend/),
        }),
      );
    } finally {
      await ctx.dispose();
    }
  });
});
