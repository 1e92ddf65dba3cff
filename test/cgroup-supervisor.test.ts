/**
 * A supervisor with a cgroup root: each instance in a cgroup of its own from
 * birth, so a double-forked setsid'd escapee is still the instance's and
 * dies with stop(); a TERM-ignoring forker leaves no survivor; freeze, thaw,
 * usage and limits; a bystander carrying the token outside the cgroup is
 * never touched; a pid function's target created elsewhere runs with
 * cgroup null; a target its launcher moved into another cgroup is refused
 * as not ours and left alone. Every test ends with no cgroup left behind.
 */
import { execFileSync, spawn as cpSpawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmdirSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { backend } from '../src/backend/index.js';
import { parseCgroupV2Line } from '../src/backend/procview.js';
import { cgroupName } from '../src/process/cgroup.js';
import { inspect, type SupervisorOptions } from '../src/index.js';
import { CGROUP_ROOT, CGROUP_SKIP, cgroupsBelow, expectNoCgroupsLeft, nodeOf, procsOf } from './helpers/cgroup.js';
import { expectNoLeaks, processesWithMarker } from './helpers/leaks.js';
import { counterWitness } from './helpers/quiet.js';
import {
  isGone,
  killAndWait,
  killOwn,
  loggedSignals,
  MARKER,
  procStat,
  SIGNAL_LOGGER,
  startOf,
  waitFor,
} from './helpers/procs.js';
import { openSupervisor, PERL, PYTHON } from './helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });
expectNoCgroupsLeft();

const SOAK = process.env.CUSTODY_SOAK === '1';
let ctx: Awaited<ReturnType<typeof openSupervisor>> | undefined;
const strangers: ChildProcess[] = [];
afterEach(async () => {
  await Promise.all(strangers.splice(0).map(killAndWait));
  await ctx?.dispose();
  ctx = undefined;
  // The supervisor removed every cgroup it made: its instances' and, on close, its own.
  expect(cgroupsBelow(CGROUP_ROOT)).toEqual([]);
});

const open = async (extra: Partial<SupervisorOptions> = {}) =>
  (ctx = await openSupervisor({ cgroup: { root: CGROUP_ROOT }, ...extra }));
const cgroupOfPid = (pid: number) => parseCgroupV2Line(readFileSync(`/proc/${pid}/cgroup`, 'utf8'));

/** perl: forks a child that calls setsid and forks the escapee (exec'd with "escapee" and the marker in its argv), then sleeps. */
const ESCAPER = `use POSIX (); my $p = fork; if (!$p) { POSIX::setsid(); exec($^X, '-e', 'sleep 60', '--', 'escapee', $ARGV[1]) if !fork; POSIX::_exit(0) } waitpid($p, 0); sleep 60`;
const escapee = () => processesWithMarker(MARKER).find((p) => p.cmd.includes(' escapee ') && p.state !== 'Z');

/** A python process that logs the signals it gets and carries `vm-<token>` in its argv: a bystander naming the token. */
function bystander(log: string, token: string): ChildProcess {
  const child = cpSpawn(PYTHON, ['-c', SIGNAL_LOGGER, log, '0', `vm-${token}`, MARKER], {
    stdio: ['ignore', 'pipe', 'ignore'],
  });
  strangers.push(child);
  return child;
}
const ready = (c: ChildProcess) => new Promise<void>((r) => c.stdout!.once('data', () => r()));

describe(`instance cgroups (${backend.name})`, () => {
  for (const subreaper of backend.name === 'native' ? [false, true] : [false]) {
    it(`a double-forked, setsid'd escapee is in the instance cgroup and dies with stop()${subreaper ? ' (subreaper: reaped)' : ''}`, async (t) => {
      t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
      const { supervisor } = await open({ subreaper });
      const inst = await supervisor.launch({
        id: 'esc',
        command: PERL,
        args: (tok) => ['-e', ESCAPER, '--', tok, MARKER],
      });
      expect(inst.cgroup).toBe(join(inst.cgroup!, '..', cgroupName('esc', inst.token)));
      expect(existsSync(join(inst.cgroup!, 'cgroup.procs'))).toBe(true);
      const e = await waitFor(escapee, 5000, 'the escapee');
      // Escaped by every measure custody's tree uses, but not its cgroup.
      expect(e.ppid).not.toBe(inst.pid);
      expect(procStat(e.pid)![3]).not.toBe(String(inst.identity.session));
      expect(cgroupOfPid(e.pid)).toBe(nodeOf(inst.cgroup!));
      expect(procsOf(inst.cgroup!)).toEqual(expect.arrayContaining([inst.pid, e.pid]));
      expect(supervisor.list()).toEqual([expect.objectContaining({ id: 'esc', cgroup: inst.cgroup })]);
      const r = await supervisor.stop('esc', { graceMs: 2000 });
      expect(r).toMatchObject({ outcome: 'exited', escalated: false, signal: 'SIGTERM' });
      expect(isGone(e.pid)).toBe(true);
      expect(existsSync(inst.cgroup!)).toBe(false);
      expect(existsSync(join(ctx!.stateDir, 'esc'))).toBe(false);
    });
  }

  it('a TERM-ignoring process that forks every 10 ms leaves no survivor', async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const { supervisor, events } = await open();
    const trials = SOAK ? 50 : 5;
    const forker = `$SIG{TERM} = 'IGNORE'; my $end = time + 10; while (time < $end) { if (!fork) { sleep 10; exit } select(undef, undef, undef, 0.01) }`;
    for (let i = 0; i < trials; i++) {
      const inst = await supervisor.launch({
        id: `f${i}`,
        command: PERL,
        args: (tok) => ['-e', forker, '--', tok, MARKER],
      });
      await waitFor(() => procsOf(inst.cgroup!).length >= 5, 5000, 'a brood');
      const r = await supervisor.stop(`f${i}`, { graceMs: 100 });
      expect(r.escalated).toBe(true);
      expect(processesWithMarker(MARKER).filter((p) => p.state !== 'Z')).toEqual([]);
      expect(existsSync(inst.cgroup!)).toBe(false);
    }
    expect(events.filter((e) => e.type === 'escalate')).toHaveLength(trials);
  }, 120_000);

  it('freeze() and thaw() wait for cgroup.events; stop() thaws a frozen instance first, so SIGTERM ends it', async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const { supervisor, events } = await open();
    const file = join(ctx!.root, 'count');
    const prog = `my $n = 0; while (1) { open(my $f, '>', $ARGV[1]); print $f ++$n; close $f; select(undef, undef, undef, 0.01) }`;
    const inst = await supervisor.launch({ id: 'fz', command: PERL, args: (tok) => ['-e', prog, tok, file, MARKER] });
    const count = () => {
      try {
        return Number(readFileSync(file, 'utf8') || '0');
      } catch {
        return 0;
      }
    };
    await waitFor(() => count() > 2, 5000, 'counting');
    await supervisor.freeze('fz');
    expect(readFileSync(join(inst.cgroup!, 'cgroup.events'), 'utf8')).toContain('frozen 1');
    const witness = await counterWitness(join(ctx!.root, 'witness'));
    const at = count();
    try {
      // Ten of the witness's counts outside the cgroup: an unfrozen counter would have counted too.
      await witness.advance(10);
    } finally {
      await witness.stop();
    }
    expect(count()).toBe(at);
    await supervisor.thaw('fz');
    await waitFor(() => count() > at, 5000, 'counting again');
    await supervisor.freeze('fz');
    const r = await supervisor.stop('fz', { graceMs: 5000 });
    expect(r).toMatchObject({ outcome: 'exited', escalated: false, signal: 'SIGTERM' });
    expect(events.map((e) => e.type)).toEqual(expect.arrayContaining(['freeze', 'thaw']));
    await expect(supervisor.freeze('fz')).rejects.toMatchObject({ code: 'ERR_CUSTODY_NOT_FOUND' });
  });

  it('usage() after a busy loop: CPU time from cpu.stat, processes, memory where the controller is on', async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const { supervisor } = await open();
    await supervisor.launch({
      id: 'busy',
      command: PERL,
      args: (tok) => ['-e', '1 while (times)[0] < 0.3; sleep 60', tok, MARKER],
    });
    const u = await waitFor(
      () => {
        const x = supervisor.usage('busy');
        return x.cpuUsec >= 300_000 ? x : null;
      },
      10_000,
      '0.3 s of CPU time',
    );
    expect(u.pids).toBe(1);
    const memory = supervisor.capabilities().cgroup!.enabled.includes('memory');
    if (memory) expect(u.memoryBytes).toBeGreaterThan(0);
    else expect(u.memoryBytes).toBeNull();
    await supervisor.stop('busy', { graceMs: 2000 });
  });

  it('limits are refused where the root offers no controller for them, before anything is made; malformed ones always', async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const { supervisor } = await open();
    const offered = supervisor.capabilities().cgroup!.controllers;
    const spec = (limits: unknown) => ({
      id: 'lim',
      command: PERL,
      args: (tok: string) => ['-e', 'sleep 60', tok, MARKER],
      limits: limits as never,
    });
    await expect(supervisor.launch(spec({ memoryMax: -1 }))).rejects.toMatchObject({ code: 'ERR_CUSTODY_INVALID_ARG' });
    await expect(supervisor.launch(spec({ cpuMax: { quotaUsec: 5000, periodUsec: 10 } }))).rejects.toMatchObject({
      code: 'ERR_CUSTODY_INVALID_ARG',
    });
    await expect(supervisor.launch(spec({ swapMax: 1 }))).rejects.toMatchObject({ code: 'ERR_CUSTODY_INVALID_ARG' });
    for (const [limit, controller] of [
      [{ memoryMax: 64 << 20 }, 'memory'],
      [{ pidsMax: 16 }, 'pids'],
      [{ cpuMax: { quotaUsec: 50_000 } }, 'cpu'],
    ] as const) {
      if (offered.includes(controller)) continue;
      await expect(supervisor.launch(spec(limit))).rejects.toMatchObject({
        code: 'ERR_CUSTODY_UNSUPPORTED',
        message: expect.stringContaining(controller),
      });
    }
    expect(existsSync(join(ctx!.stateDir, 'lim'))).toBe(false);
    expect(supervisor.list()).toEqual([]);
  });

  it('limits are written into the instance cgroup where the root has the controllers', async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const { supervisor } = await open();
    const offered = supervisor.capabilities().cgroup!.controllers;
    const missing = ['memory', 'pids', 'cpu'].filter((c) => !offered.includes(c));
    t.skip(
      missing.length > 0,
      `the cgroup root offers no ${missing.join(', ')} controller here (cgroup.controllers: ${offered.join(' ') || 'none'})`,
    );
    const inst = await supervisor.launch({
      id: 'lim',
      command: PERL,
      args: (tok) => ['-e', 'sleep 60', tok, MARKER],
      limits: { memoryMax: 64 << 20, pidsMax: 16, cpuMax: { quotaUsec: 50_000, periodUsec: 100_000 } },
    });
    const read = (f: string) => readFileSync(join(inst.cgroup!, f), 'utf8').trim();
    expect([read('memory.max'), read('pids.max'), read('cpu.max')]).toEqual([String(64 << 20), '16', '50000 100000']);
    expect(supervisor.usage('lim').memoryBytes).toBeGreaterThan(0);
    await supervisor.stop('lim', { graceMs: 2000 });
  });

  it('tree: false is refused for an instance with a cgroup; an abort midway kills the cgroup and removes it', async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const { supervisor } = await open();
    const inst = await supervisor.launch({
      id: 'tf',
      command: PERL,
      args: (tok) => ['-e', `$SIG{TERM} = 'IGNORE'; sleep 60`, tok, MARKER],
    });
    // Stopped only once perl ignores TERM (bit 15 of SigIgn), however slowly it starts (a sanitizer's preload).
    await waitFor(
      () =>
        (BigInt(`0x${/SigIgn:\s*([0-9a-f]+)/.exec(readFileSync(`/proc/${inst.pid}/status`, 'utf8'))![1]}`) &
          (1n << 14n)) !==
        0n,
      10_000,
      'perl to ignore SIGTERM',
    );
    await expect(supervisor.stop('tf', { tree: false })).rejects.toMatchObject({ code: 'ERR_CUSTODY_INVALID_ARG' });
    expect(supervisor.list()[0]).toMatchObject({ status: 'running' });
    const ac = new AbortController();
    setTimeout(() => ac.abort(new Error('enough')), 200);
    await expect(supervisor.stop('tf', { graceMs: 30_000, signal: ac.signal })).rejects.toMatchObject({
      name: 'AbortError',
    });
    expect(isGone(inst.pid)).toBe(true);
    expect(existsSync(inst.cgroup!)).toBe(false);
  });

  it('a bystander carrying the token outside the cgroup is never signalled when a launch is abandoned', async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const { supervisor } = await open();
    const log = join(ctx!.root, 'bystander.log');
    let started: Promise<void> | undefined;
    let b: ChildProcess | undefined;
    let token = '';
    const err = await supervisor
      .launch({
        id: 'vm',
        command: PERL,
        args: (tok) => {
          token = tok;
          b = bystander(log, tok);
          started = ready(b);
          // Forks a member of its own, then fails before its socket appears: abandoned.
          return ['-e', 'fork or do { sleep 60; exit }; sleep 1; exit 3', '--', `vm-${tok}`, MARKER];
        },
        ready: { socket: join(ctx!.root, 'never.sock') },
        readyTimeoutMs: 10_000,
      })
      .catch((e: unknown) => e);
    await started;
    expect(err).toMatchObject({ code: 'ERR_CUSTODY_LAUNCH_EXITED' });
    expect(loggedSignals(log)).toEqual([]);
    expect(isGone(b!.pid!)).toBe(false);
    expect(
      processesWithMarker(MARKER).filter((p) => p.cmd.includes(`vm-${token}`) && p.pid !== b!.pid && p.state !== 'Z'),
    ).toEqual([]);
    expect(cgroupsBelow(CGROUP_ROOT).filter((d) => d.includes(`/vm.`))).toEqual([]);
  });

  it("a pid function's target created in another cgroup (no unit of its token): ERR_CUSTODY_NOT_OURS names it; it is not signalled, and its launcher's cgroup goes", async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const { supervisor } = await open();
    let target = 0;
    let token = '';
    const err = await supervisor
      .launch({
        id: 'fn',
        command: '/bin/sh',
        executable: PERL,
        args: (tok) => {
          token = tok;
          return ['-c', 'sleep 0.2', tok];
        },
        pid: () => {
          // As systemd-run's MainPID: created by someone else, outside our cgroup (and not our child: a shell's orphan).
          const out = execFileSync(
            '/bin/sh',
            ['-c', `${PERL} -e 'sleep 60' -- ${token} ${MARKER} >/dev/null 2>&1 & echo $!`],
            { encoding: 'utf8' },
          );
          target = Number(out.trim());
          return target;
        },
      })
      .catch((e: unknown) => e);
    try {
      const where = readFileSync(`/proc/${target}/cgroup`, 'utf8').match(/^0::(.*)$/m)?.[1];
      expect(err).toMatchObject({ code: 'ERR_CUSTODY_NOT_OURS', pid: target });
      expect((err as Error).message).toContain(`cgroup ${where}`);
      expect(isGone(target)).toBe(false);
      await waitFor(
        () => cgroupsBelow(CGROUP_ROOT).every((d) => !d.includes('/fn.')),
        5000,
        "the launcher's cgroup to go",
      );
    } finally {
      killOwn(target);
    }
  });

  // As `systemd-run --scope` does: a launcher writes itself into another cgroup's cgroup.procs ($0), then execs.
  const MOVE_AND_EXEC = 'echo $$ > "$0/cgroup.procs" && exec "$1" -e "sleep 60" -- "$2" "$3"';
  for (const pid of ['child', 'pidfile'] as const) {
    it(`a target its launcher moved into another cgroup before exec (pid: ${pid}): ERR_CUSTODY_NOT_OURS names both cgroups; it is not signalled`, async (t) => {
      t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
      const { supervisor, events } = await open();
      const elsewhere = `${CGROUP_ROOT}-elsewhere`;
      const pidfile = join(ctx!.root, 'daemon.pid');
      mkdirSync(elsewhere);
      let moved: { pid: number; start: string | null } | undefined;
      try {
        const err = (await supervisor
          .launch({
            id: 'moved',
            command: '/bin/sh',
            executable: PERL,
            args: (tok) =>
              pid === 'child'
                ? ['-c', MOVE_AND_EXEC, elsewhere, PERL, tok, MARKER]
                : [
                    '-c',
                    '/bin/sh -c "$0" "$1" "$2" "$3" "$4" & echo $! > "$5"',
                    MOVE_AND_EXEC,
                    elsewhere,
                    PERL,
                    tok,
                    MARKER,
                    pidfile,
                  ],
            ...(pid === 'pidfile' ? { pid: { file: pidfile } } : {}),
          })
          .catch((e: unknown) => e)) as Error & { code?: string; pid: number };
        expect(err).toMatchObject({ code: 'ERR_CUSTODY_NOT_OURS' });
        moved = { pid: err.pid, start: startOf(err.pid) };
        const token = String(events.find((e) => e.type === 'launch')?.token);
        expect(err.message).toContain(`it is in cgroup ${nodeOf(elsewhere)}, outside the instance's cgroup /`);
        expect(err.message).toContain(`/${cgroupName('moved', token)}`);
        // Not the instance's: left running where its launcher put it, never signalled.
        expect(cgroupOfPid(err.pid)).toBe(nodeOf(elsewhere));
        await waitFor(() => inspect(err.pid).argv[0] === PERL, 5000, 'the moved target to exec');
        expect(inspect(err.pid).argv).toEqual([PERL, '-e', 'sleep 60', '--', token, MARKER]);
        expect(startOf(err.pid)).toBe(moved.start);
        // Our own child is let go with a warning; a daemon a launcher reported was never ours to hold.
        if (pid === 'child') expect(events).toContainEqual(expect.objectContaining({ type: 'warning', pid: err.pid }));
        expect(events).toContainEqual(expect.objectContaining({ type: 'abandon', id: 'moved' }));
        expect(cgroupsBelow(CGROUP_ROOT).filter((d) => d.includes('/moved.'))).toEqual([]);
      } finally {
        if (moved && killOwn(moved.pid, { start: moved.start }))
          await waitFor(() => procsOf(elsewhere).length === 0, 5000, 'the moved target to end');
        rmdirSync(elsewhere);
      }
    });
  }

  it("a pidfile launch: the launcher is placed, so the daemon it leaves behind is in the instance's cgroup", async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const { supervisor } = await open();
    const pidfile = join(ctx!.root, 'daemon.pid');
    const inst = await supervisor.launch({
      id: 'pf',
      command: '/bin/sh',
      executable: PERL,
      args: (tok) => ['-c', `${PERL} -e 'sleep 60' -- ${tok} ${MARKER} & echo $! > ${pidfile}`, tok],
      pid: { file: pidfile },
    });
    expect(inst.cgroup).not.toBeNull();
    expect(procsOf(inst.cgroup!)).toEqual([inst.pid]);
    await supervisor.stop('pf', { graceMs: 2000 });
    expect(isGone(inst.pid)).toBe(true);
  });

  it('a main process that exits on its own takes what it left in its cgroup with it (a warning says so)', async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const { supervisor, events } = await open();
    const prog = `use POSIX (); if (!fork) { POSIX::setsid(); exec($^X, '-e', 'sleep 60', '--', 'escapee', $ARGV[1]) } select(undef, undef, undef, 0.3)`;
    const inst = await supervisor.launch({ id: 'gone', command: PERL, args: (tok) => ['-e', prog, tok, MARKER] });
    const left = await waitFor(escapee, 5000, 'the leftover');
    await inst.exited;
    await waitFor(() => !existsSync(inst.cgroup!), 5000, 'the cgroup to go');
    expect(isGone(left.pid)).toBe(true);
    expect(existsSync(join(ctx!.stateDir, 'gone'))).toBe(false);
    expect(events.find((e) => e.type === 'warning' && Array.isArray(e.pids))).toMatchObject({ pids: [left.pid] });
  });

  it('sweep never ends a process in an instance cgroup, whatever its argv; the same argv outside is an orphan', async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const { supervisor } = await open();
    const argv = [PERL, '-e', 'sleep 60', '--', 'sweepme', MARKER];
    const inst = await supervisor.launch({
      id: 'sw',
      command: '/bin/sh',
      args: (tok) => ['-c', `${argv.map((a) => `'${a}'`).join(' ')} & wait`, tok],
    });
    const member = await waitFor(() => procsOf(inst.cgroup!).find((p) => p !== inst.pid), 5000, 'the member');
    const outside = cpSpawn(argv[0]!, argv.slice(1), { stdio: 'ignore' });
    strangers.push(outside);
    await waitFor(
      () => processesWithMarker(MARKER).filter((p) => p.cmd.startsWith(PERL) && p.cmd.includes('sweepme')).length === 2,
      5000,
      'both',
    );
    const r = await supervisor.sweep({ argv });
    expect(r.matched.map((m) => m.pid)).toEqual([outside.pid]);
    expect(isGone(member)).toBe(false);
    await supervisor.stop('sw', { graceMs: 2000 });
    expect(isGone(member)).toBe(true);
  });
});
