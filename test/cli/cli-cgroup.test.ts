// `custody stop` and `custody recover` (node dist/cli/main.js, opened with no cgroup root) on instances a
// Supervisor launched into cgroups: the recorded cgroup is the instance whatever root the CLI has, so a
// setsid'd, double-forked helper dies with the stop and the cgroup goes; a cgroup removed and made again by
// hand is another cgroup: the instance is quarantined (mismatch, cgroup) and nothing in it is signalled.
import { spawn as cpSpawn } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { Supervisor } from '../../src/index.js';
import { CGROUP_ROOT, CGROUP_SKIP, cgroupsBelow, expectNoCgroupsLeft, procsOf } from '../helpers/cgroup.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { runCli } from '../helpers/cli.js';
import { processesWithMarker } from '../helpers/leaks.js';
import {
  catchesSignal,
  endOwn,
  isGone,
  killAndWait,
  killOwn,
  loggedSignals,
  MARKER,
  SIGNAL_LOGGER,
  tmpDir,
  waitFor,
} from '../helpers/procs.js';
import { PERL, PYTHON } from '../helpers/supervisor.js';

const cleanups = cleanupAfterEach({ marker: MARKER });
expectNoCgroupsLeft();

const cli = runCli;

/** perl: forks a child that calls setsid and forks the helper (argv "helper" and the marker), then sleeps. */
const ESCAPER = `use POSIX (); my $p = fork; if (!$p) { POSIX::setsid(); exec($^X, '-e', 'sleep 60', '--', 'helper', $ARGV[1]) if !fork; POSIX::_exit(0) } waitpid($p, 0); sleep 60`;
const helper = () => processesWithMarker(MARKER).find((p) => p.cmd.includes(' helper ') && p.state !== 'Z');

/**
 * A state dir with one instance a Supervisor launched into a cgroup under a root of this test, the
 * supervisor closed (the instance runs on). At cleanup, whatever is left of it is ended by pid and the
 * cgroups under the root are removed.
 */
async function launched(root: string, id: string, args: (token: string) => string[]) {
  const d = tmpDir('custody-cli-cg-');
  const stateDir = join(d.path, 'state');
  cleanups.push(() => {
    for (const dir of [...cgroupsBelow(root), root]) if (existsSync(dir)) rmdirSync(dir);
    d.cleanup();
  });
  const { supervisor } = await Supervisor.open({ stateDir, cgroup: { root }, onEvent: () => {} });
  try {
    const inst = await supervisor.launch({ id, command: PERL, args });
    cleanups.push(() => endOwn([inst.pid, ...(helper() ? [helper()!.pid] : [])]));
    return { stateDir, inst, dir: d.path };
  } finally {
    await supervisor.close();
  }
}

describe(`custody stop, recover on instance cgroups (${backend.name})`, () => {
  it("stop ends what the instance's cgroup holds, a setsid'd double-forked helper too, and removes the cgroup", async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const root = join(CGROUP_ROOT, 'stop');
    const { stateDir, inst } = await launched(root, 'esc', (tok) => ['-e', ESCAPER, '--', tok, MARKER]);
    const h = await waitFor(helper, 5000, 'the helper');
    // Out of the instance's tree and session: only its cgroup still holds it.
    expect(h.ppid).not.toBe(inst.pid);
    expect(procsOf(inst.cgroup!)).toEqual(expect.arrayContaining([inst.pid, h.pid]));
    const r = await cli(['stop', 'esc', '--grace-ms', '2000', '--state-dir', stateDir]);
    expect(r, r.stderr).toMatchObject({ code: 0, stderr: '' });
    expect(r.stdout).toMatch(
      /^stopped esc \(pid \d+\): exited \((signal SIGTERM|status unknown)\); its state is removed\n$/,
    );
    expect(isGone(inst.pid)).toBe(true);
    expect(isGone(h.pid)).toBe(true);
    expect(existsSync(inst.cgroup!)).toBe(false);
    expect(existsSync(join(stateDir, 'esc'))).toBe(false);
  });

  // A stop cut off halfway is finished through its cgroup as a running instance is stopped: the same check first.
  for (const state of ['running', 'stopping'] as const) {
    it(`a cgroup removed and made again by hand is another cgroup: a ${state} instance is quarantined (mismatch, cgroup), nothing in it signalled`, async (t) => {
      t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
      const root = join(CGROUP_ROOT, `remade-${state}`);
      const { stateDir, inst, dir } = await launched(root, 'vm', (tok) => ['-e', 'sleep 60', '--', tok, MARKER]);
      const cg = inst.cgroup!;
      // The instance ends behind custody's back; its cgroup is removed and made again under the same name.
      expect(killOwn(inst.pid)).toBe(true);
      await waitFor(() => procsOf(cg).length === 0, 5000, 'the cgroup to empty');
      await waitFor(() => {
        try {
          rmdirSync(cg);
          return true;
        } catch {
          return false;
        }
      });
      mkdirSync(cg);
      const manifest = join(stateDir, 'vm', 'manifest.json');
      if (state === 'stopping') {
        const m = JSON.parse(readFileSync(manifest, 'utf8'));
        writeFileSync(manifest, JSON.stringify({ ...m, state, stoppingSince: new Date().toISOString() }));
      }
      // Someone else's process in it, logging every signal it gets.
      const log = join(dir, 'signals.log');
      const stranger = cpSpawn(PYTHON, ['-c', SIGNAL_LOGGER, log, '0', MARKER], { stdio: 'ignore' });
      cleanups.push(() => killAndWait(stranger));
      await waitFor(() => catchesSignal(stranger.pid!, 15), 5000, "the stranger's handlers");
      writeFileSync(join(cg, 'cgroup.procs'), String(stranger.pid));
      expect(procsOf(cg)).toEqual([stranger.pid]);

      const stop = await cli(['stop', 'vm', '--state-dir', stateDir]);
      expect(stop, stop.stderr).toMatchObject({ code: 1, stdout: '' });
      expect(stop.stderr).toMatch(
        /^custody: warning: vm: its cgroup .* is cgroup \d+, not cgroup \d+ that custody recorded: .*; nothing is signalled through it$/m,
      );
      expect(stop.stderr).toMatch(/^custody: .*quarantined.* \[ERR_CUSTODY_QUARANTINED\]$/m);
      const recover = await cli(['recover', '--json', '--state-dir', stateDir]);
      expect(recover, recover.stderr).toMatchObject({ code: 0, stderr: '' });
      expect(JSON.parse(recover.stdout).quarantined).toEqual([
        expect.objectContaining({ id: 'vm', reason: 'mismatch', field: 'cgroup' }),
      ]);
      expect(JSON.parse(readFileSync(manifest, 'utf8'))).toMatchObject({
        state: 'quarantined',
        quarantine: { reason: 'mismatch', field: 'cgroup' },
      });
      expect(loggedSignals(log)).toEqual([]);
      expect(procsOf(cg)).toEqual([stranger.pid]);
      await killAndWait(stranger);
      await waitFor(() => procsOf(cg).length === 0, 5000, 'the cgroup to empty');
    });
  }
});
