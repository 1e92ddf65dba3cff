/**
 * The ownership rule against bystanders that name the token: an operator's
 * `tail -f <token>.log`, another uid's copy, the caller's own parent; and
 * the instance's own members, which carry no token: children, a forker's
 * brood, a launcher's fork before exec.
 */
import { spawn as cpSpawn, type ChildProcess, execFileSync } from 'node:child_process';
import { chmodSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { packageRoot } from '../src/backend/addon.js';
import { backend } from '../src/backend/index.js';
import { inspect, Supervisor, sweep } from '../src/index.js';
import { judge, protectedPid, indexByToken } from '../src/process/ownership.js';
import { expectNoLeaks, processesWithMarker } from './helpers/leaks.js';
import {
  asNamespaceInit,
  hasUnshare,
  isGone,
  killAndWait,
  killOwn,
  MARKER,
  procStat,
  SIGNAL_LOGGER,
  waitFor,
} from './helpers/procs.js';
import { FIXTURES, GATED_PERL_LAUNCH, openSupervisor, PERL, PYTHON } from './helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });

const SOAK = process.env.CUSTODY_SOAK === '1';
const isRoot = process.getuid?.() === 0;
let ctx: Awaited<ReturnType<typeof openSupervisor>> | undefined;
const strangers: ChildProcess[] = [];
afterEach(async () => {
  await Promise.all(strangers.splice(0).map(killAndWait));
  await ctx?.dispose();
  ctx = undefined;
});

/** A process that logs every signal it gets to `log` and carries `token` in its argv; run as `uid` when given. */
function decoy(log: string, token: string, uid?: number): ChildProcess {
  const argv = [PYTHON, '-c', SIGNAL_LOGGER, log, '0', `vm-${token}`, MARKER];
  const child =
    uid === undefined
      ? cpSpawn(argv[0]!, argv.slice(1), { stdio: ['ignore', 'pipe', 'ignore'] })
      : cpSpawn('setpriv', [`--reuid=${uid}`, `--regid=${uid}`, '--clear-groups', ...argv], {
          stdio: ['ignore', 'pipe', 'ignore'],
        });
  strangers.push(child);
  return child;
}
/** A state dir whose supervisor has closed (ctx, for another agent to use), and a dir beside it. */
async function stateOfAgentGone(): Promise<{ stateDir: string; dir: string }> {
  ctx = await openSupervisor();
  await ctx.supervisor.close();
  const dir = join(ctx.root, 'crash');
  mkdirSync(dir);
  return { stateDir: ctx.stateDir, dir };
}

/**
 * An agent in another process that opens the state dir and launches `spec`
 * (source text; `writeFileSync` is in scope), to be SIGKILLed mid-launch.
 */
function launchHolder(stateDir: string, spec: string): ChildProcess {
  const script = `
    const { Supervisor } = await import(${JSON.stringify(join(packageRoot, 'dist', 'index.js'))});
    const { writeFileSync } = await import('node:fs');
    const { supervisor } = await Supervisor.open({ stateDir: ${JSON.stringify(stateDir)}, onEvent: () => {} });
    await supervisor.launch(${spec});`;
  const holder = cpSpawn(process.execPath, ['--input-type=module', '-e', script], { stdio: 'ignore' });
  strangers.push(holder);
  return holder;
}

/** The agent dies as a crash would: SIGKILL, and nothing of it runs after. */
async function crash(holder: ChildProcess): Promise<void> {
  holder.kill('SIGKILL');
  await waitFor(() => holder.exitCode !== null || holder.signalCode !== null, 5000, 'the holder to die');
}

const ready = (c: ChildProcess) => new Promise<void>((r) => c.stdout!.once('data', () => r()));
const logged = (log: string) => {
  try {
    return readFileSync(log, 'utf8').split('\n').filter(Boolean);
  } catch {
    return [];
  }
};

describe(`ownership rule (${backend.name})`, () => {
  it('indexes a process table by token in one pass; never takes pid 1, us or an ancestor', () => {
    const t1 = 'a'.repeat(32);
    const t2 = '0123456789abcdef0123456789abcdef';
    const rows = [
      { pid: 10, argv: ['x', `--sock=/run/vm-${t1}.sock`] },
      { pid: 11, argv: ['y', `${t2}ff`] },
      { pid: 12, argv: ['z', 'short'] },
    ];
    const idx = indexByToken(rows, new Set([t1, t2, 'f'.repeat(32)]));
    expect(idx.get(t1)!.map((r) => r.pid)).toEqual([10]);
    expect(idx.get(t2)!.map((r) => r.pid)).toEqual([11]);
    expect(idx.has('f'.repeat(32))).toBe(false);
    expect(protectedPid(1)).toBe('init');
    expect(protectedPid(process.pid)).toBe('self');
    expect(protectedPid(process.ppid)).toBe('ancestor');
    const me = inspect(process.pid);
    const claim = { token: 'x', expect: [], program: { argv: me.argv }, launcherExe: null, uid: null };
    expect(judge(claim, me)).toEqual({ ours: false, why: 'self' });
  });

  it("abandon never signals an operator's tail -f of the token's log, nor another uid's copy", async () => {
    ctx = await openSupervisor();
    const dir = join(ctx.root, 'bystanders');
    mkdirSync(dir);
    chmodSync(dir, 0o777);
    const logs = { same: join(dir, 'same.log'), other: join(dir, 'other.log') };
    const started: Array<Promise<void>> = [];
    let tail: ChildProcess | undefined;
    const err = await ctx.supervisor
      .launch({
        id: 'vm',
        command: PERL,
        args: (t) => {
          writeFileSync(join(dir, `vm-${t}.log`), '');
          tail = cpSpawn('tail', ['-f', join(dir, `vm-${t}.log`), MARKER], { stdio: 'ignore' });
          strangers.push(tail);
          started.push(ready(decoy(logs.same, t)));
          if (isRoot) started.push(ready(decoy(logs.other, t, 65534)));
          // Exits once the bystanders are up, before its socket appears: the launch fails and is abandoned.
          return ['-e', 'sleep 1; exit 3', '--', t, MARKER];
        },
        ready: { socket: join(dir, 'never.sock') },
        readyTimeoutMs: 5000,
      })
      .catch((e: unknown) => e);
    await Promise.all(started);
    expect(err).toMatchObject({ code: 'ERR_CUSTODY_LAUNCH_EXITED' });
    expect(logged(logs.same)).toEqual([]);
    expect(logged(logs.other)).toEqual([]);
    expect(isGone(tail!.pid!)).toBe(false);
    for (const s of strangers) expect(isGone(s.pid!)).toBe(false);
  });

  it("a pid function that returns another uid's token carrier is refused, and the carrier is never signalled", async () => {
    if (!isRoot) return;
    ctx = await openSupervisor();
    const dir = join(ctx.root, 'other');
    mkdirSync(dir);
    chmodSync(dir, 0o777);
    const log = join(dir, 'other.log');
    let carrier: ChildProcess | undefined;
    const err = await ctx.supervisor
      .launch({
        id: 'fn',
        command: PERL,
        args: (t) => {
          carrier = decoy(log, t, 65534);
          return ['-e', 'sleep 5', '--', t, MARKER];
        },
        pid: async () => {
          await ready(carrier!);
          // The python the carrier runs, not setpriv (which exec'd into it).
          return carrier!.pid!;
        },
      })
      .catch((e: unknown) => e);
    expect(err).toMatchObject({ code: 'ERR_CUSTODY_NOT_OURS' });
    expect(logged(log)).toEqual([]);
    expect(isGone(carrier!.pid!)).toBe(false);
  });

  it("a sweep whose argv is the caller's parent's never touches the parent", async () => {
    const parent = inspect(process.ppid);
    const r = await sweep({ argv: parent.argv, uid: parent.uid, dryRun: true });
    expect(r.matched.map((m) => m.pid)).not.toContain(process.ppid);
  });

  it("stop() ends the instance's children, not just its main process", async () => {
    ctx = await openSupervisor();
    const inst = await ctx.supervisor.launch({
      id: 'sh',
      command: '/bin/sh',
      args: (t) => ['-c', `${PERL} -e 'sleep 30' -- ${MARKER}; true`, t],
    });
    const child = await waitFor(() => backend.children(inst.pid)[0], 5000, 'the child');
    await ctx.supervisor.stop('sh', { graceMs: 2000 });
    await waitFor(() => isGone(child), 5000, 'the child to be ended');
    expect(processesWithMarker(MARKER)).toEqual([]);
  });

  it.each([
    ['left a zombie', 'exit'],
    ['still running', 'stay'],
  ])(
    "stop() ends a helper that forked, setsid'd and forked again, its session's leader %s; never a stranger's session",
    async (_, leaderThen) => {
      ctx = await openSupervisor();
      // A stranger of ours in a session of its own, started first: its pid and session are not the helper's.
      const stranger = cpSpawn(PERL, ['-e', 'sleep 30', '--', MARKER], { stdio: 'ignore', detached: true });
      strangers.push(stranger);
      // The leader exits (a zombie its parent, the main, never reaps) or stays.
      const inst = await ctx.supervisor.launch({
        id: 'm',
        command: PYTHON,
        args: (t) => [join(FIXTURES, 'setsid-helper.py'), leaderThen, PERL, t, MARKER],
      });
      const helper = await waitFor(
        () => processesWithMarker(inst.token).find((p) => p.cmd.endsWith(' helper') && p.state !== 'Z'),
        5000,
        'the helper',
      );
      try {
        const leader = Number(procStat(helper.pid)?.[3]);
        expect(leader).not.toBe(Number(procStat(inst.pid)?.[3]));
        expect(procStat(leader)?.[1]).toBe(String(inst.pid));
        await ctx.supervisor.stop('m', { graceMs: 2000 });
        await waitFor(() => isGone(helper.pid) && isGone(inst.pid), 5000, 'the helper to be ended with the main');
        expect(
          processesWithMarker(MARKER)
            .filter((p) => p.state !== 'Z')
            .map((p) => p.pid),
        ).toEqual([stranger.pid]);
      } finally {
        // Only on failure is it still there: ended by pid, so no later test finds it.
        killOwn(helper.pid, { mark: inst.token });
      }
    },
  );

  it.runIf(backend.name === 'native')(
    "a stop keeps its session's id taken to its end: the main's zombie is reaped only once its members are gone",
    async () => {
      ctx = await openSupervisor();
      // The main leads custody's session; its child leaves it (setsid) and outlives the main's SIGTERM by 400 ms,
      // so the stop goes on with no member in the session: a stranger given the main's pid could lead one of that id.
      const main = `
import os, signal, sys, time
if os.fork() == 0:
    os.setsid()
    got = []
    signal.signal(signal.SIGTERM, lambda s, f: got.append(time.time()))
    for _ in range(3000):
        if got and time.time() - got[0] > 0.4:
            os._exit(0)
        time.sleep(0.01)
    os._exit(0)
time.sleep(30)
`;
      const inst = await ctx.supervisor.launch({ id: 'm', command: PYTHON, args: (t) => ['-c', main, t, MARKER] });
      const child = await waitFor(() => backend.children(inst.pid)[0], 5000, 'the child');
      await waitFor(() => procStat(child)?.[3] === String(child), 5000, 'the child to leave the session');
      let stopped = false;
      const stopping = ctx.supervisor.stop('m', { graceMs: 2000 }).finally(() => (stopped = true));
      await waitFor(() => isGone(child) || procStat(inst.pid)?.[0] === 'Z', 5000, 'the main to die');
      // While the session's last member lives, the main's pid (its session's id) stays taken by its zombie.
      // Each sample reads the main first: a child alive after that read was alive during it. After the child,
      // the stop reaps the main and still removes the state (fsyncs), so samples then are not judged.
      const seen: string[] = [];
      while (!stopped) {
        const main = procStat(inst.pid)?.[0] ?? 'gone';
        if (!isGone(child)) seen.push(main);
        await new Promise((r) => setTimeout(r, 5));
      }
      expect(seen.length).toBeGreaterThan(10);
      expect(new Set(seen)).toEqual(new Set(['Z']));
      expect(await stopping).toMatchObject({ outcome: 'exited', signal: 'SIGTERM' });
      expect(isGone(inst.pid) && isGone(child)).toBe(true);
    },
  );

  it('a tree stop of a TERM-ignoring process that forks every 10 ms leaves no survivor', async () => {
    ctx = await openSupervisor();
    const trials = SOAK ? 50 : 5;
    const forker = `$SIG{TERM} = 'IGNORE'; my $end = time + 5; while (time < $end) { if (!fork) { sleep 5; exit } select(undef, undef, undef, 0.01) }`;
    for (let i = 0; i < trials; i++) {
      const inst = await ctx.supervisor.launch({
        id: `f${i}`,
        command: PERL,
        args: (t) => ['-e', forker, '--', t, MARKER],
      });
      await waitFor(() => backend.children(inst.pid).length >= 5, 5000, 'a brood');
      const r = await ctx.supervisor.stop(`f${i}`, { graceMs: 100 });
      expect(r.escalated).toBe(true);
      const survivors = processesWithMarker(MARKER).filter((p) => p.state !== 'Z');
      expect(survivors).toEqual([]);
    }
  }, 60_000);

  it('recovery of an interrupted launch never adopts a tail -f of its token, nor the launcher before it execs', async () => {
    const { stateDir, dir } = await stateOfAgentGone();
    // A supervisor in another process, SIGKILLed while its launcher is still
    // the shell that will exec into perl; a tail -f of the token's log beside it.
    const holder = launchHolder(
      stateDir,
      `{ id: 'vm', command: '/bin/sh', executable: ${JSON.stringify(PERL)},
        args: (t) => { writeFileSync(${JSON.stringify(join(dir, 'token'))}, t); return ['-c', ${JSON.stringify(GATED_PERL_LAUNCH)}, ${JSON.stringify(PERL)}, t, ${JSON.stringify(MARKER)}, ${JSON.stringify(join(dir, 'go'))}]; },
        confirmTimeoutMs: 10000 }`,
    );
    const token = await waitFor(
      () => {
        try {
          return readFileSync(join(dir, 'token'), 'utf8') || null;
        } catch {
          return null;
        }
      },
      10_000,
      'the launch to start',
    );
    writeFileSync(join(dir, `vm-${token}.log`), '');
    const tail = cpSpawn('tail', ['-f', join(dir, `vm-${token}.log`), MARKER], { stdio: 'ignore' });
    strangers.push(tail);
    await waitFor(() => processesWithMarker(token).some((p) => p.cmd.startsWith('/bin/sh')), 5000, 'the launcher');
    await crash(holder);
    writeFileSync(join(dir, 'go'), '');
    const { supervisor, report } = await Supervisor.open({ stateDir: stateDir, onEvent: () => {} });
    try {
      expect(report.adopted).toEqual([expect.objectContaining({ id: 'vm', reason: 'starting' })]);
      const adopted = report.adopted[0]!.pid!;
      expect(inspect(adopted).argv).toEqual([PERL, '-e', 'sleep 30', '--', token, MARKER]);
      expect(adopted).not.toBe(tail.pid);
      await supervisor.stop('vm', { graceMs: 2000 });
      expect(isGone(tail.pid!)).toBe(false);
    } finally {
      await supervisor.close();
    }
  }, 30_000);

  it.runIf(isRoot && hasUnshare())(
    'recovery of an interrupted launch never adopts or signals an exact copy of its target in another pid namespace',
    async () => {
      const { stateDir, dir } = await stateOfAgentGone();
      // A supervisor in another process, SIGKILLed while its launch waits for
      // readiness (a starting manifest); its target is then ended too.
      const holder = launchHolder(
        stateDir,
        `{ id: 'vm', command: ${JSON.stringify(PERL)},
          args: (t) => ['-e', 'sleep 30', '--', t, ${JSON.stringify(MARKER)}],
          ready: (inst) => { writeFileSync(${JSON.stringify(join(dir, 'launched'))}, JSON.stringify({ pid: inst.pid, token: inst.token })); return new Promise(() => {}); },
          readyTimeoutMs: 60000 }`,
      );
      const launched = await waitFor(
        () => {
          try {
            return JSON.parse(readFileSync(join(dir, 'launched'), 'utf8')) as { pid: number; token: string };
          } catch {
            return null;
          }
        },
        10_000,
        'the launch to reach readiness',
      );
      await crash(holder);
      process.kill(launched.pid, 'SIGKILL');
      await waitFor(() => isGone(launched.pid), 5000, 'the target to die');
      // Root, the same program, the very argv, token included: only the namespace differs.
      const copy = cpSpawn(
        'unshare',
        ['--pid', '--fork', '--kill-child', PERL, '-e', 'sleep 30', '--', launched.token, MARKER],
        { stdio: 'ignore' },
      );
      strangers.push(copy);
      const inner = await waitFor(
        () => {
          try {
            return Number(readFileSync(`/proc/${copy.pid}/task/${copy.pid}/children`, 'utf8').trim()) || null;
          } catch {
            return null;
          }
        },
        5000,
        'the copy in its namespace',
      );
      await waitFor(() => inspect(inner).argv.includes(launched.token), 5000, 'the copy to exec');
      const live = inspect(inner);
      expect(live.pidNs).toBe(inspect(process.pid).pidNs);
      expect(live.processPidNs).not.toBe(inspect(process.pid).processPidNs);
      expect(live.processPidNs).not.toBeNull();
      const { supervisor, report } = await Supervisor.open({ stateDir: stateDir, onEvent: () => {} });
      try {
        expect(report.adopted).toEqual([]);
        expect(report.cleaned).toEqual([expect.objectContaining({ id: 'vm', reason: 'gone' })]);
        expect(isGone(inner)).toBe(false);
        expect(inspect(inner).startTicks).toBe(live.startTicks);
      } finally {
        await supervisor.close();
      }
    },
    30_000,
  );

  it.runIf(isRoot && hasUnshare())(
    'a session the target has left counts for nothing: a stranger that later leads one of its number is never signalled',
    async () => {
      const dir = mkdtempSync(join(tmpdir(), 'custody-session-'));
      try {
        const stdout = execFileSync(
          'unshare',
          asNamespaceInit(join(FIXTURES, 'session-reuse.mjs'), join(dir, 'run'), PYTHON),
          { env: { ...process.env, CUSTODY_BACKEND: backend.name }, timeout: 60_000, encoding: 'utf8' },
        );
        const r = JSON.parse(stdout.trim().split('\n').pop()!);
        expect(r.errors).toEqual([]);
        // The staging held: confirmed in the launcher's session, which it then left, whose number a stranger took.
        expect(r).toMatchObject({ confirmedInIt: true, daemonLeft: true, strangerPlaced: true });
        expect(r.strangerLog).toEqual([`sid ${r.recordedSession}`]);
        expect(r).toMatchObject({ stop: 'exited', daemonGone: true, strangerAlive: true });
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
    90_000,
  );

  it.runIf(backend.name === 'native')(
    'subreaper is reference-counted across supervisors and off again after the last close',
    async () => {
      // Through the backend's own addon: loading another copy (a sanitizer run's) would open its own fds.
      const addon = { getChildSubreaper: () => backend.childSubreaper() };
      expect(addon.getChildSubreaper()).toBe(false);
      const a = await openSupervisor({ subreaper: true });
      const b = await openSupervisor({ subreaper: true });
      expect(addon.getChildSubreaper()).toBe(true);
      await a.dispose();
      expect(addon.getChildSubreaper()).toBe(true);
      await b.dispose();
      expect(addon.getChildSubreaper()).toBe(false);
      expect(procStat(process.pid)).not.toBeNull();
      execFileSync('true');
    },
  );
});
