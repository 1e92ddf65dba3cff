// ready: 'notify': systemd's sd_notify protocol, spoken by a real python
// daemon through python's socket module. Only the instance's processes may
// say READY=1; a bystander of the same uid that says it first is ignored.
import { spawn as cpSpawn, execFileSync } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import {
  capabilities,
  Supervisor,
  type CustodyEvent,
  type CustodyEventOf,
  type CustodyEventType,
} from '../../src/index.js';
import { parseNotification } from '../../src/lifecycle/notify.js';
import { expectNoLeaks, processesWithMarker } from '../helpers/leaks.js';
import {
  asNamespaceInit,
  goneFrom,
  hasUnshare,
  isGone,
  isRoot,
  killAndWait,
  MARKER,
  tmpDir,
  waitFor,
} from '../helpers/procs.js';
import { CGROUP_ROOT, CGROUP_SKIP, expectNoCgroupsLeft } from '../helpers/cgroup.js';
import { DAEMON, daemonOf, launchHeld, notifySocketOf } from '../helpers/notify.js';
import { FIXTURES, openSupervisor, PYTHON } from '../helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });
expectNoCgroupsLeft();

const native = backend.name === 'native';

let ctx: Awaited<ReturnType<typeof openSupervisor>>;
afterEach(async () => {
  await ctx?.dispose();
});

const of = <T extends CustodyEventType>(events: CustodyEvent[], id: string, type: T) =>
  events.filter((e): e is CustodyEventOf<T> => e.id === id && e.type === type);

/** Whether an abstract unix socket of that name (NOTIFY_SOCKET's '@name') is bound, from /proc/net/unix. */
function bound(address: string): boolean {
  return readFileSync('/proc/net/unix', 'utf8')
    .split('\n')
    .some((l) => l.endsWith(` ${address}`));
}

/** A python process that sends one datagram to an sd_notify socket and stays `stay` seconds. */
function sendFrom(address: string, text: string, extraArgv: string[] = [], stay = 1) {
  const script = `
import socket, sys, time
a = sys.argv[1]
a = '\\0' + a[1:] if a.startswith('@') else a
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.sendto(sys.argv[2].encode(), a)
print('sent', flush=True)
time.sleep(float(sys.argv[3]))`;
  return cpSpawn(PYTHON, ['-c', script, address, text, String(stay), ...extraArgv, MARKER], {
    stdio: ['ignore', 'pipe', 'ignore'],
  });
}

function sent(child: ReturnType<typeof sendFrom>): Promise<void> {
  return new Promise((resolve, reject) => {
    child.stdout!.once('data', () => resolve());
    child.once('exit', (code) => reject(new Error(`the sender exited (${code}) before sending`)));
  });
}

describe('sd_notify datagrams (parse)', () => {
  it('reads READY, STATUS and MAINPID lines; ignores what has no "="; a bad MAINPID is NaN', () => {
    const n = parseNotification(Buffer.from('STATUS=Booting: 3/5\nnonsense\nREADY=1\nMAINPID=4242\n'));
    expect(n).toMatchObject({ ready: true, status: 'Booting: 3/5', mainPid: 4242 });
    expect(parseNotification(Buffer.from('READY=0')).ready).toBe(false);
    expect(parseNotification(Buffer.from('MAINPID=12x')).mainPid).toBeNaN();
    expect(parseNotification(Buffer.from('STATUS=a=b')).status).toBe('a=b');
    expect(parseNotification(Buffer.alloc(0))).toMatchObject({ ready: false });
  });
});

describe.runIf(!native)('ready: notify on the js backend', () => {
  it('is ERR_CUSTODY_UNSUPPORTED before anything exists; capabilities() says so', async () => {
    expect(capabilities()).toMatchObject({ notify: false, notifyPidfd: false });
    ctx = await openSupervisor();
    const launching = ctx.supervisor.launch({
      id: 'n',
      command: PYTHON,
      args: (t) => [DAEMON, MARKER, t],
      ready: 'notify',
    });
    await expect(launching).rejects.toMatchObject({
      code: 'ERR_CUSTODY_UNSUPPORTED',
      message: expect.stringMatching(/native backend/),
    });
    expect(ctx.events.filter((e) => e.id === 'n')).toEqual([]);
    expect(processesWithMarker(MARKER)).toEqual([]);
  });
});

