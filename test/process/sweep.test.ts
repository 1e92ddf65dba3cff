import { execFile, spawn as cpSpawn, type ChildProcess } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { afterEach, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { descendants, spawn, sweep, terminateTree, type CustodyEvent } from '../../src/index.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import {
  exited,
  isGone,
  isRoot,
  killAndWait,
  loggedSignals,
  MARKER,
  SIGNAL_LOGGER,
  tmpDir,
  untilReady,
  waitFor,
} from '../helpers/procs.js';
import { openSupervisor, PERL, PYTHON } from '../helpers/supervisor.js';

const cleanups = cleanupAfterEach({ marker: MARKER });

const children: ChildProcess[] = [];
afterEach(async () => {
  for (const c of children.splice(0)) await killAndWait(c);
});

/** A signal-logging orphan-to-be with argv [PYTHON, -c, LOGGER, log, ignoreTerm, ...tail]. */
async function logger(log: string, tail: string[], opts: { ignoreTerm?: boolean; uid?: number } = {}) {
  const c = cpSpawn(PYTHON, ['-c', SIGNAL_LOGGER, log, opts.ignoreTerm ? '1' : '0', ...tail], {
    stdio: ['ignore', 'pipe', 'ignore'],
    ...(opts.uid !== undefined ? { uid: opts.uid, gid: opts.uid } : {}),
  });
  children.push(c);
  await untilReady(c.stdout!);
  return c;
}
const argvOf = (log: string, tail: string[], ignoreTerm = false) => [
  PYTHON,
  '-c',
  SIGNAL_LOGGER,
  log,
  ignoreTerm ? '1' : '0',
  ...tail,
];

