import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { backend } from '../src/backend/index.js';
import { Supervisor } from '../src/index.js';
import { expectNoLeaks } from './helpers/leaks.js';
import { isGone, loggedSignals, MARKER, tmpDir, waitFor } from './helpers/procs.js';
import { FIXTURES, PYTHON, vmArgs } from './helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });

const dist = join(import.meta.dirname, '..', 'dist', 'index.js');

/** Opens the state dir from a Node that believes it runs on macOS; returns what it saw. */
async function openAsDarwin(stateDir: string, allowUnprovable: boolean) {
  const script = `
    const { Supervisor, capabilities } = await import(${JSON.stringify(dist)});
    const events = [];
    const { supervisor, report } = await Supervisor.open({ stateDir: ${JSON.stringify(stateDir)}, allowUnprovable: ${allowUnprovable}, onEvent: (e) => events.push({ type: e.type, id: e.id }) });
    const list = supervisor.list();
    await supervisor.close();
    console.log(JSON.stringify({ caps: capabilities(), report, list, events }));`;
  const { stdout } = await promisify(execFile)(
    process.execPath,
    ['--import', join(FIXTURES, 'as-darwin.mjs'), '--input-type=module', '-e', script],
    {
      env: { ...process.env, CUSTODY_BACKEND: '' },
    },
  );
  return JSON.parse(stdout);
}

describe(`off Linux, ownership is unprovable (${backend.name})`, () => {
  it('quarantines as unprovable, or adopts with a warning each time when allowUnprovable', async () => {
    const dir = tmpDir('custody-darwin-');
    const stateDir = join(dir.path, 'state');
    const log = join(dir.path, 'signals.log');
    const { supervisor } = await Supervisor.open({ stateDir, onEvent: () => {} });
    const socket = join(dir.path, 'vm.sock');
    const inst = await supervisor.launch({
      id: 'vm',
      command: PYTHON,
      args: (t) => vmArgs(socket, t, ['--signal-log', log]),
      ready: { socket },
    });
    await supervisor.close();
    try {
      const strict = await openAsDarwin(stateDir, false);
      expect(strict.caps).toMatchObject({ backend: 'js', platform: 'darwin', proc: false, pidfd: false });
      expect(strict.caps.reason).toMatch(/darwin/);
      expect(strict.report.quarantined).toEqual([{ id: 'vm', pid: inst.pid, reason: 'unprovable' }]);
      expect(strict.list).toEqual([
        { id: 'vm', status: 'quarantined', pid: inst.pid, ppid: null, reason: 'unprovable' },
      ]);
      // Quarantine is persisted on disk, so release it before the lenient open.
      const { supervisor: s2 } = await Supervisor.open({ stateDir, onEvent: () => {} });
      expect(s2.list()).toMatchObject([{ id: 'vm', status: 'quarantined', reason: 'unprovable' }]);
      await s2.release('vm');
      await s2.close();
      expect(loggedSignals(log)).toEqual([]);
    } finally {
      process.kill(inst.pid, 'SIGKILL');
      await waitFor(() => isGone(inst.pid), 5000, 'exit');
      dir.cleanup();
    }
  });

  it('adopts with a warning when allowUnprovable', async () => {
    const dir = tmpDir('custody-darwin-');
    const stateDir = join(dir.path, 'state');
    const { supervisor } = await Supervisor.open({ stateDir, onEvent: () => {} });
    const socket = join(dir.path, 'vm.sock');
    const inst = await supervisor.launch({
      id: 'vm',
      command: PYTHON,
      args: (t) => vmArgs(socket, t),
      ready: { socket },
    });
    await supervisor.close();
    try {
      const lenient = await openAsDarwin(stateDir, true);
      expect(lenient.report.adopted).toEqual([{ id: 'vm', pid: inst.pid, reason: 'unprovable' }]);
      expect(lenient.events).toContainEqual({ type: 'warning', id: 'vm' });
      const again = await openAsDarwin(stateDir, true);
      expect(again.events).toContainEqual({ type: 'warning', id: 'vm' });
    } finally {
      process.kill(inst.pid, 'SIGKILL');
      await waitFor(() => isGone(inst.pid), 5000, 'exit');
      dir.cleanup();
    }
  });
});
