// The CLI on instances a restart policy keeps: `custody ls` shows backoff
// and failed with the last result and the restart count; `custody stop`
// cancels a pending restart; `custody remove` forgets a failed one. The CLI
// has no specs: it never restarts an instance, so what waits stays waiting.
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { type LaunchSpec, Supervisor } from '../../src/index.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { runCli } from '../helpers/cli.js';
import { playerOf } from '../helpers/player.js';
import { MARKER, tmpDir, waitFor } from '../helpers/procs.js';

const cleanups = cleanupAfterEach({ marker: MARKER });

/** A state dir where `waits` is in backoff (its restart a minute away) and `gaveUp` failed; the supervisor closed. */
async function restingState() {
  const d = tmpDir('custody-cli-restart-');
  cleanups.push(() => d.cleanup());
  const stateDir = join(d.path, 'state');
  const { supervisor } = await Supervisor.open({ stateDir, onEvent: () => {} });
  try {
    const launchExit3 = async (id: string, restart: LaunchSpec['restart']) => {
      const p = playerOf(id, ['exit 3']);
      cleanups.push(p.cleanup);
      await supervisor.launch({ ...p.spec, restart });
      p.go();
    };
    await launchExit3('waits', { when: 'on-failure', delayMs: 60_000 });
    await launchExit3('gaveUp', { when: 'on-failure', limit: { count: 0, withinMs: 60_000 } });
    await waitFor(
      () => supervisor.list().filter((i) => i.status === 'backoff' || i.status === 'failed').length === 2,
      20_000,
      'backoff and failed',
    );
  } finally {
    await supervisor.close();
  }
  return stateDir;
}

describe(`custody ls, stop and remove on restart state (${backend.name})`, () => {
  it('ls shows backoff and failed with the last result and restarts; stop cancels the restart, remove forgets the failed', async () => {
    const stateDir = await restingState();
    const ls = await runCli(['ls', '--state-dir', stateDir, '--json']);
    expect(ls.code, ls.stderr).toBe(0);
    expect(JSON.parse(ls.stdout).instances).toEqual([
      expect.objectContaining({ id: 'gaveUp', state: 'failed', pid: null, lastResult: 'exit-code', restarts: 0 }),
      expect.objectContaining({ id: 'waits', state: 'backoff', pid: null, lastResult: 'exit-code', restarts: 1 }),
    ]);
    const human = (await runCli(['ls', '--state-dir', stateDir])).stdout.split('\n');
    expect(human[2]).toMatch(/^gaveUp\s+failed\s+-\s+-\s+-\s+exit-code\s+0\s+-\s+/);
    expect(human[3]).toMatch(/^waits\s+backoff\s+-\s+-\s+-\s+exit-code\s+1\s+-\s+/);

    const stop = await runCli(['stop', 'waits', '--state-dir', stateDir, '--json']);
    expect(stop.code, stop.stderr).toBe(0);
    expect(JSON.parse(stop.stdout)).toMatchObject({ id: 'waits', outcome: 'already-gone', result: 'stopped' });
    expect(existsSync(join(stateDir, 'waits'))).toBe(false);

    const remove = await runCli(['remove', 'gaveUp', '--state-dir', stateDir]);
    expect(remove.code, remove.stderr).toBe(0);
    expect(remove.stdout).toBe('removed gaveUp (failed); nothing was signalled\n');
    expect(existsSync(join(stateDir, 'gaveUp'))).toBe(false);
    const again = await runCli(['remove', 'gaveUp', '--state-dir', stateDir]);
    expect(again.code).not.toBe(0);
    expect(again.stderr).toMatch(/ERR_CUSTODY_NOT_FOUND/);
  });
});
