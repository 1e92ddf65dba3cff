// ready: 'notify' under a flood. Anyone in the network namespace can send
// to the abstract socket: another uid's datagrams stuffed with fds must not
// exhaust the agent's fd table, and a same-uid stranger's READY=1s must not
// crowd the daemon's own out of the datagrams held until the target is known.
import { spawn as cpSpawn, execFileSync } from 'node:child_process';
import { existsSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import type { CustodyEvent } from '../../src/index.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { isGone, isRoot, killAndWait, MARKER, waitFor } from '../helpers/procs.js';
import { DAEMON, daemonOf, launchHeld } from '../helpers/notify.js';
import { openSupervisor, PYTHON } from '../helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });

/** Debian's python, which uid 65534 can run (the suite's own python may live under root's home). */
const SYSTEM_PYTHON = '/usr/bin/python3';
const native = backend.name === 'native';

let ctx: Awaited<ReturnType<typeof openSupervisor>>;
afterEach(async () => {
  await ctx?.dispose();
});

/**
 * Sends `count` datagrams of `text` to an sd_notify address, each with `fds` fds (SCM_RIGHTS, all on
 * /dev/null). The kernel bounds the fds a user has in flight (ETOOMANYREFS): the sender waits for the
 * receiver to take them, within a bound. Prints 'sent' once every datagram is queued.
 */
const FLOOD = `
import array, errno, os, socket, sys, time
a, text, count, nfds = sys.argv[1], sys.argv[2].encode(), int(sys.argv[3]), int(sys.argv[4])
a = '\\0' + a[1:] if a.startswith('@') else a
fds = [os.open('/dev/null', os.O_RDONLY) for _ in range(nfds)]
control = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array('i', fds))] if fds else []
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
for _ in range(count):
    for attempt in range(1000):
        try:
            s.sendmsg([text], control, 0, a)
            break
        except OSError as e:
            if e.errno != errno.ETOOMANYREFS:
                raise
            time.sleep(0.01)
    else:
        sys.exit(2)
print('sent', flush=True)`;

function flood(prefix: string[], python: string, address: string, text: string, count: number, fds: number) {
  const [cmd, ...args] = [...prefix, python, '-c', FLOOD, address, text, String(count), String(fds), MARKER];
  return cpSpawn(cmd!, args, { stdio: ['ignore', 'pipe', 'pipe'] });
}

/** Resolves once the flood has queued every datagram and exited 0 (call it at once: it reads the output). */
async function floodDone(child: ReturnType<typeof flood>): Promise<void> {
  let out = '';
  let err = '';
  child.stdout!.on('data', (b: Buffer) => (out += b.toString()));
  child.stderr!.on('data', (b: Buffer) => (err += b.toString()));
  // 'close': the exit and all of its output.
  await new Promise((resolve) => child.once('close', resolve));
  if (child.exitCode !== 0 || !out.includes('sent')) throw new Error(`the flood failed (${child.exitCode}): ${err}`);
}

const warningsFrom = (events: CustodyEvent[], pid: number | undefined) =>
  events.filter((e) => e.type === 'warning' && e.pid === pid).map((e) => String(e.message));

const fdCount = () => readdirSync('/proc/self/fd').length;

/** This process's RLIMIT_NOFILE, set and read with util-linux's prlimit (Node has no setrlimit). */
function nofile(value?: string): [string, string] {
  const args = ['--pid', String(process.pid), value ? `--nofile=${value}` : '--nofile'];
  const out = execFileSync('prlimit', [...args, '--raw', '--noheadings', '--output=SOFT,HARD'], { encoding: 'utf8' });
  return out.trim().split(/\s+/) as [string, string];
}

describe.runIf(native)('ready: notify under a flood (native)', () => {
  it.runIf(isRoot() && existsSync(SYSTEM_PYTHON))(
    "another uid's datagrams of 250 fds each, in an agent allowed 1024 fds: dropped, with warnings that name them; " +
      "the daemon's READY=1 counts, and the agent's fd count returns to where it was",
    async () => {
      ctx = await openSupervisor();
      const [soft, hard] = nofile();
      nofile(`1024:${hard}`);
      let stranger: ReturnType<typeof flood> | null = null;
      try {
        const baseline = fdCount();
        const go = join(ctx.root, 'go');
        const { launching, token } = launchHeld(ctx.supervisor, 'n', go, [], 30_000);
        const { address } = await daemonOf(token);
        // 40 datagrams of 250 fds: 10,000 fds, ten times what the agent may hold.
        const setpriv = ['setpriv', '--reuid=65534', '--regid=65534', '--clear-groups'];
        stranger = flood(setpriv, SYSTEM_PYTHON, address, 'READY=1', 40, 250);
        const done = floodDone(stranger);
        // Awaited below, once the launch is through; a launch that fails first must not leave it unhandled.
        done.catch(() => {});
        await waitFor(() => warningsFrom(ctx.events, stranger!.pid).length > 0, 10_000, 'the first dropped datagram');
        // The daemon says READY=1 while the flood goes on.
        writeFileSync(go, '');
        const inst = await launching;
        await done;
        const dropped = warningsFrom(ctx.events, stranger.pid);
        expect(dropped.length).toBeGreaterThan(0);
        for (const m of dropped) expect(m).toMatch(/a datagram with more fds than a notification passes \(\d arrived/);
        await ctx.supervisor.stop('n', { graceMs: 2000 });
        expect(isGone(inst.pid)).toBe(true);
        // Every fd that came with a datagram, and every sender pin, is closed.
        await waitFor(() => fdCount() <= baseline, 5000, `the fd count back to ${baseline} (now ${fdCount()})`);
      } finally {
        if (stranger) await killAndWait(stranger);
        nofile(`${soft}:${hard}`);
      }
    },
    60_000,
  );

  /**
   * A launch whose target is known only once its launcher exits (a pidfile): until then its daemon, which
   * called setsid, cannot be proven, so what it sends is held. The launcher exits once `until` exists.
   * `inTree`: the daemon's parent (a subshell that waits for it) stays, so it descends from the launcher.
   */
  function pidfileLaunch(id: string, inTree: boolean, until: string, daemonArgs: string[]) {
    const pidfile = join(ctx.root, `${id}.pid`);
    const start = inTree
      ? '(setsid "$0" "$@" & echo $! > "$PIDFILE"; wait) &'
      : '(setsid "$0" "$@" & echo $! > "$PIDFILE");';
    const hold = 'i=0; while [ ! -e "$UNTIL" ] && [ $i -lt 400 ]; do sleep 0.05; i=$((i+1)); done';
    let token = '';
    const launching = ctx.supervisor.launch({
      id,
      command: '/bin/sh',
      args: (t) => {
        token = t;
        return ['-c', `${start} ${hold}`, PYTHON, DAEMON, MARKER, t, '--delay', '0', '--lifetime', '30', ...daemonArgs];
      },
      env: { ...process.env, PIDFILE: pidfile, UNTIL: until },
      pid: { file: pidfile },
      ready: 'notify',
      readyTimeoutMs: 20_000,
    });
    return { launching, token: () => token };
  }

  /**
   * A same-uid stranger sends 100 READY=1, `release()` lets the launch go on, and the launch must be the
   * daemon's, nothing it sent dropped. The stranger's drops are waited for first (at least `drops`).
   */
  async function strangerFloods(
    launching: Promise<{ pid: number }>,
    address: string,
    daemon: number,
    drops: number,
    release: () => void,
  ) {
    const stranger = flood([], PYTHON, address, 'READY=1', 100, 0);
    try {
      await floodDone(stranger);
      await waitFor(() => warningsFrom(ctx.events, stranger.pid).length >= drops, 10_000, 'the strangers dropped');
      release();
      expect((await launching).pid).toBe(daemon);
      expect(warningsFrom(ctx.events, daemon)).toEqual([]);
      return warningsFrom(ctx.events, stranger.pid);
    } finally {
      await killAndWait(stranger);
    }
  }

  it("a same-uid stranger's 100 READY=1 before the daemon's own, all held for the target: the daemon's counts", async () => {
    ctx = await openSupervisor();
    const [go, sent] = [join(ctx.root, 'go'), join(ctx.root, 'sent')];
    const { launching, token } = pidfileLaunch('early', false, sent, ['--wait-file', go, '--sent-file', sent]);
    const { daemon, address } = await daemonOf(token);
    // Past the held slots, the oldest strangers' are dropped (the first few with a warning); then the daemon's.
    const dropped = await strangerFloods(launching, address, daemon.pid, 5, () => writeFileSync(go, ''));
    expect(dropped[0]).toMatch(/oldest of too many from processes outside the launch/);
    await ctx.supervisor.stop('early', { graceMs: 2000 });
    expect(isGone(daemon.pid)).toBe(true);
  }, 60_000);

  it("the daemon's READY=1, from a descendant of the launcher, is kept through a stranger's 100 after it", async () => {
    ctx = await openSupervisor();
    const [go, sent] = [join(ctx.root, 'go'), join(ctx.root, 'sent')];
    const { launching, token } = pidfileLaunch('tree', true, go, ['--sent-file', sent]);
    const { daemon, address } = await daemonOf(token);
    await waitFor(() => existsSync(sent), 10_000, "the daemon's READY=1");
    // The first drop is a stranger's: past the held slots the strangers' oldest go, never the daemon's older one.
    await strangerFloods(launching, address, daemon.pid, 1, () => writeFileSync(go, ''));
    await ctx.supervisor.stop('tree', { graceMs: 2000 });
    expect(isGone(daemon.pid)).toBe(true);
  }, 60_000);
});
