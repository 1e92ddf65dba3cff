/**
 * What a user reads when a launch or an instance fails: a pid with no process
 * behind it and a forking daemon gone after its launcher succeeded are said
 * as such (not "exited with status unknown", not "did not exec"), with the
 * output tails; an instance that exits on its own reports the tails of both
 * of its logs; a declared path left by an earlier run is gone before the
 * attempt starts.
 */
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import type { ExitEvent, LaunchExitedError } from '../../src/index.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { MARKER, unusedPid, waitFor } from '../helpers/procs.js';
import { openSupervisor, PERL } from '../helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });

let ctx: Awaited<ReturnType<typeof openSupervisor>> | undefined;
afterEach(async () => {
  await ctx?.dispose();
  ctx = undefined;
});

/** The rejection of a launch that must fail. */
async function failure(launch: Promise<unknown>): Promise<LaunchExitedError> {
  const err = await launch.then(
    () => expect.unreachable('the launch succeeded'),
    (e: unknown) => e as LaunchExitedError,
  );
  expect(err.code, err.message).toBe('ERR_CUSTODY_LAUNCH_EXITED');
  return err;
}

/** A launch whose launcher is `sh -c launcher` with the token, the marker and the pidfile as $1, $2, $3. */
async function forkingLaunch(id: string, launcher: string, confirmTimeoutMs?: number) {
  const c = ctx!;
  const pidfile = join(c.root, `${id}.pid`);
  const args = (t: string) => ['-c', launcher, 'launcher', t, MARKER, pidfile];
  const err = await failure(c.supervisor.launch({ id, command: 'sh', args, pid: { file: pidfile }, confirmTimeoutMs }));
  return { err, pidfile };
}

describe(`failure messages (${backend.name})`, () => {
  it('a pid function whose pid no process has: said so, not "exited with status unknown"', async () => {
    ctx = await openSupervisor();
    const pid = unusedPid();
    const err = await failure(
      ctx.supervisor.launch({
        id: 'a',
        command: PERL,
        args: (t) => ['-e', 'sleep 30', '--', t, MARKER],
        pid: () => pid,
        confirmTimeoutMs: 2000,
      }),
    );
    expect(err.pid).toBe(pid);
    expect(err.message).toMatch(
      new RegExp(`^launch of a: the pid function returned ${pid}, and no process has that pid \\(it never existed`),
    );
    expect(err.message).not.toContain('status unknown');
  });

  it('a forking daemon that died after its launcher exited 0: the daemon died, with its stderr tail', async () => {
    ctx = await openSupervisor();
    // The launcher writes the daemon's pid, and exits 0 only once the daemon has died (and is reaped).
    const launcher = `${PERL} -e 'print STDERR "daemon: cannot open /var/lib/db\\n"; exit 1' -- "$1" "$2" & echo $! > "$3"; wait; exit 0`;
    const { err, pidfile } = await forkingLaunch('d', launcher);
    expect(err.message).toBe(
      `launch of d: the daemon died: its launcher exited 0, but no process is left with the pid ${err.pid} that ${pidfile} names; stderr: daemon: cannot open /var/lib/db`,
    );
    expect(err.stderrTail).toBe('daemon: cannot open /var/lib/db\n');
    expect(err.message).not.toContain('did not exec');
  });

  it('a launcher that exits 0 leaving the pidfile empty: the daemon died or never wrote it, with the stdout tail', async () => {
    ctx = await openSupervisor();
    // As redis does: its fatal line on stdout, nothing on stderr.
    const launcher = ': > "$3"; echo "redis: Fatal error, can\'t open config file"; exit 0';
    const { err, pidfile } = await forkingLaunch('r', launcher, 300);
    expect(err.message).toBe(
      `launch of r: the daemon died or never wrote its pid: its launcher exited 0, but ${pidfile} is still empty after 300 ms; stdout: redis: Fatal error, can't open config file`,
    );
    expect(err).toMatchObject({ pid: undefined, exitCode: 0, stderrTail: undefined });
    expect(err.stdoutTail).toBe("redis: Fatal error, can't open config file\n");
  });

  it('an instance that exits on its own: its exit event carries both log tails; a stale declared path was gone at its start', async () => {
    ctx = await openSupervisor();
    const gate = join(ctx.root, 'gate');
    const stale = join(ctx.root, 'stale.sock');
    writeFileSync(stale, 'left by an earlier run');
    // Says on stdout whether the declared path was there, waits (at most 20 s) for its gate, and exits 3.
    const perl = `$| = 1; print(-e $ARGV[3] ? "stale\\n" : "fresh\\n"); print STDERR "going\\n";
      for (1 .. 1000) { last if -e $ARGV[2]; select(undef, undef, undef, 0.02) } exit 3`;
    const inst = await ctx.supervisor.launch({
      id: 'e',
      command: PERL,
      args: (t) => ['-e', perl, '--', t, MARKER, gate, stale],
      paths: [stale],
    });
    writeFileSync(gate, '');
    const exit = await waitFor(
      () => ctx?.events.find((e): e is ExitEvent => e.type === 'exit' && e.id === 'e'),
      20_000,
      'the exit event',
    );
    expect(exit).toMatchObject({ pid: inst.pid, code: 3, signal: null, stdoutTail: 'fresh\n', stderrTail: 'going\n' });
  });
});