describe(`sweep (${backend.name})`, () => {
  it('ends exact matches only: near-miss argv stays alive and unsignalled', async () => {
    const dir = tmpDir();
    cleanups.push(() => dir.cleanup());
    const exactLog = join(dir.path, 'exact.log');
    const nearLog = join(dir.path, 'near.log');
    const exact = [await logger(exactLog, ['avr-ubuntu', MARKER]), await logger(exactLog, ['avr-ubuntu', MARKER])];
    const near = [
      await logger(nearLog, ['avr-ubuntu-2', MARKER]),
      await logger(nearLog, ['avr-ubuntu-24.04', MARKER]),
      await logger(nearLog, ['avr-ubuntu', MARKER, 'extra']),
      await logger(nearLog, ['avr-ubuntu']),
    ];
    const r = await sweep({ argv: argvOf(exactLog, ['avr-ubuntu', MARKER]), executable: PYTHON });
    expect(r.matched.map((i) => i.pid).sort()).toEqual(exact.map((c) => c.pid).sort());
    expect(r.terminated.map((i) => i.pid).sort()).toEqual(exact.map((c) => c.pid).sort());
    expect(r.killed).toEqual([]);
    expect(r.survivors).toEqual([]);
    for (const c of exact) await exited(c);
    expect(loggedSignals(exactLog)).toEqual(['SIGTERM', 'SIGTERM']);
    for (const c of near) expect(isGone(c.pid!)).toBe(false);
    expect(loggedSignals(nearLog)).toEqual([]);
  });

  it('matches an executable given as a basename against argv[0], and refuses bad patterns', async () => {
    const dir = tmpDir();
    cleanups.push(() => dir.cleanup());
    const log = join(dir.path, 'log');
    await logger(log, ['basename', MARKER]);
    const argv = argvOf(log, ['basename', MARKER]);
    expect((await sweep({ argv, executable: 'not-python', dryRun: true })).matched).toEqual([]);
    expect((await sweep({ argv, executable: PYTHON.split('/').pop()!, dryRun: true })).matched).toHaveLength(1);
    expect(loggedSignals(log)).toEqual([]);
    for (const bad of [
      {},
      { argv: [] },
      { argv: [''] },
      { argv: ['a\0b'] },
      { argv: ['x'], uid: -1 },
      { argv: ['x'], graceMs: -1 },
    ]) {
      await expect(sweep(bad as never)).rejects.toMatchObject({ code: 'ERR_CUSTODY_INVALID_ARG' });
    }
  });

  it('KILLs a TERM-ignoring orphan within the bound', async () => {
    const dir = tmpDir();
    cleanups.push(() => dir.cleanup());
    const log = join(dir.path, 'log');
    const c = await logger(log, ['stubborn', MARKER], { ignoreTerm: true });
    const started = Date.now();
    // A grace python can log the ignored SIGTERM within on a loaded machine; the bound checked is the deadline's.
    const r = await sweep({ argv: argvOf(log, ['stubborn', MARKER], true), graceMs: 1000, deadlineMs: 4000 });
    expect(Date.now() - started).toBeLessThan(6000);
    expect(r.killed.map((i) => i.pid)).toEqual([c.pid]);
    expect(r.terminated).toEqual([]);
    await exited(c);
    expect(c.signalCode).toBe('SIGKILL');
    expect(loggedSignals(log)).toEqual(['SIGTERM']);
  });

  it('counts a match that exits between the scan and the signal as success', async () => {
    const dir = tmpDir();
    cleanups.push(() => dir.cleanup());
    const log = join(dir.path, 'log');
    const c = await logger(log, ['racer', MARKER]);
    const r = await sweep({
      argv: argvOf(log, ['racer', MARKER]),
      beforeSignal: async () => {
        c.kill('SIGKILL');
        await exited(c);
      },
    });
    expect(r.matched.map((i) => i.pid)).toEqual([c.pid]);
    expect(r.terminated.map((i) => i.pid)).toEqual([c.pid]);
    expect(r.survivors).toEqual([]);
    expect(loggedSignals(log)).toEqual([]);
  });

  it("never touches another uid's process with the same argv", async (ctx) => {
    ctx.skip(!isRoot(), 'needs root: starts a process as another uid (65534)');
    const dir = tmpDir();
    cleanups.push(() => dir.cleanup());
    const { chmodSync } = await import('node:fs');
    chmodSync(dir.path, 0o777);
    const log = join(dir.path, 'log');
    // perl, not the test's python (it may live under root's home, out of nobody's reach).
    const script =
      '$SIG{$_} = sub { open my $f, ">>", $ARGV[0]; print $f "SIG$_[0]\\n"; close $f } for qw(TERM INT HUP USR1 USR2); print "ready\\n"; $| = 1; sleep 1 while 1';
    const argv = [PERL, '-e', script, log, 'other-uid', MARKER];
    const other = cpSpawn(PERL, argv.slice(1), {
      stdio: ['ignore', 'pipe', 'ignore'],
      uid: 65534,
      gid: 65534,
      argv0: PERL,
    });
    children.push(other);
    await untilReady(other.stdout!);
    const r = await sweep({ argv });
    expect(r.matched).toEqual([]);
    expect((await sweep({ argv, uid: 65534, dryRun: true })).matched.map((i) => i.pid)).toEqual([other.pid]);
    expect(isGone(other.pid!)).toBe(false);
    expect(loggedSignals(log)).toEqual([]);
  });

  it('never sweeps an instance the supervisor tracks, and a periodic sweep heals an idle agent', async () => {
    const dir = tmpDir();
    cleanups.push(() => dir.cleanup());
    const events: CustodyEvent[] = [];
    const pattern = [PERL, '-e', 'sleep 300', 'leaked-helper', MARKER];
    const ctx = await openSupervisor({
      onEvent: (e) => events.push(e),
      sweep: { intervalMs: 100, patterns: [{ argv: pattern }] },
    });
    cleanups.push(() => ctx.dispose());
    // Tracked: launched with exactly that argv plus its token... the token
    // makes it differ, so track one whose argv we then sweep for exactly.
    const inst = await ctx.supervisor.launch({
      id: 'kept',
      command: PERL,
      args: (t) => ['-e', 'sleep 300', t, MARKER],
    });
    const keptArgv = inst.identity.argv;
    const leaked = cpSpawn(PERL, pattern.slice(1), { stdio: 'ignore', argv0: PERL });
    children.push(leaked);
    await waitFor(
      () => events.some((e) => e.type === 'sweep' && (e.terminated as number[]).includes(leaked.pid!)),
      5000,
      'periodic sweep',
    );
    await exited(leaked);
    const r = await ctx.supervisor.sweep({ argv: keptArgv });
    expect(r.matched).toEqual([]);
    expect(isGone(inst.pid)).toBe(false);
  });
});

