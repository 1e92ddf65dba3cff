import { execFile } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterEach, describe, expect, it } from 'vitest';
import { backend } from '../src/backend/index.js';
import { inspect, Supervisor } from '../src/index.js';
import { expectNoLeaks } from './helpers/leaks.js';
import { isGone, loggedSignals, MARKER, tmpDir, waitFor } from './helpers/procs.js';
import { PYTHON, vmArgs } from './helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });

const CLI = join(import.meta.dirname, '..', 'dist', 'cli.js');

async function cli(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await promisify(execFile)(process.execPath, [CLI, ...args], { env: { ...process.env, CUSTODY_BACKEND: backend.name } });
    return { code: 0, stdout, stderr };
  } catch (err) {
    const e = err as { code: number; stdout: string; stderr: string };
    return { code: e.code, stdout: e.stdout, stderr: e.stderr };
  }
}

const cleanups: Array<() => Promise<void> | void> = [];
afterEach(async () => {
  while (cleanups.length) await cleanups.pop()!();
});

async function stateWithQuarantine() {
  const dir = tmpDir('custody-cli-');
  const stateDir = join(dir.path, 'state');
  const log = join(dir.path, 'signals.log');
  const { supervisor } = await Supervisor.open({ stateDir, onEvent: () => {} });
  const pids: number[] = [];
  for (const id of ['ok', 'bad']) {
    const socket = join(dir.path, `${id}.sock`);
    pids.push((await supervisor.launch({ id, command: PYTHON, args: (t) => vmArgs(socket, t, ['--signal-log', log]), ready: { socket } })).pid);
  }
  await supervisor.close();
  const mPath = join(stateDir, 'bad', 'manifest.json');
  const m = JSON.parse(readFileSync(mPath, 'utf8'));
  writeFileSync(mPath, JSON.stringify({ ...m, identity: { ...m.identity, startTicks: m.identity.startTicks + 3 } }));
  cleanups.push(async () => {
    for (const pid of pids) {
      try {
        process.kill(pid, 'SIGKILL');
      } catch {
        // gone
      }
    }
    await waitFor(() => pids.every(isGone), 5000, 'cleanup').catch(() => {});
    dir.cleanup();
  });
  return { stateDir, log, pids };
}

describe(`custody CLI (${backend.name})`, () => {
  it('inspect PID prints the identity, as JSON with --json', async () => {
    const r = await cli(['inspect', String(process.pid), '--json']);
    expect(r.code).toBe(0);
    const id = JSON.parse(r.stdout);
    const mine = inspect(process.pid);
    expect(id).toMatchObject({ pid: process.pid, startTicks: mine.startTicks, bootId: mine.bootId, argv: mine.argv });
    const human = await cli(['inspect', String(process.pid)]);
    expect(human.stdout).toMatch(new RegExp(`^pid\\s+${process.pid}$`, 'm'));
  });

  it('ls shows every instance with what it verifies as, without changing anything', async () => {
    const s = await stateWithQuarantine();
    const r = await cli(['ls', '--state-dir', s.stateDir, '--json']);
    expect(r.code).toBe(0);
    const rows = JSON.parse(r.stdout);
    expect(rows.map((x: { id: string; state: string; verdict: string }) => [x.id, x.state, x.verdict])).toEqual([
      ['bad', 'running', 'reused:startTicks'],
      ['ok', 'running', 'ok'],
    ]);
    const table = await cli(['ls', '--state-dir', s.stateDir]);
    expect(table.stdout.split('\n')[0]).toMatch(/^ID\s+STATE\s+PID\s+VERDICT/);
  });

  it('recover prints the report; release clears the quarantine without a signal', async () => {
    const s = await stateWithQuarantine();
    const r = await cli(['recover', '--state-dir', s.stateDir, '--json']);
    expect(r.code).toBe(0);
    const report = JSON.parse(r.stdout);
    expect(report.adopted.map((e: { id: string }) => e.id)).toEqual(['ok']);
    expect(report.quarantined).toEqual([{ id: 'bad', pid: s.pids[1], reason: 'reused', field: 'startTicks' }]);
    const rel = await cli(['release', 'bad', '--state-dir', s.stateDir]);
    expect(rel.code).toBe(0);
    expect(rel.stdout).toMatch(/released bad/);
    const after = JSON.parse((await cli(['ls', '--state-dir', s.stateDir, '--json'])).stdout);
    expect(after.map((x: { id: string }) => x.id)).toEqual(['ok']);
    expect(loggedSignals(s.log)).toEqual([]);
    expect(isGone(s.pids[1]!)).toBe(false);
  });

  it('refuses to change a state dir a running supervisor holds, naming the holder', async () => {
    const s = await stateWithQuarantine();
    const { supervisor } = await Supervisor.open({ stateDir: s.stateDir, onEvent: () => {} });
    cleanups.push(() => supervisor.close());
    for (const args of [['recover'], ['release', 'bad']]) {
      const r = await cli([...args, '--state-dir', s.stateDir]);
      expect(r.code).toBe(1);
      expect(r.stderr.trim().split('\n')).toHaveLength(1);
      expect(r.stderr).toContain(`pid ${process.pid}`);
      expect(r.stderr).toContain('ERR_CUSTODY_STATE_LOCKED');
    }
  });

  it('exits 2 with usage on bad invocations and 1 with one line on errors', async () => {
    expect((await cli([])).code).toBe(2);
    expect((await cli(['frobnicate'])).code).toBe(2);
    expect((await cli(['inspect'])).code).toBe(2);
    expect((await cli(['ls', '--bogus'])).code).toBe(2);
    const bad = await cli(['inspect', '0']);
    expect(bad.code).toBe(1);
    expect(bad.stderr).toMatch(/^custody: .*\[ERR_CUSTODY_INVALID_ARG\]\n$/);
    const dir = tmpDir();
    cleanups.push(() => dir.cleanup());
    const rel = await cli(['release', 'nothing', '--state-dir', join(dir.path, 'state')]);
    expect(rel.code).toBe(1);
    expect(rel.stderr).toMatch(/ERR_CUSTODY_NOT_FOUND/);
  });
});
