// Readiness as real daemons signal it: Type=forking launchers, sockets that
// must be served by a live process, probes that make readiness exact.
import { execFileSync, spawn as cpSpawn } from 'node:child_process';
import { chmodSync, existsSync, lstatSync, mkdirSync, readFileSync } from 'node:fs';
import { connect, createServer } from 'node:net';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import type { CustodyEvent } from '../../src/index.js';
import { expectNoLeaks, processesWithMarker } from '../helpers/leaks.js';
import { exited, goneSince, isGone, isRoot, MARKER, untilReady, waitFor } from '../helpers/procs.js';
import { openSupervisor, PERL, PYTHON, vmArgs } from '../helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });

let ctx: Awaited<ReturnType<typeof openSupervisor>>;
afterEach(async () => {
  await ctx?.dispose();
});

const types = (events: CustodyEvent[], id: string) => events.filter((e) => e.id === id).map((e) => e.type);

/**
 * A daemon in the shape of QEMU -daemonize: the launcher forks, the fork
 * execs perl (whose argv is the token assembled from two halves), the
 * launcher writes the pidfile and exits with `code`.
 */
function forking(pidfile: string, code = 0, before = '') {
  return (t: string) => [
    '-c',
    `${before}( exec "$0" -e 'sleep 300' "$1$2" "$3" ) & echo $! > "$4"; exit ${code}`,
    PERL,
    t.slice(0, 16),
    t.slice(16),
    MARKER,
    pidfile,
  ];
}

describe(`pid: { file } as systemd Type=forking (${backend.name})`, () => {
  it('waits for the launcher to exit 0, reads the pidfile, confirms the target; a token assembled from two arguments is fine', async () => {
    ctx = await openSupervisor();
    const pidfile = join(ctx.root, 'fork.pid');
    const inst = await ctx.supervisor.launch({
      id: 'fork',
      command: 'sh',
      args: forking(pidfile),
      pid: { file: pidfile },
      executable: PERL,
    });
    expect(inst.pid).toBe(Number(readFileSync(pidfile, 'utf8')));
    expect(inst.identity.argv).toEqual([PERL, '-e', 'sleep 300', inst.token, MARKER]);
    // The launcher's own argv never carried the whole token.
    expect(types(ctx.events, 'fork')).toEqual(['launch', 'spawn', 'confirm', 'running']);
    expect(await ctx.supervisor.stop('fork', { graceMs: 5000 })).toMatchObject({ outcome: 'exited', escalated: false });
    expect(isGone(inst.pid)).toBe(true);
  });

  it('a launcher that exits non-zero is ERR_CUSTODY_LAUNCH_EXITED with its status and stderr tail, and its fork is ended', async () => {
    ctx = await openSupervisor();
    const pidfile = join(ctx.root, 'bad.pid');
    const err = await ctx.supervisor
      .launch({
        id: 'bad',
        command: 'sh',
        args: forking(pidfile, 4, 'echo "launcher: cannot open /dev/kvm" >&2; '),
        pid: { file: pidfile },
        executable: PERL,
      })
      .catch((e: unknown) => e);
    expect(err).toMatchObject({
      code: 'ERR_CUSTODY_LAUNCH_EXITED',
      exitCode: 4,
      stderrTail: expect.stringContaining('launcher: cannot open /dev/kvm'),
    });
    expect(processesWithMarker(MARKER)).toEqual([]);
    expect(ctx.supervisor.list()).toEqual([]);
  });

  it('a launcher that never exits is a confirm timeout within the deadline, not a wait for its exit', async () => {
    ctx = await openSupervisor();
    const pidfile = join(ctx.root, 'stays.pid');
    const launching = ctx.supervisor.launch({
      id: 'stays',
      command: 'sh',
      args: (t) => ['-c', `( exec "$0" -e 'sleep 300' "$1" "$2" ) & echo $! > "$3"; wait`, PERL, t, MARKER, pidfile],
      pid: { file: pidfile },
      executable: PERL,
      confirmTimeoutMs: 300,
    });
    await expect(launching).rejects.toMatchObject({
      code: 'ERR_CUSTODY_CONFIRM_TIMEOUT',
      message: expect.stringMatching(/launcherExits: false/),
    });
    expect(processesWithMarker(MARKER)).toEqual([]);
  });

  it('launcherExits: false reads the pidfile while the launcher stays; an abort ends the wait at once', async () => {
    ctx = await openSupervisor();
    const pidfile = join(ctx.root, 'scope.pid');
    const stays = (t: string) => [
      '-c',
      `( exec "$0" -e 'sleep 300' "$1" "$2" ) & echo $! > "$3"; wait`,
      PERL,
      t,
      MARKER,
      pidfile,
    ];
    const inst = await ctx.supervisor.launch({
      id: 'scope',
      command: 'sh',
      args: stays,
      pid: { file: pidfile },
      launcherExits: false,
      executable: PERL,
    });
    expect(inst.identity.argv[0]).toBe(PERL);
    await ctx.supervisor.stop('scope', { graceMs: 5000 });
    // Aborted while waiting for a launcher that never writes the pidfile.
    const ac = new AbortController();
    const launching = ctx.supervisor.launch({
      id: 'never',
      command: 'sh',
      args: (t) => ['-c', 'sleep 300', t, MARKER],
      pid: { file: join(ctx.root, 'never.pid') },
      confirmTimeoutMs: 60_000,
      signal: ac.signal,
    });
    setTimeout(() => ac.abort(), 100);
    await expect(launching).rejects.toMatchObject({ name: 'AbortError' });
    expect(processesWithMarker(MARKER)).toEqual([]);
  });

  it("the token check up front applies only to pid: 'child'", async () => {
    ctx = await openSupervisor();
    await expect(
      ctx.supervisor.launch({ id: 'fixed', command: PERL, args: ['-e', 'sleep 300'] }),
    ).rejects.toMatchObject({ code: 'ERR_CUSTODY_INVALID_ARG' });
    await expect(
      ctx.supervisor.launch({ id: 'x', command: 'sh', args: (t) => [t], pid: 'child', launcherExits: false }),
    ).rejects.toMatchObject({ code: 'ERR_CUSTODY_INVALID_ARG', message: expect.stringMatching(/launcherExits/) });
  });
});

