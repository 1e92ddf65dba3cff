// A stop that fails halfway (EMFILE once SIGTERM has ended the main process) leaves the instance `stopping`,
// on disk and in list(); the next stop() re-finds what is still alive and ends it. Before, the next stop()
// said `already-gone`, removed the state, and the main's child (which ignores SIGTERM) ran on under pid 1.
import { execFileSync } from 'node:child_process';
import { closeSync, openSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { expectNoLeaks, processesWithMarker } from '../helpers/leaks.js';
import { isGone, MARKER, procStat, waitFor } from '../helpers/procs.js';
import { openSupervisor, PERL } from '../helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });

let ctx: Awaited<ReturnType<typeof openSupervisor>>;
afterEach(async () => {
  await ctx?.dispose();
});

/** The main forks a child that ignores SIGTERM (inherited, so no race), then takes SIGTERM's default itself. */
const FORKS_STUBBORN_CHILD =
  '$SIG{TERM}="IGNORE"; my $p = fork(); if ($p == 0) { sleep 1 while 1; } $SIG{TERM}="DEFAULT"; sleep 300;';

const INSTANCES = 120;

function nofile(): { soft: number; hard: number } {
  const line = readFileSync('/proc/self/limits', 'utf8')
    .split('\n')
    .find((l) => l.startsWith('Max open files'));
  const [soft, hard] = (line ?? '').split(/\s+/).slice(3, 5);
  return { soft: Number(soft), hard: Number(hard) };
}

function setNofile(soft: number, hard: number): void {
  execFileSync('prlimit', ['--pid', String(process.pid), `--nofile=${soft}:${hard}`], { stdio: 'ignore' });
}

/**
 * Lowers the soft fd limit for `during`. Restoring it is a spawn, which needs fds below the limit: `spare`
 * holds some, opened before the instances' pins took the low numbers, and closed for the restore.
 */
async function withLowNofile<T>(soft: number, spare: number[], during: () => Promise<T>): Promise<T> {
  const limit = nofile();
  setNofile(soft, limit.hard);
  try {
    return await during();
  } finally {
    for (const fd of spare.splice(0)) closeSync(fd);
    setNofile(limit.soft, limit.hard);
  }
}

/** The fd the next open() gets: with the soft limit there, nothing more can be opened. */
function lowestFreeFd(): number {
  const probe = openSync('/dev/null', 'r');
  closeSync(probe);
  return probe;
}

const manifestOf = (id: string) => JSON.parse(readFileSync(join(ctx.stateDir, id, 'manifest.json'), 'utf8'));
const manifestState = (id: string): string => manifestOf(id).state;
const tokenOf = (id: string): string => manifestOf(id).token;

describe(`a stop cut short by the fd limit (${backend.name})`, () => {
  it('leaves stopping on disk, and the next stop ends every child', async () => {
    const spare = Array.from({ length: 16 }, () => openSync('/dev/null', 'r'));
    ctx = await openSupervisor();
    const ids = Array.from({ length: INSTANCES }, (_, k) => `s${k}`);
    for (let k = 0; k < ids.length; k += 8) {
      await Promise.all(
        ids
          .slice(k, k + 8)
          .map((id) =>
            ctx.supervisor.launch({ id, command: PERL, args: (t) => ['-e', FORKS_STUBBORN_CHILD, t, MARKER] }),
          ),
      );
    }
    const mains = ids.map((id) => ctx.supervisor.get(id)!.pid);
    // Each stop has signalled once its main is gone (a zombie held by the native stop, or reaped): only then is
    // the limit lowered, so that the stops run out of fds halfway, in their grace, as an agent at its limit does.
    const stopping = ids.map((id) => ctx.supervisor.stop(id, { graceMs: 3000 }));
    await waitFor(
      () => mains.every((pid) => isGone(pid) || procStat(pid)?.[0] === 'Z'),
      20_000,
      'SIGTERM to end every main',
    );
    const results = await withLowNofile(lowestFreeFd(), spare, () => Promise.allSettled(stopping));
    const failed = ids.filter((_, k) => results[k]!.status === 'rejected');
    // A stop that could not write its `stopping` manifest signalled nothing: that instance still runs.
    const shown = new Map(ctx.supervisor.list().map((i) => [i.id, i.status]));
    const halfway = failed.filter((id) => shown.get(id) === 'stopping');
    console.log(
      `${backend.name}: ${failed.length} of ${INSTANCES} stops failed with no fd to spare, ${halfway.length} of them after they began`,
    );
    for (const id of failed) {
      const reason = (results[ids.indexOf(id)] as PromiseRejectedResult).reason as Error;
      expect(String(reason)).toMatch(/EMFILE/);
      const state = halfway.includes(id) ? 'stopping' : 'running';
      expect([id, shown.get(id), manifestState(id)]).toEqual([id, state, state]);
    }
    expect([...shown.keys()].sort()).toEqual([...failed].sort());
    // With fds to spare, the next stop of each ends what is left: the child that ignores SIGTERM included.
    // `already-gone` only where nothing of the instance is left (a stop that failed after its SIGKILL had landed).
    const left = new Set(processesWithMarker(MARKER).map((p) => p.cmd));
    const alive = failed.map((id) => [...left].some((cmd) => cmd.includes(tokenOf(id))));
    const again = await Promise.all(failed.map((id) => ctx.supervisor.stop(id, { graceMs: 200 })));
    expect(again.map((r) => r.outcome)).toEqual(alive.map((a) => (a ? 'exited' : 'already-gone')));
    expect(ctx.supervisor.list()).toEqual([]);
    expect(processesWithMarker(MARKER)).toEqual([]);
    // The limit has to bite for the test to prove anything.
    expect(halfway.length).toBeGreaterThan(0);
  }, 120_000);
});