describe.skipIf(backend.name !== 'native')('the argv-first scan, sharded by pid', () => {
  it('splits the matches between shards exactly: none lost, none twice, the same as one scan', async () => {
    const tag = `${MARKER}-shards-${process.pid}`;
    for (let i = 0; i < 12; i++) children.push(cpSpawn(PERL, ['-e', 'sleep 30', tag], { stdio: 'ignore' }));
    const argv = [PERL, '-e', 'sleep 30', tag];
    const { addon } = backend as import('../../src/backend/native.js').NativeBackend;
    const want = children.map((c) => c.pid).sort((a, b) => (a ?? 0) - (b ?? 0));
    // Until every sleeper has exec'd (bounded: 500 tries, 20 ms apart; twelve perls start slowly on a loaded machine).
    for (let i = 0; i < 500 && (await addon.matchArgv(undefined, argv)).length < 12; i++) {
      await new Promise((r) => setTimeout(r, 20));
    }
    const whole = (await addon.matchArgv(undefined, argv)).sort((a, b) => a - b);
    const parts = await Promise.all([0, 1, 2].map((k) => addon.matchArgv(undefined, argv, k, 3)));
    for (const [k, part] of parts.entries()) expect(part.every((pid) => pid % 3 === k)).toBe(true);
    expect(parts.flat().sort((a, b) => a - b)).toEqual(whole);
    expect(whole).toEqual(want);
    expect((await backend.matchArgv(argv)).sort((a, b) => a - b)).toEqual(want);
  });
});

describe(`process trees (${backend.name})`, () => {
  // perl forks twice: three generations, each with the marker in its argv.
  const TREE = 'if (fork) { sleep 300 } else { if (fork) { sleep 300 } else { sleep 300 } }';

  it('descendants() pins every member; terminateTree() ends a 3-level tree', async () => {
    const h = spawn(PERL, ['-e', TREE, MARKER]);
    await waitFor(() => descendants(h.pid).map((d) => (d.close(), d.pid)).length === 2, 5000, 'tree');
    const members = descendants(h.pid);
    expect(members).toHaveLength(2);
    expect(members[1]!.identity!.ppid).toBe(members[0]!.pid);
    for (const m of members) m.close();
    const r = await terminateTree(h, { graceMs: 2000 });
    expect(r.members).toHaveLength(3);
    expect(r).toMatchObject({ outcome: 'exited', escalated: false });
    for (const pid of r.members) await waitFor(() => isGone(pid), 5000, `pid ${pid}`);
  });

  it('stop({ tree: true }) ends an instance and its children', async () => {
    const ctx = await openSupervisor();
    cleanups.push(() => ctx.dispose());
    const inst = await ctx.supervisor.launch({ id: 'tree', command: PERL, args: (t) => ['-e', TREE, t, MARKER] });
    await waitFor(() => descendants(inst.pid).map((d) => (d.close(), d)).length === 2, 5000, 'tree');
    const pids = [inst.pid, ...descendants(inst.pid).map((d) => (d.close(), d.pid))];
    const r = await ctx.supervisor.stop('tree', { tree: true, graceMs: 2000 });
    expect(r.outcome).toBe('exited');
    for (const pid of pids) await waitFor(() => isGone(pid), 5000, `pid ${pid}`);
  });
});

describe(`custody sweep CLI (${backend.name})`, () => {
  it('--dry-run --json lists without signalling; without it, ends the match', async () => {
    const dir = tmpDir();
    cleanups.push(() => dir.cleanup());
    const log = join(dir.path, 'log');
    const c = await logger(log, ['cli', MARKER]);
    const cli = join(import.meta.dirname, '..', '..', 'dist', 'cli', 'main.js');
    const run = (args: string[]) =>
      promisify(execFile)(process.execPath, [cli, 'sweep', ...args], {
        env: { ...process.env, CUSTODY_BACKEND: backend.name },
      });
    const dry = JSON.parse(
      (await run(['--exact', '--dry-run', '--json', '--', ...argvOf(log, ['cli', MARKER])])).stdout,
    );
    expect(dry.matched.map((i: { pid: number }) => i.pid)).toEqual([c.pid]);
    expect(loggedSignals(log)).toEqual([]);
    const real = await run(['--exact', '--', ...argvOf(log, ['cli', MARKER])]);
    expect(real.stdout).toMatch(new RegExp(`terminated\\s+${c.pid}`));
    await exited(c);
    await expect(run(['--', 'x'])).rejects.toMatchObject({ code: 2 });
  });
});