describe(`ready bounds (${backend.name})`, () => {
  it('readyTimeoutMs bounds a socket too; ready.timeoutMs is its alias; both at once is refused', async () => {
    ctx = await openSupervisor();
    const socket = join(ctx.root, 'late.sock');
    const late = (t: string) => vmArgs(socket, t, ['--socket-delay', '30']);
    await expect(
      ctx.supervisor.launch({ id: 'a', command: PYTHON, args: late, ready: { socket }, readyTimeoutMs: 200 }),
    ).rejects.toMatchObject({
      code: 'ERR_CUSTODY_READY_TIMEOUT',
      message: expect.stringMatching(/within 200 ms/),
    });
    await expect(
      ctx.supervisor.launch({ id: 'b', command: PYTHON, args: late, ready: { socket, timeoutMs: 150 } }),
    ).rejects.toMatchObject({
      code: 'ERR_CUSTODY_READY_TIMEOUT',
      message: expect.stringMatching(/within 150 ms/),
    });
    await expect(
      ctx.supervisor.launch({
        id: 'c',
        command: PYTHON,
        args: late,
        ready: { socket, timeoutMs: 150 },
        readyTimeoutMs: 150,
      }),
    ).rejects.toMatchObject({
      code: 'ERR_CUSTODY_INVALID_ARG',
    });
    await expect(
      ctx.supervisor.launch({ id: 'd', command: PYTHON, args: late, ready: { socket, probe: 'qmp' as never } }),
    ).rejects.toMatchObject({
      code: 'ERR_CUSTODY_INVALID_ARG',
    });
    expect(processesWithMarker(MARKER)).toEqual([]);
  });
});

/**
 * A monitor that binds its control socket, then dies in init, like QEMU
 * with `-device bogus`: it accepts one connection, says nothing, and exits 1
 * shortly after.
 */