describe.runIf(native)('ready: notify (native)', () => {
  it('capabilities() reports notify, and whether senders come pinned (SO_PASSPIDFD, Linux 6.5)', () => {
    expect(capabilities().notify).toBe(true);
    const [maj, min] = (capabilities().kernel ?? '0.0').split('.').map(Number) as [number, number];
    if (maj > 6 || (maj === 6 && min >= 5)) expect(capabilities().notifyPidfd).toBe(true);
  });

  it('is ready at READY=1; STATUS= lines arrive as status events, in order; NOTIFY_SOCKET is an abstract name', async () => {
    ctx = await openSupervisor();
    const inst = await ctx.supervisor.launch({
      id: 'n',
      command: PYTHON,
      args: (t) => [DAEMON, MARKER, t, '--status', 'loading', '--status', 'almost', '--delay', '0.2'],
      ready: 'notify',
    });
    expect(of(ctx.events, 'n', 'status').map((e) => e.status)).toEqual(['loading', 'almost']);
    expect(ctx.events.filter((e) => e.id === 'n').map((e) => e.type)).toEqual([
      'launch',
      'spawn',
      'confirm',
      'status',
      'status',
      'ready',
      'running',
    ]);
    expect(notifySocketOf(inst.pid)).toMatch(/^@custody\/notify\/[0-9a-f]{32}$/);
    await ctx.supervisor.stop('n', { graceMs: 2000 });
    expect(isGone(inst.pid)).toBe(true);
  });

  it('once running, STATUS= updates keep coming as status events; the socket closes with the instance, or the supervisor', async () => {
    ctx = await openSupervisor();
    const later = ['serving 1 client', 'serving 2 clients'];
    const args = (t: string) => [DAEMON, MARKER, t, ...later.flatMap((l) => ['--later', l])];
    const a = await ctx.supervisor.launch({ id: 'a', command: PYTHON, args, ready: 'notify' });
    const b = await ctx.supervisor.launch({ id: 'b', command: PYTHON, args, ready: 'notify' });
    await waitFor(() => of(ctx.events, 'a', 'status').length === 2, 10_000, 'the updates');
    expect(of(ctx.events, 'a', 'status').map((e) => e.status)).toEqual(later);
    const [sa, sb] = [notifySocketOf(a.pid), notifySocketOf(b.pid)];
    expect([bound(sa), bound(sb)]).toEqual([true, true]);
    await ctx.supervisor.stop('a', { graceMs: 2000 });
    await waitFor(() => !bound(sa), 5000, "a's socket to close");
    // Closed with the supervisor, though b runs on; the next one adopts b without a socket.
    await ctx.supervisor.close();
    expect([bound(sb), isGone(b.pid)]).toEqual([false, false]);
    const { supervisor } = await Supervisor.open({ stateDir: ctx.stateDir, onEvent: () => {} });
    try {
      await supervisor.stop('b', { graceMs: 2000 });
    } finally {
      await supervisor.close();
    }
    expect(isGone(b.pid)).toBe(true);
  });

  it('a bystander (same uid, not a member, even naming the token) that says READY=1 first is ignored', async () => {
    ctx = await openSupervisor();
    const go = join(ctx.root, 'go');
    const { launching, token } = launchHeld(ctx.supervisor, 'n', go);
    let settled = false;
    void launching.then(
      () => (settled = true),
      () => (settled = true),
    );
    const { daemon, address } = await daemonOf(token);
    const bystander = sendFrom(address, 'READY=1\nSTATUS=owned by a stranger', [token()]);
    try {
      await sent(bystander);
      await waitFor(
        () => ctx.events.some((e) => e.type === 'warning' && /notification on .* ignored/.test(String(e.message))),
        5000,
        'the rejection',
      );
      const warning = ctx.events.find((e) => e.type === 'warning' && e.pid === bystander.pid);
      expect(warning?.message).toMatch(/its argv is not the launched argv/);
      // Still waiting: the stranger's READY=1 did not count, nor its STATUS. The warning above is the
      // judgement of that very datagram, so nothing of it can count later.
      expect(settled).toBe(false);
      expect(of(ctx.events, 'n', 'status')).toEqual([]);
      writeFileSync(go, '');
      const inst = await launching;
      expect(inst.pid).toBe(daemon.pid);
      expect(isGone(bystander.pid!)).toBe(false);
    } finally {
      await killAndWait(bystander);
    }
    await ctx.supervisor.stop('n', { graceMs: 2000 });
  });

  it('READY=1 sent before the target is confirmed, by a process not provable until then, counts once it is', async () => {
    ctx = await openSupervisor();
    const pidfile = join(ctx.root, 'd.pid');
    // The daemon leaves the launcher's tree and session at once and says READY=1 while the launcher still
    // runs (Type=forking: custody waits for it to exit before the pidfile names the target).
    const inst = await ctx.supervisor.launch({
      id: 'early',
      command: '/bin/sh',
      args: (t) => [
        '-c',
        '(setsid "$0" "$@" & echo $! > "$PIDFILE"); sleep 0.5',
        PYTHON,
        DAEMON,
        MARKER,
        t,
        '--delay',
        '0',
      ],
      env: { ...process.env, PIDFILE: pidfile },
      pid: { file: pidfile },
      ready: 'notify',
      readyTimeoutMs: 10_000,
    });
    expect(inst.pid).toBe(Number(readFileSync(pidfile, 'utf8')));
    expect(of(ctx.events, 'early', 'warning')).toEqual([]);
    await ctx.supervisor.stop('early', { graceMs: 2000 });
    expect(isGone(inst.pid)).toBe(true);
  });

  it('READY=1 from a member (a child of the daemon, no token in its argv) counts', async () => {
    ctx = await openSupervisor();
    const inst = await ctx.supervisor.launch({
      id: 'm',
      command: PYTHON,
      args: (t) => [DAEMON, MARKER, t, '--member-ready'],
      ready: 'notify',
    });
    expect(of(ctx.events, 'm', 'warning')).toEqual([]);
    await ctx.supervisor.stop('m', { graceMs: 2000 });
    expect(isGone(inst.pid)).toBe(true);
  });

  it('a member that says READY=1 and exits the moment its BARRIER=1 is released counts; the barrier fd is closed', async () => {
    ctx = await openSupervisor();
    const result = join(ctx.root, 'barrier');
    const inst = await ctx.supervisor.launch({
      id: 'b',
      command: PYTHON,
      args: (t) => [DAEMON, MARKER, t, '--member-ready', '--barrier', result],
      ready: 'notify',
    });
    // 0: the fd it sent was closed by custody, after the READY=1 before it was handled.
    await waitFor(() => existsSync(result) && readFileSync(result, 'utf8'), 10_000, 'the member to exit');
    expect(readFileSync(result, 'utf8')).toBe('0');
    expect(of(ctx.events, 'b', 'warning')).toEqual([]);
    await ctx.supervisor.stop('b', { graceMs: 2000 });
    expect(isGone(inst.pid)).toBe(true);
  });

  it('in an instance cgroup, READY=1 counts from a process in it; a bystander outside it, naming the token, is ignored', async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    ctx = await openSupervisor({ cgroup: { root: CGROUP_ROOT } });
    const go = join(ctx.root, 'go');
    const { launching, token } = launchHeld(ctx.supervisor, 'cg', go, ['--member-ready']);
    const { address } = await daemonOf(token);
    const bystander = sendFrom(address, 'READY=1', [token()]);
    let cgroup: string | null = null;
    try {
      await sent(bystander);
      await waitFor(
        () => ctx.events.some((e) => e.type === 'warning' && e.pid === bystander.pid),
        5000,
        'the rejection',
      );
      expect(ctx.events.find((e) => e.type === 'warning' && e.pid === bystander.pid)?.message).toMatch(/cgroup/);
      writeFileSync(go, '');
      cgroup = (await launching).cgroup;
      expect(cgroup).not.toBeNull();
    } finally {
      await killAndWait(bystander);
    }
    await ctx.supervisor.stop('cg', { graceMs: 2000 });
    // The instance's own cgroup is gone with it (the supervisor's goes when it closes).
    expect(existsSync(cgroup!)).toBe(false);
  });

  it('MAINPID= of a forked main process is honoured and re-confirmed; the instance is that process', async () => {
    ctx = await openSupervisor();
    const inst = await ctx.supervisor.launch({
      id: 'f',
      command: PYTHON,
      args: (t) => [DAEMON, MARKER, t, '--fork-main'],
      ready: 'notify',
    });
    const spawned = of(ctx.events, 'f', 'spawn')[0]!.pid as number;
    expect(inst.pid).not.toBe(spawned);
    expect(inst.identity.pid).toBe(inst.pid);
    expect(inst.identity.argv).toContain(inst.token);
    const confirms = of(ctx.events, 'f', 'confirm');
    expect(confirms.map((e) => e.pid)).toEqual([spawned, inst.pid]);
    expect(confirms[1]!.message).toMatch(/MAINPID=/);
    await waitFor(() => goneFrom(spawned), 5000, 'the parent to exit');
    expect(ctx.supervisor.list()).toEqual([expect.objectContaining({ id: 'f', status: 'running', pid: inst.pid })]);
    await ctx.supervisor.stop('f', { graceMs: 2000 });
    expect(isGone(inst.pid)).toBe(true);
  });

  it("MAINPID= naming a process that is not the instance's is ignored (a warning); the target stays", async () => {
    ctx = await openSupervisor();
    const stranger = cpSpawn(PYTHON, ['-c', 'import time; time.sleep(60)', MARKER], { stdio: 'ignore' });
    try {
      const inst = await ctx.supervisor.launch({
        id: 's',
        command: PYTHON,
        args: (t) => [DAEMON, MARKER, t, '--mainpid', String(stranger.pid)],
        ready: 'notify',
      });
      expect(of(ctx.events, 's', 'spawn')[0]!.pid).toBe(inst.pid);
      expect(of(ctx.events, 's', 'warning').map((e) => e.message)).toEqual([
        expect.stringMatching(new RegExp(`MAINPID=${stranger.pid}: .*launch token`)),
      ]);
      await ctx.supervisor.stop('s', { graceMs: 2000 });
      expect(isGone(stranger.pid!)).toBe(false);
    } finally {
      await killAndWait(stranger);
    }
  });

  it('a daemon that exits before READY=1 fails fast with its status and stderr tail; nothing is left', async () => {
    ctx = await openSupervisor();
    const t0 = Date.now();
    const err = await ctx.supervisor
      .launch({
        id: 'x',
        command: PYTHON,
        args: (t) => [DAEMON, MARKER, t, '--status', 'opening disk', '--fail', 'cannot open disk.img'],
        ready: 'notify',
        readyTimeoutMs: 30_000,
      })
      .catch((e: unknown) => e);
    expect(err).toMatchObject({
      code: 'ERR_CUSTODY_LAUNCH_EXITED',
      exitCode: 3,
      stderrTail: expect.stringContaining('cannot open disk.img'),
    });
    // Not the 30 s bound: the exit ended the wait (generous margin for a loaded machine).
    expect(Date.now() - t0).toBeLessThan(20_000);
    expect(processesWithMarker(MARKER)).toEqual([]);
    expect(ctx.supervisor.list()).toEqual([]);
  });

  it('no READY=1 within readyTimeoutMs is ERR_CUSTODY_READY_TIMEOUT naming the last STATUS=; the attempt is abandoned', async () => {
    ctx = await openSupervisor();
    const err = await ctx.supervisor
      .launch({
        id: 't',
        command: PYTHON,
        args: (t) => [DAEMON, MARKER, t, '--status', 'waiting for the network', '--never-ready'],
        ready: 'notify',
        // Room for the daemon to start and send STATUS= on a loaded machine: the message must name it.
        readyTimeoutMs: 2500,
      })
      .catch((e: unknown) => e);
    expect(err).toMatchObject({
      code: 'ERR_CUSTODY_READY_TIMEOUT',
      message: expect.stringContaining('waiting for the network'),
    });
    expect(processesWithMarker(MARKER)).toEqual([]);
    expect(existsSync(join(ctx.stateDir, 't'))).toBe(false);
  });

  it.runIf(isRoot() && hasUnshare())(
    "a bystander's READY=1 read only after its pid went to a member is still the bystander's: ignored",
    async () => {
      const dir = tmpDir('custody-notify-reuse-');
      try {
        const out = execFileSync(
          'unshare',
          asNamespaceInit(join(FIXTURES, 'notify-reuse.mjs'), join(dir.path, 'state'), PYTHON, DAEMON, MARKER),
          { encoding: 'utf8', timeout: 60_000, env: process.env },
        );
        const result = JSON.parse(out.trim().split('\n').pop()!) as {
          notifyPidfd: boolean;
          trials: Array<{ reused: boolean; outcome: string; warning: string | null }>;
        };
        const trial = result.trials.find((t) => t.reused);
        // The set-up must have worked: the pid in the datagram's credentials names a member when it is read.
        expect(trial, JSON.stringify(result)).toBeDefined();
        expect(result.notifyPidfd).toBe(true);
        expect(trial).toMatchObject({
          outcome: 'ERR_CUSTODY_READY_TIMEOUT',
          warning: expect.stringMatching(/has exited/),
        });
      } finally {
        dir.cleanup();
      }
    },
    60_000,
  );
});
