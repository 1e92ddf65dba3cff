import { type ChildProcess, spawn as cpSpawn, execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { inspect, Supervisor, type CustodyEvent } from '../../src/index.js';
import { STARTING_CONFIRM_MS } from '../../src/recovery/decide.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { signalsBeforeProbes } from '../helpers/quiet.js';
import { endOwn, hasUnshare, isGone, isRoot, loggedSignals, MARKER, tmpDir, waitFor } from '../helpers/procs.js';
import { PERL, PYTHON, recoverInNamespace, vmArgs } from '../helpers/supervisor.js';

const cleanups = cleanupAfterEach({ marker: MARKER });

/** A state dir with one supervisor that launched `count` fake VMs and then closed (as an agent that restarts). */
async function launchedThenClosed(ids: string[], extraArgs: string[] = []) {
  const dir = tmpDir('custody-recover-');
  const stateDir = join(dir.path, 'state');
  const log = join(dir.path, 'signals.log');
  const { supervisor } = await Supervisor.open({ stateDir, onEvent: () => {} });
  const pids: Record<string, number> & { [k: string]: number } = {} as never;
  for (const id of ids) {
    const socket = join(dir.path, `${id}.sock`);
    const inst = await supervisor.launch({
      id,
      command: PYTHON,
      args: (t) => vmArgs(socket, t, ['--signal-log', log, ...extraArgs]),
      ready: { socket },
      paths: [socket],
    });
    pids[id] = inst.pid;
  }
  await supervisor.close();
  cleanups.push(async () => {
    await endOwn(Object.values(pids));
    dir.cleanup();
  });
  const manifestPath = (id: string) => join(stateDir, id, 'manifest.json');
  return {
    stateDir,
    root: dir.path,
    log,
    pids,
    manifestPath,
    read: (id: string) => JSON.parse(readFileSync(manifestPath(id), 'utf8')),
    write: (id: string, m: unknown) => writeFileSync(manifestPath(id), JSON.stringify(m)),
    async reopen(extra: object = {}) {
      const events: CustodyEvent[] = [];
      const r = await Supervisor.open({ stateDir, onEvent: (e) => events.push(e), ...extra });
      cleanups.push(() => r.supervisor.close());
      return { ...r, events };
    },
  };
}

describe(`recovery (${backend.name})`, () => {
  it('adopts a verified process, watches it, and stops it like any instance', async () => {
    const s = await launchedThenClosed(['a']);
    const { supervisor, report, events } = await s.reopen();
    expect(report).toEqual({
      adopted: [{ id: 'a', pid: s.pids.a! }],
      repaired: [],
      cleaned: [],
      quarantined: [],
      deferred: [],
    });
    expect(events.map((e) => e.type)).toEqual(['adopt']);
    expect(supervisor.list()).toEqual([{ id: 'a', status: 'running', pid: s.pids.a!, ppid: expect.any(Number) }]);
    const r = await supervisor.stop('a', { graceMs: 5000 });
    expect(r).toMatchObject({ outcome: 'exited', escalated: false });
    expect(loggedSignals(s.log)).toEqual(['SIGTERM']);
    expect(existsSync(join(s.stateDir, 'a'))).toBe(false);
  });

  it('notices an adopted process exiting, without polling on native, with its status where the kernel gives it', async () => {
    const s = await launchedThenClosed(['a']);
    const { supervisor } = await s.reopen();
    const inst = supervisor.get('a')!;
    process.kill(s.pids.a!, 'SIGKILL');
    const st = await inst.exited;
    if (backend.capabilities().exitInfoOfNonChildren) expect(st).toEqual({ code: null, signal: 'SIGKILL' });
    else expect(st).toEqual({ code: null, signal: null });
    await waitFor(() => supervisor.list()[0]?.status === 'exited', 5000, 'exited status');
    expect(existsSync(join(s.stateDir, 'a'))).toBe(false);
  });

  it('cleans a manifest whose process is gone, and removes its paths', async () => {
    const s = await launchedThenClosed(['a']);
    const socket = join(s.root, 'a.sock');
    process.kill(s.pids.a!, 'SIGKILL');
    await waitFor(() => isGone(s.pids.a!), 5000, 'death');
    expect(existsSync(socket)).toBe(true); // the stale socket a killed VM leaves
    const { report } = await s.reopen();
    expect(report.cleaned).toEqual([{ id: 'a', pid: s.pids.a!, reason: 'gone' }]);
    expect(existsSync(join(s.stateDir, 'a'))).toBe(false);
    expect(existsSync(socket)).toBe(false);
  });

  it('cleans without signalling when the boot id differs (a reboot, not a reuse)', async () => {
    const s = await launchedThenClosed(['a']);
    const m = s.read('a');
    s.write('a', { ...m, identity: { ...m.identity, bootId: '11111111-2222-3333-4444-555555555555' } });
    const { report, supervisor } = await s.reopen();
    expect(report.cleaned).toEqual([{ id: 'a', pid: s.pids.a!, reason: 'rebooted' }]);
    expect(supervisor.list()).toEqual([]);
    expect(await signalsBeforeProbes(s.pids.a!, s.log)).toEqual([]);
    expect(isGone(s.pids.a!)).toBe(false);
  });

  it('quarantines an identity without bootId or startTicks, naming the field, and never signals it', async () => {
    const s = await launchedThenClosed(['a', 'b']);
    const a = s.read('a');
    delete a.identity.bootId;
    s.write('a', a);
    const b = s.read('b');
    delete b.identity.startTicks;
    s.write('b', b);
    const { report, supervisor } = await s.reopen();
    expect(report.quarantined).toEqual([
      { id: 'a', pid: s.pids.a!, reason: 'unrecorded', field: 'bootId' },
      { id: 'b', pid: s.pids.b!, reason: 'unrecorded', field: 'startTicks' },
    ]);
    await expect(supervisor.stop('a')).rejects.toMatchObject({ code: 'ERR_CUSTODY_QUARANTINED' });
    await expect(supervisor.remove('b')).rejects.toMatchObject({ code: 'ERR_CUSTODY_QUARANTINED' });
    await expect(supervisor.launch({ id: 'a', command: 'true', args: (t) => [t] })).rejects.toMatchObject({
      code: 'ERR_CUSTODY_QUARANTINED',
    });
    expect(loggedSignals(s.log)).toEqual([]);
    // Persisted: the quarantine survives another restart.
    expect(s.read('a')).toMatchObject({ state: 'quarantined', quarantine: { reason: 'unrecorded', field: 'bootId' } });
  });

  it('quarantines a reused pid (start ticks or pidfs id differ) and never signals or repairs it', async () => {
    const s = await launchedThenClosed(['ticks', 'pidfs']);
    const t = s.read('ticks');
    s.write('ticks', { ...t, identity: { ...t.identity, startTicks: t.identity.startTicks - 1 } });
    const p = s.read('pidfs');
    const pidfsCase = p.identity.pidfsId !== null;
    if (pidfsCase)
      s.write('pidfs', { ...p, identity: { ...p.identity, pidfsId: String(BigInt(p.identity.pidfsId) + 7n) } });
    const { report } = await s.reopen();
    expect(report.quarantined).toContainEqual({
      id: 'ticks',
      pid: s.pids.ticks!,
      reason: 'reused',
      field: 'startTicks',
    });
    if (pidfsCase)
      expect(report.quarantined).toContainEqual({
        id: 'pidfs',
        pid: s.pids.pidfs!,
        reason: 'reused',
        field: 'pidfsId',
      });
    expect(report.repaired).toEqual([]);
    expect(loggedSignals(s.log)).toEqual([]);
  });

  it('repairs an argv or exe mismatch it can re-prove by token and paths, and quarantines one it cannot', async () => {
    const s = await launchedThenClosed(['fixable', 'unprovable']);
    const f = s.read('fixable');
    s.write('fixable', { ...f, identity: { ...f.identity, argv: ['qemu-old-argv'], exe: { dev: 1, ino: 2 } } });
    const u = s.read('unprovable');
    // Recorded without a pidfs id (a kernel before 6.9): start ticks alone cannot prove a title it changed.
    s.write('unprovable', {
      ...u,
      paths: [...u.paths, '/run/not-in-its-argv.sock'],
      identity: { ...u.identity, argv: ['other'], pidfsId: null },
    });
    const { report, events, supervisor } = await s.reopen();
    expect(report.repaired).toEqual([{ id: 'fixable', pid: s.pids.fixable!, reason: 'mismatch', field: 'exe' }]);
    expect(report.quarantined).toEqual([
      { id: 'unprovable', pid: s.pids.unprovable!, reason: 'mismatch', field: 'argv' },
    ]);
    expect(events.find((e) => e.type === 'repair')).toMatchObject({ id: 'fixable', field: 'exe' });
    const repaired = s.read('fixable');
    expect(repaired.identity.argv).toContain(repaired.token);
    expect(repaired.identity.startTicks).toBe(f.identity.startTicks);
    // A quarantined instance does not hide or change the others' status.
    expect(supervisor.list()).toEqual([
      { id: 'fixable', status: 'running', pid: s.pids.fixable!, ppid: expect.any(Number) },
      {
        id: 'unprovable',
        status: 'quarantined',
        pid: s.pids.unprovable!,
        ppid: null,
        reason: 'mismatch',
        field: 'argv',
      },
    ]);
    expect(loggedSignals(s.log)).toEqual([]);
    // Nor does a sweep by its exact live argv signal it.
    const swept = await supervisor.sweep({ argv: inspect(s.pids.unprovable!).argv, graceMs: 100 });
    expect(swept.matched).toEqual([]);
    expect(isGone(s.pids.unprovable!)).toBe(false);
    expect(loggedSignals(s.log)).toEqual([]);
  });

  it('quarantines unreadable or unknown-version manifests, keeps the files, and recovers the rest', async () => {
    const s = await launchedThenClosed(['good']);
    mkdirSync(join(s.stateDir, 'garbled'), { mode: 0o700 });
    writeFileSync(join(s.stateDir, 'garbled', 'manifest.json'), '{ not json', { mode: 0o600 });
    mkdirSync(join(s.stateDir, 'future'), { mode: 0o700 });
    writeFileSync(join(s.stateDir, 'future', 'manifest.json'), JSON.stringify({ version: 99, id: 'future' }), {
      mode: 0o600,
    });
    const { report } = await s.reopen();
    expect(report.adopted).toEqual([{ id: 'good', pid: s.pids.good! }]);
    expect(report.quarantined.map((q) => `${q.id}:${q.reason}`).sort()).toEqual([
      'future:bad-manifest',
      'garbled:bad-manifest',
    ]);
    expect(readFileSync(join(s.stateDir, 'garbled', 'manifest.json'), 'utf8')).toBe('{ not json');
    expect(existsSync(join(s.stateDir, 'future', 'manifest.json'))).toBe(true);
  });

  it('quarantines an interrupted pidfile launch whose pidfile is a FIFO, a symlink or no pid, and recovers the rest', async () => {
    const s = await launchedThenClosed(['a']);
    const m = s.read('a');
    const bad: Record<string, (path: string) => void> = {
      fifo: (path) => execFileSync('mkfifo', [path]),
      symlink: (path) => symlinkSync('/etc/passwd', path),
      text: (path) => writeFileSync(path, 'hello\n'),
      pid1: (path) => writeFileSync(path, '1\n'),
    };
    for (const [kind, make] of Object.entries(bad)) {
      const id = `pf-${kind}`;
      const pidFile = join(s.root, `${id}.pid`);
      make(pidFile);
      mkdirSync(join(s.stateDir, id), { mode: 0o700 });
      const token = randomBytes(16).toString('hex');
      s.write(id, {
        ...m,
        id,
        token,
        state: 'starting',
        identity: null,
        pidSource: 'file',
        pidFile,
        args: m.args.map((a: string) => (a === m.token ? token : a)),
      });
    }
    const { report, supervisor } = await s.reopen();
    expect(report.adopted).toEqual([{ id: 'a', pid: s.pids.a! }]);
    expect(report.quarantined.map((q) => [q.id, q.reason, q.field]).sort()).toEqual(
      Object.keys(bad)
        .map((k) => [`pf-${k}`, 'unprovable', 'pidfile'])
        .sort(),
    );
    expect(report.cleaned).toEqual([]);
    // Kept for an operator to look at, not signalled; the next open says the same.
    for (const k of Object.keys(bad)) expect(existsSync(s.manifestPath(`pf-${k}`))).toBe(true);
    await supervisor.close();
    const again = await s.reopen();
    expect(again.report.quarantined).toHaveLength(Object.keys(bad).length);
  });

  it.runIf(isRoot())(
    'interrupted launches whose tokens another uid carries share one confirm bound, and no carrier is signalled',
    async () => {
      const s = await launchedThenClosed(['a']);
      const m = s.read('a');
      const carriers: ChildProcess[] = [];
      cleanups.push(async () => {
        for (const c of carriers) c.kill('SIGKILL');
        await waitFor(() => carriers.every((c) => c.exitCode !== null || c.signalCode !== null), 5000, 'carriers');
      });
      const count = 4;
      for (let i = 0; i < count; i++) {
        const id = `s${i}`;
        const token = randomBytes(16).toString('hex');
        mkdirSync(join(s.stateDir, id), { mode: 0o700 });
        const args = m.args.map((a: string) => (a === m.token ? token : a));
        s.write(id, { ...m, id, token, state: 'starting', identity: null, args });
        // Anyone can read a token in /proc/*/cmdline and run the very argv under their own uid.
        carriers.push(
          cpSpawn(
            'setpriv',
            ['--reuid=65534', '--regid=65534', '--clear-groups', PERL, '-e', 'sleep 30', '--', token, MARKER],
            {
              stdio: 'ignore',
            },
          ),
        );
      }
      await waitFor(() => carriers.every((c) => c.pid && inspect(c.pid).argv[0] === PERL), 5000, 'carriers to exec');
      const t0 = Date.now();
      const { report } = await s.reopen();
      const took = Date.now() - t0;
      expect(report.cleaned.map((c) => c.id).sort()).toEqual(['s0', 's1', 's2', 's3']);
      // One bound in all (a bound each was 4 of them); the margin is for a loaded machine.
      expect(took).toBeLessThan(STARTING_CONFIRM_MS * 2);
      for (const c of carriers) expect(isGone(c.pid!)).toBe(false);
    },
    30_000,
  );

  it('release() clears a quarantine, emits an event, and leaves the process running and unsignalled', async () => {
    const s = await launchedThenClosed(['q']);
    const m = s.read('q');
    s.write('q', { ...m, identity: { ...m.identity, startTicks: m.identity.startTicks + 5 } });
    const { supervisor, events } = await s.reopen();
    expect(supervisor.list()).toMatchObject([{ id: 'q', status: 'quarantined', reason: 'reused' }]);
    await supervisor.release('q');
    expect(events.at(-1)).toMatchObject({ type: 'release', id: 'q' });
    expect(supervisor.list()).toEqual([]);
    expect(existsSync(join(s.stateDir, 'q'))).toBe(false);
    expect(await signalsBeforeProbes(s.pids.q!, s.log)).toEqual([]);
    expect(isGone(s.pids.q!)).toBe(false);
    await expect(supervisor.release('q')).rejects.toMatchObject({ code: 'ERR_CUSTODY_NOT_FOUND' });
  });

  it('never adopts a manifest that points at pid 1, at the supervisor itself, or at a process without its token', async () => {
    const s = await launchedThenClosed(['host']);
    const m = s.read('host');
    const { inspect } = await import('../../src/index.js');
    const init = inspect(1);
    const self = inspect(process.pid);
    for (const [id, identity] of [
      ['init', init],
      ['self', self],
    ] as const) {
      mkdirSync(join(s.stateDir, id), { mode: 0o700 });
      writeFileSync(join(s.stateDir, id, 'manifest.json'), JSON.stringify({ ...m, id, identity }), { mode: 0o600 });
    }
    const { report } = await s.reopen();
    expect(report.adopted).toEqual([{ id: 'host', pid: s.pids.host! }]);
    expect(report.quarantined.map((q) => [q.id, q.reason, q.field]).sort()).toEqual([
      ['init', 'unprovable', 'pid'],
      ['self', 'unprovable', 'pid'],
    ]);
  });

  it('runs once per supervisor, before any launch; a missing state dir arms it; tracked instances are skipped', async () => {
    const dir = tmpDir('custody-guard-');
    cleanups.push(() => dir.cleanup());
    const stateDir = join(dir.path, 'does', 'not', 'exist');
    const { supervisor, report } = await Supervisor.open({ stateDir, onEvent: () => {} });
    cleanups.push(() => supervisor.close());
    expect(report).toEqual({ adopted: [], repaired: [], cleaned: [], quarantined: [], deferred: [] });
    const again = await supervisor.recover();
    expect(again).toEqual({ adopted: [], repaired: [], cleaned: [], quarantined: [], deferred: [] });
  });

  it('a launch of an id a recover() is judging is refused (ERR_CUSTODY_BUSY), and the recovery takes nothing of it', async () => {
    // A manifest put back by hand (a restored backup) for a process that is
    // gone: the recover() called for it cleans it while a launch of the same
    // id is asked for. The launch must not write over the manifest being
    // judged, nor lose its own state to the cleaning.
    const s = await launchedThenClosed(['a']);
    const saved = s.read('a');
    process.kill(s.pids.a!, 'SIGKILL');
    await waitFor(() => isGone(s.pids.a!), 5000, 'death');
    const { supervisor } = await s.reopen();
    expect(existsSync(join(s.stateDir, 'a'))).toBe(false);
    mkdirSync(join(s.stateDir, 'a'));
    s.write('a', saved);
    const launchA = () =>
      supervisor.launch({ id: 'a', command: PERL, args: (t) => ['-e', 'sleep 30', '--', t, MARKER] });
    const [recovered, launched] = await Promise.allSettled([supervisor.recover(), launchA()]);
    expect(recovered).toMatchObject({ status: 'fulfilled', value: { cleaned: [{ id: 'a', reason: 'gone' }] } });
    expect(launched).toMatchObject({ status: 'rejected', reason: { code: 'ERR_CUSTODY_BUSY' } });
    // Once it is done, the id is free, and a launch of it keeps its state.
    const inst = await launchA();
    cleanups.push(() => endOwn([inst.pid]));
    expect(s.read('a')).toMatchObject({ state: 'running', identity: { pid: inst.pid } });
    await supervisor.stop('a', { graceMs: 2000 });
    expect(existsSync(join(s.stateDir, 'a'))).toBe(false);
  });

  it('leaves the guard unarmed when the state dir cannot be read, so the next open retries', async () => {
    const dir = tmpDir('custody-guard-');
    cleanups.push(() => dir.cleanup());
    const stateDir = join(dir.path, 'state');
    writeFileSync(stateDir, 'a file, not a dir');
    await expect(Supervisor.open({ stateDir })).rejects.toMatchObject({
      code: expect.stringMatching(/ERR_CUSTODY_(STATE_IO|INVALID_ARG)/),
    });
    rmSync(stateDir);
    const { supervisor } = await Supervisor.open({ stateDir, onEvent: () => {} });
    await supervisor.close();
  });
});

describe(`recovery in a PID namespace (${backend.name})`, () => {
  const canNs = isRoot() && hasUnshare();
  const NS_NOTE = 'needs root and unshare --pid --mount-proc: runs inside a PID namespace';
  const run = async (mode: string, trials: number) => {
    const dir = tmpDir('custody-ns-');
    cleanups.push(() => dir.cleanup());
    return recoverInNamespace(mode, dir.path, trials, { timeoutMs: 120_000 });
  };

  it('a supervisor SIGKILLed between spawn and confirm, then reopened: no orphan, no zombie, no stale manifest', async (ctx) => {
    ctx.skip(!canNs, NS_NOTE);
    const r = await run('crash', 4);
    expect(r.errors).toEqual([]);
    expect(r.trials).toBe(4);
    expect(r.orphans).toEqual([]);
    expect(r.zombies).toBe(0);
    expect(r.staleManifests).toEqual([]);
    // Each interrupted launch ended decisively: adopted once its target exec'd, or cleaned.
    for (const rep of r.reports) expect(rep.adopted + rep.cleaned).toBe(1);
  });

  it('genuine PID reuse: the new owner is never signalled and the instance is quarantined, even within one clock tick', async (ctx) => {
    ctx.skip(!canNs, NS_NOTE);
    const r = await run('reuse', 10);
    expect(r.errors).toEqual([]);
    expect(r.trials).toBe(10);
    expect(r.signals).toEqual([]);
    for (const key of Object.keys(r.verdicts)) {
      if (backend.name === 'native') expect(key).toMatch(/^quarantined:reused:(pidfsId|startTicks)/);
      else expect(key).toMatch(/^quarantined:(reused:startTicks|mismatch:(exe|argv))/);
    }
    if (backend.name === 'native' && r.sameTick > 0)
      expect(r.verdicts['quarantined:reused:pidfsId (same tick)']).toBe(r.sameTick);
    console.log(
      `${backend.name}: recovery after ${r.trials} forced reuses (${r.sameTick} in the same tick): ${JSON.stringify(r.verdicts)}`,
    );
  });
});