const DIES_AFTER_BIND = `
import socket, sys, time
path = sys.argv[1]
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(path)
s.listen(8)
s.settimeout(5)
try:
    c, _ = s.accept()
except OSError:
    pass
time.sleep(0.05)
sys.stderr.write("monitor: -device bogus: unknown device\\n")
sys.exit(1)
`;

/** A probe in the shape of QMP's greeting: the server speaks first, a line. */
function greeting(socket: string, signal: AbortSignal): Promise<string> {
  return new Promise((resolve, reject) => {
    const s = connect({ path: socket });
    const fail = (e: Error) => (s.destroy(), reject(e));
    signal.addEventListener('abort', () => fail(new Error('probe aborted')), { once: true });
    let buf = '';
    s.on('data', (d) => {
      buf += d.toString();
      if (buf.includes('\n')) s.destroy(), resolve(buf);
    });
    s.on('error', fail);
    s.on('end', () => fail(new Error('closed before the greeting')));
  });
}

describe(`ready: { socket, probe } (${backend.name})`, () => {
  it('a monitor that binds its socket and then dies is never reported running: LAUNCH_EXITED with its stderr', async () => {
    ctx = await openSupervisor();
    for (let i = 0; i < 5; i++) {
      const socket = join(ctx.root, `bogus-${i}.sock`);
      const err = await ctx.supervisor
        .launch({
          id: `bogus-${i}`,
          command: PYTHON,
          args: (t) => ['-c', DIES_AFTER_BIND, socket, t, MARKER],
          ready: { socket, probe: greeting },
        })
        .catch((e: unknown) => e);
      expect(err).toMatchObject({
        code: 'ERR_CUSTODY_LAUNCH_EXITED',
        exitCode: 1,
        stderrTail: expect.stringContaining('unknown device'),
      });
      expect(types(ctx.events, `bogus-${i}`)).not.toContain('running');
    }
    expect(ctx.supervisor.list()).toEqual([]);
  });

  it('a probe that fails is retried until it succeeds; a sync probe works too', async () => {
    ctx = await openSupervisor();
    const socket = join(ctx.root, 'flaky.sock');
    let calls = 0;
    const inst = await ctx.supervisor.launch({
      id: 'flaky',
      command: PYTHON,
      args: (t) => vmArgs(socket, t),
      ready: {
        socket,
        probe: async (s) => {
          expect(s).toBe(socket);
          if (++calls < 3) throw new Error(`not yet (${calls})`);
        },
      },
    });
    expect(calls).toBe(3);
    await ctx.supervisor.stop('flaky', { graceMs: 5000 });
    let syncCalls = 0;
    await ctx.supervisor.launch({
      id: 'sync',
      command: PYTHON,
      args: (t) => vmArgs(socket, t),
      ready: { socket, probe: () => void syncCalls++ },
    });
    expect(syncCalls).toBe(1);
    expect(goneSince(inst.pid, inst.identity.startTicks)).toBe(true);
  });

  it('a probe that never succeeds is ERR_CUSTODY_READY_TIMEOUT with its last error as the cause', async () => {
    ctx = await openSupervisor();
    const socket = join(ctx.root, 'mute.sock');
    let n = 0;
    const err: Error = await ctx.supervisor
      .launch({
        id: 'mute',
        command: PYTHON,
        args: (t) => vmArgs(socket, t),
        // Room for python to bind first on a loaded machine: the error must carry a probe's failure.
        readyTimeoutMs: 2500,
        ready: {
          socket,
          probe: () => {
            throw new Error(`query-status said prelaunch (${++n})`);
          },
        },
      })
      .then(
        () => new Error('launched'),
        (e: Error) => e,
      );
    expect(err).toMatchObject({ code: 'ERR_CUSTODY_READY_TIMEOUT', message: expect.stringMatching(/prelaunch/) });
    expect((err.cause as Error).message).toBe(`query-status said prelaunch (${n})`);
    expect(processesWithMarker(MARKER)).toEqual([]);
  });

  it('a probe is never called after the wait ended, even with a connect in flight when it ended', async () => {
    ctx = await openSupervisor();
    // The test serves the socket itself, in this process: its accept runs in
    // the same event-loop turn as the supervisor's connect completing, but
    // first, so aborting there ends the wait while that connect is in flight.
    const calls: boolean[] = [];
    for (let i = 0; i < 3; i++) {
      const id = `inflight${i}`;
      const socket = join(ctx.root, `${id}.sock`);
      const abort = new AbortController();
      let accepted = 0;
      const server = createServer((c) => {
        c.destroy();
        if (++accepted === 2) abort.abort();
      });
      const launched = ctx.supervisor
        .launch({
          id,
          command: PERL,
          args: (t) => ['-e', 'sleep 300', t, MARKER],
          signal: abort.signal,
          ready: {
            socket,
            probe: (_s, signal) => {
              calls.push(signal.aborted);
              throw new Error('not serving yet');
            },
          },
        })
        .then(
          () => new Error('launched'),
          (e: Error) => e,
        );
      try {
        // The launch clears its paths before the spawn: serve once it is confirmed.
        await waitFor(() => ctx.events.some((e) => e.id === id && e.type === 'confirm'), 5000, 'confirm');
        await new Promise<void>((r) => server.listen(socket, r));
        expect(await launched).toMatchObject({ name: 'AbortError' });
      } finally {
        server.close();
      }
    }
    // One probe per accepted connect before the abort; none with the wait over.
    expect(calls).toEqual([false, false, false]);
    expect(processesWithMarker(MARKER)).toEqual([]);
  });

  it('without a probe, a socket still served after its process died is not readiness', async () => {
    ctx = await openSupervisor();
    // The target forks a helper and exits 1; the helper waits for its parent
    // to be gone, then listens on the socket: every connect succeeds only
    // after the target died. (Launched Type=forking, so the target is not
    // our child and its exit is seen as a non-child's.)
    const program = `
import os, socket, sys, time
if os.fork() == 0:
    ppid = os.getppid()
    while os.getppid() == ppid:
        time.sleep(0.005)
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.bind(sys.argv[1])
    s.listen(8)
    time.sleep(300)
time.sleep(0.3)
sys.stderr.write("monitor: died in init\\n")
sys.exit(1)
`;
    for (let i = 0; i < 2; i++) {
      const socket = join(ctx.root, `orphan-${i}.sock`);
      const pidfile = join(ctx.root, `orphan-${i}.pid`);
      const err = await ctx.supervisor
        .launch({
          id: `orphan-${i}`,
          command: 'sh',
          args: (t) => [
            '-c',
            `( exec "$0" -c "$1" "$2" "$3" "$4" ) & echo $! > "$5"; exit 0`,
            PYTHON,
            program,
            socket,
            t,
            MARKER,
            pidfile,
          ],
          pid: { file: pidfile },
          executable: PYTHON,
          ready: { socket },
        })
        .catch((e: unknown) => e);
      expect(err).toMatchObject({
        code: 'ERR_CUSTODY_LAUNCH_EXITED',
        stderrTail: expect.stringContaining('died in init'),
      });
      expect(types(ctx.events, `orphan-${i}`)).not.toContain('running');
      expect(existsSync(socket)).toBe(false);
    }
    expect(processesWithMarker(MARKER)).toEqual([]);
  });
});

