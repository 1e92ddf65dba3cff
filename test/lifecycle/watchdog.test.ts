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
import { capabilities, type CustodyEvent, type ExitEvent, type StopEvent, Supervisor } from '../../src/index.js';
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
  it('is not bound again: the adopted instance runs on, and a warning says so', async () => {
    const dir = tmpDir('custody-watchdog-adopt-');
    const stateDir = join(dir.path, 'state');
    const events: CustodyEvent[] = [];
    const sups: Supervisor[] = [];
    try {
      const first = (await Supervisor.open({ stateDir, onEvent: (e) => events.push(e) })).supervisor;
      sups.push(first);
      const alive = join(dir.path, 'alive');
      writeFileSync(alive, '');
      const inst = await first.launch({
        id: 'vm',
        command: PYTHON,
        args: (t) => ['-c', DAEMON, alive, 'silent', t, MARKER],
        ready: 'notify',
        watchdogMs: 200,
        cwd: dir.path,
      });
      await first.close();
      const second = (await Supervisor.open({ stateDir, onEvent: (e) => events.push(e) })).supervisor;
      sups.push(second);
      expect(second.list()).toMatchObject([{ id: 'vm', status: 'running', pid: inst.pid }]);
      expect(events.filter((e) => e.type === 'warning' && e.id === 'vm').map((e) => e.message)).toEqual([
        "vm's watchdog is not bound again after an agent restart: its notify socket went with the supervisor that launched it",
      ]);
      const r = await second.stop('vm', { graceMs: 5000 });
      expect(r.result).toBe('stopped');
    } finally {
      for (const s of sups) await s.close();
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
