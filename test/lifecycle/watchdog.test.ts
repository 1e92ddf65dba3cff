// The sd_notify watchdog (LaunchSpec.watchdogMs, systemd's WatchdogSec=):
// a real python daemon speaking sd_notify pings WATCHDOG=1 while a file
// exists; without pings for watchdogMs (or on WATCHDOG=trigger) custody
// sends SIGABRT, and one that ignores it is stopped after as long again.
// Every such end says result 'watchdog'. The native backend only (ready:
// 'notify'); the js backend refuses it as capabilities() says.
import { existsSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { spawn } from 'node:child_process';
import {
  capabilities,
  type CustodyEvent,
  type ExitEvent,
  type LaunchSpec,
  type StopEvent,
  Supervisor,
} from '../../src/index.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { MARKER, tmpDir, waitFor } from '../helpers/procs.js';
import { openSupervisor, PERL, PYTHON } from '../helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });

let ctx: Awaited<ReturnType<typeof openSupervisor>> | undefined;
afterEach(async () => {
  await ctx?.dispose();
  ctx = undefined;
});

/**
 * argv: alive-file mode token marker. READY=1, then WATCHDOG=1 every 20 ms while alive-file exists, counting
 * them into alive-file.pings; once it is gone, nothing more ('silent') or one WATCHDOG=trigger ('trigger').
 * 'ignore-abrt' also ignores SIGABRT. Writes WATCHDOG_USEC as it got it to alive-file.env.
 */
const DAEMON = `
import os, signal, socket, sys, time
alive, mode = sys.argv[1], sys.argv[2]
if mode == 'ignore-abrt':
    signal.signal(signal.SIGABRT, signal.SIG_IGN)
addr = os.environ['NOTIFY_SOCKET']
addr = '\\0' + addr[1:] if addr.startswith('@') else addr
sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
class s:
    # Sends on; one with nobody on the socket (a supervisor gone) is lost, as sd_notify's would be.
    @staticmethod
    def sendto(data, to):
        try:
            sock.sendto(data, to)
        except OSError:
            pass
with open(alive + '.env', 'w') as f:
    f.write(os.environ.get('WATCHDOG_USEC', '') + ' ' + os.environ.get('WATCHDOG_PID', ''))
s.sendto(b'READY=1', addr)
pings, triggered = 0, False
for _ in range(3000):
    if os.path.exists(alive):
        s.sendto(b'WATCHDOG=1', addr)
        pings += 1
        with open(alive + '.pings', 'w') as f:
            f.write(str(pings))
    elif mode == 'trigger' and not triggered:
        s.sendto(b'WATCHDOG=trigger', addr)
        triggered = True
    time.sleep(0.02)
`;

async function launchDaemon(id: string, mode: string, watchdogMs: number) {
  const alive = join(ctx!.root, `${id}.alive`);
  writeFileSync(alive, '');
  const inst = await ctx!.supervisor.launch({
    id,
    command: PYTHON,
    args: (t) => ['-c', DAEMON, alive, mode, t, MARKER],
    ready: 'notify',
    watchdogMs,
    // A SIGABRT may write a core: into this test's dir, not the repository.
    cwd: ctx!.root,
  });
  return { inst, alive };
}

const pingsSent = (alive: string) => {
  try {
    return Number(readFileSync(`${alive}.pings`, 'utf8'));
  } catch {
    return 0;
  }
};

const exitEvent = (id: string) =>
  waitFor(() => ctx?.events.find((e): e is ExitEvent => e.type === 'exit' && e.id === id), 20_000, `the exit of ${id}`);

const watchdogWarnings = (id: string) =>
  ctx!.events.filter((e) => e.type === 'warning' && e.id === id && e.message.startsWith('watchdog:'));

describe.runIf(capabilities().notify)(`the watchdog (${backend.name})`, () => {
  it('pings keep it running; once they stop, SIGABRT, and its end says watchdog', async () => {
    ctx = await openSupervisor();
    const { inst, alive } = await launchDaemon('pinged', 'silent', 300);
    expect(readFileSync(`${alive}.env`, 'utf8')).toBe('300000 ');
    // Ten times the watchdog's period of pings: it is still running.
    await waitFor(() => pingsSent(alive) >= 150, 20_000, '150 pings');
    expect(ctx.supervisor.list()).toMatchObject([{ id: 'pinged', status: 'running' }]);
    expect(watchdogWarnings('pinged')).toEqual([]);
    rmSync(alive);
    const exit = await exitEvent('pinged');
    expect(exit).toMatchObject({ pid: inst.pid, signal: 'SIGABRT', result: 'watchdog' });
    expect(inst.lastExit?.result).toBe('watchdog');
    expect(watchdogWarnings('pinged').map((e) => e.message)).toEqual([
      `watchdog: no WATCHDOG=1 within 300 ms; SIGABRT to pid ${inst.pid}`,
    ]);
  });

  it('a restart policy restarts after a watchdog end (on-abnormal), until its limit', async () => {
    ctx = await openSupervisor();
    const alive = join(ctx.root, 'r.alive');
    await ctx.supervisor.launch({
      id: 'r',
      command: PYTHON,
      args: (t) => ['-c', DAEMON, alive, 'silent', t, MARKER],
      ready: 'notify',
      watchdogMs: 200,
      cwd: ctx.root,
      restart: { when: 'on-abnormal', delayMs: 0, limit: { count: 1, withinMs: 60_000 } },
    });
    // No alive file: neither run pings, so each ends by its watchdog.
    await waitFor(() => ctx?.events.find((e) => e.type === 'gave-up'), 20_000, 'gave-up');
    const restarts = ctx.events.filter((e) => e.type === 'restart');
    expect(restarts.map((e) => (e as { result: string }).result)).toEqual(['watchdog']);
    expect(ctx.supervisor.list()).toMatchObject([
      { id: 'r', status: 'failed', restarts: 1, exit: { result: 'watchdog' } },
    ]);
  });

  it('WATCHDOG=trigger is SIGABRT at once', async () => {
    ctx = await openSupervisor();
    // A period far longer than this test: only the trigger can end it in time.
    const { inst, alive } = await launchDaemon('triggered', 'trigger', 60_000);
    rmSync(alive);
    expect(await exitEvent('triggered')).toMatchObject({ signal: 'SIGABRT', result: 'watchdog' });
    expect(watchdogWarnings('triggered').map((e) => e.message)).toEqual([
      `watchdog: WATCHDOG=trigger; SIGABRT to pid ${inst.pid}`,
    ]);
  });

  it('one that ignores SIGABRT is stopped after as long again; the stop says watchdog', async () => {
    ctx = await openSupervisor();
    const { inst, alive } = await launchDaemon('stubborn', 'ignore-abrt', 200);
    rmSync(alive);
    const stop = await waitFor(
      () => ctx?.events.find((e): e is StopEvent => e.type === 'stop' && e.id === 'stubborn'),
      20_000,
      'the stop',
    );
    expect(stop).toMatchObject({ outcome: 'exited', signal: 'SIGTERM', result: 'watchdog' });
    expect(inst.lastExit?.result).toBe('watchdog');
    expect(existsSync(join(ctx.stateDir, 'stubborn'))).toBe(false);
  });
});

describe.runIf(capabilities().notify)(`the watchdog after an agent restart (${backend.name})`, () => {
  /** A state dir where `vm` (the daemon, pinging while `alive` exists) was launched with a watchdog, and its supervisor closed. */
  async function launchedAndClosed(watchdogMs: number) {
    const dir = tmpDir('custody-watchdog-adopt-');
    const stateDir = join(dir.path, 'state');
    const alive = join(dir.path, 'alive');
    writeFileSync(alive, '');
    const spec: LaunchSpec = {
      id: 'vm',
      command: PYTHON,
      args: (t) => ['-c', DAEMON, alive, 'silent', t, MARKER],
      ready: 'notify',
      watchdogMs,
      cwd: dir.path,
    };
    const first = (await Supervisor.open({ stateDir, onEvent: () => {} })).supervisor;
    const inst = await first.launch(spec);
    await first.close();
    return { dir, stateDir, alive, spec, inst };
  }

  it('its notify socket is bound again under the recorded name: pings keep it running, and a miss ends it (watchdog)', async () => {
    const { dir, stateDir, alive, spec, inst } = await launchedAndClosed(300);
    const events: CustodyEvent[] = [];
    const second = (await Supervisor.open({ stateDir, specs: { vm: spec }, onEvent: (e) => events.push(e) }))
      .supervisor;
    try {
      expect(second.list()).toMatchObject([{ id: 'vm', status: 'running', pid: inst.pid }]);
      const from = pingsSent(alive);
      // Ten periods of pings after the adoption: still running, nothing fired.
      await waitFor(() => pingsSent(alive) >= from + 150, 20_000, '150 pings after the adoption');
      expect(second.list()).toMatchObject([{ id: 'vm', status: 'running' }]);
      expect(events.filter((e) => e.type === 'warning')).toEqual([]);
      rmSync(alive);
      const exit = await waitFor(() => events.find((e): e is ExitEvent => e.type === 'exit'), 20_000, 'the exit');
      expect(exit).toMatchObject({ pid: inst.pid, signal: 'SIGABRT', result: 'watchdog' });
    } finally {
      await second.close();
      dir.cleanup();
    }
  });

  it('a name another process holds now is a warning: no watchdog, the instance adopted and left running', async () => {
    const { dir, stateDir, spec, inst } = await launchedAndClosed(200);
    const name = JSON.parse(readFileSync(join(stateDir, 'vm', 'manifest.json'), 'utf8')).notify as string;
    const squatter = spawn(
      PYTHON,
      [
        '-c',
        `import socket, sys, time\ns = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)\ns.bind('\\0' + sys.argv[1])\nprint('bound', flush=True)\ntime.sleep(60)`,
        name,
        MARKER,
      ],
      { stdio: ['ignore', 'pipe', 'inherit'] },
    );
    const events: CustodyEvent[] = [];
    let second: Supervisor | undefined;
    try {
      await new Promise((r) => squatter.stdout!.once('data', r));
      second = (await Supervisor.open({ stateDir, specs: { vm: spec }, onEvent: (e) => events.push(e) })).supervisor;
      expect(events.filter((e) => e.type === 'warning').map((e) => e.message)).toEqual([
        expect.stringMatching(
          new RegExp(`^vm's watchdog is off: its notify socket @${name} could not be bound again \\(.*EADDRINUSE`),
        ),
      ]);
      // Four periods without pings it can hear: nothing fires.
      await new Promise((r) => setTimeout(r, 800));
      expect(second.list()).toMatchObject([{ id: 'vm', status: 'running', pid: inst.pid }]);
      expect((await second.stop('vm', { graceMs: 5000 })).result).toBe('stopped');
    } finally {
      squatter.kill('SIGKILL');
      await second?.close();
      dir.cleanup();
    }
  });
});

describe(`the watchdog's spec (${backend.name})`, () => {
  it("needs ready: 'notify', where the backend has it", async () => {
    ctx = await openSupervisor();
    const base = { id: 'w', command: PERL, args: (t: string) => ['-e', 'sleep 30', '--', t, MARKER] };
    await expect(ctx.supervisor.launch({ ...base, watchdogMs: 1000 })).rejects.toMatchObject({
      code: 'ERR_CUSTODY_INVALID_ARG',
    });
    const notify = ctx.supervisor.launch({ ...base, ready: 'notify', watchdogMs: 0 });
    await expect(notify).rejects.toMatchObject({
      code: capabilities().notify ? 'ERR_CUSTODY_INVALID_ARG' : 'ERR_CUSTODY_UNSUPPORTED',
    });
    expect(ctx.supervisor.list()).toEqual([]);
  });
});