/** A unix listener, at most 60 s: says "ready" once listening, then "accepted" at each connection. */
const LISTENER = `
import socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind(sys.argv[1])
s.listen(8)
print('ready', flush=True)
deadline = time.time() + 60
while time.time() < deadline:
    s.settimeout(deadline - time.time())
    try:
        c, _ = s.accept()
    except OSError:
        break
    print('accepted', flush=True)
    c.close()
`;
const NOBODY = 65534;
const AS_NOBODY = [`--reuid=${NOBODY}`, `--regid=${NOBODY}`, '--clear-groups', '--'];
const asNobody = (...argv: string[]) => execFileSync('setpriv', [...AS_NOBODY, ...argv], { timeout: 10_000 });

describe(`ready: { socket } in a dir others can write (${backend.name})`, () => {
  /** A supervisor whose `confirm` of `id` runs `onConfirm` (before readiness is waited for), and a sticky dir like /tmp. */
  async function sharedDir(id: string, onConfirm: (shared: string) => void): Promise<string> {
    let shared = '';
    ctx = await openSupervisor({ onEvent: (e) => e.type === 'confirm' && e.id === id && onConfirm(shared) });
    shared = join(ctx.root, 'shared');
    chmodSync(ctx.root, 0o755);
    mkdirSync(shared);
    chmodSync(shared, 0o1777);
    return shared;
  }

  /** LISTENER run by another uid, listening once this resolves; end() ends it, by its pid, and waits. */
  async function foreignListener(path: string) {
    const child = cpSpawn('setpriv', [...AS_NOBODY, PYTHON, '-c', LISTENER, path, MARKER], {
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let said = '';
    child.stdout.on('data', (d: Buffer) => (said += d.toString()));
    const end = async () => {
      child.kill('SIGKILL');
      await exited(child);
    };
    const gone = exited(child).then(() => Promise.reject(new Error(`the listener exited: ${said}`)));
    await Promise.race([untilReady(child.stdout), gone]).catch(async (err) => {
      await end();
      throw err;
    });
    gone.catch(() => {});
    return { said: () => said, end };
  }

  const sleeper = (t: string) => ['-e', 'sleep 300', t, MARKER];

  // What another uid does at the path once the launch has cleared it, with the listener it runs meanwhile
  // (at theirs.sock); and what the timeout must say.
  const lures = [
    {
      what: 'a symlink to its own listening socket',
      plant: (d: string) => asNobody('ln', '-s', join(d, 'theirs.sock'), join(d, 'vm.sock')),
      why: 'it is a symlink (never followed)',
    },
    {
      what: 'its own listening socket, moved there',
      plant: (d: string) => asNobody('mv', join(d, 'theirs.sock'), join(d, 'vm.sock')),
      why: `it is owned by uid ${NOBODY};`,
    },
  ];

  it.for(lures)('another uid puts $what at the path: never readiness, and the timeout says why', async (lure, t) => {
    t.skip(!isRoot(), 'needs root: another uid (setpriv) runs the listener and plants it');
    const shared = await sharedDir('lured', lure.plant);
    const socket = join(shared, 'vm.sock');
    const theirs = await foreignListener(join(shared, 'theirs.sock'));
    try {
      const err = await ctx.supervisor
        .launch({ id: 'lured', command: PERL, args: sleeper, ready: { socket }, readyTimeoutMs: 1000 })
        .catch((e: unknown) => e);
      expect(err).toMatchObject({
        code: 'ERR_CUSTODY_READY_TIMEOUT',
        message: expect.stringContaining(`never connected to ${socket}: ${lure.why}`),
      });
      // Never connected to: it accepted nothing.
      expect(theirs.said()).toBe('ready\n');
    } finally {
      await theirs.end();
    }
    expect(processesWithMarker(MARKER)).toEqual([]);
  });

  it('the socket of an instance that runs as another uid is its readiness', async (t) => {
    t.skip(!isRoot(), 'needs root: the instance runs as another uid (setpriv)');
    const shared = await sharedDir('own', () => {});
    const socket = join(shared, 'vm.sock');
    const inst = await ctx.supervisor.launch({
      id: 'own',
      command: 'setpriv',
      args: (tok) => [...AS_NOBODY, PYTHON, ...vmArgs(socket, tok)],
      executable: PYTHON,
      uid: NOBODY,
      ready: { socket },
    });
    expect([inst.identity.uid, lstatSync(socket).uid]).toEqual([NOBODY, NOBODY]);
    await ctx.supervisor.stop('own', { graceMs: 5000 });
    expect(goneSince(inst.pid, inst.identity.startTicks)).toBe(true);
  });
});
