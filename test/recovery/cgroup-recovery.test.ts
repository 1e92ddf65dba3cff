/**
 * Recovery with instance cgroups: a supervisor SIGKILLed and reopened gets
 * each adopted instance's cgroup back (its escapee is still ended by stop);
 * an interrupted launch is looked for among its cgroup's members only, so a
 * bystander carrying its token outside is neither adopted nor signalled; the
 * leftovers of an instance whose main process died are ended with it; a
 * launch whose target was moved out and its cgroup removed while no
 * supervisor ran is never cleaned while that target runs (after confirm it
 * goes the way a running instance does; before, it is quarantined); a
 * cgroup no manifest names is reported and left alone, or removed if empty.
 */
import { spawn as cpSpawn, type ChildProcess } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, rmdirSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { packageRoot } from '../../src/backend/addon.js';
import { backend } from '../../src/backend/index.js';
import { inspect, Supervisor, type CustodyEvent } from '../../src/index.js';
import { CGROUP_ROOT, CGROUP_SKIP, cgroupsBelow, expectNoCgroupsLeft, nodeOf, procsOf } from '../helpers/cgroup.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { processesWithMarker } from '../helpers/leaks.js';
import { endOwn, isGone, killAndWait, loggedSignals, MARKER, startOf, tmpDir, waitFor } from '../helpers/procs.js';
import { GATED_PERL_LAUNCH, PERL } from '../helpers/supervisor.js';

// Registered before the cleanups, so it runs after them: each test's undo removes what it made.
afterEach(() => {
  expect(cgroupsBelow(CGROUP_ROOT)).toEqual([]);
});
const cleanups = cleanupAfterEach({ marker: MARKER });
expectNoCgroupsLeft();

const ESCAPER = `use POSIX (); my $p = fork; if (!$p) { POSIX::setsid(); exec($^X, '-e', 'sleep 60', '--', 'escapee', $ARGV[1]) if !fork; POSIX::_exit(0) } waitpid($p, 0); sleep 60`;
/** The manifest custody wrote at `file`, as far as these tests read it; null while there is none. */
function readManifest(
  file: string,
): { state: string; identity: { pid: number } | null; cgroup: { path: string } | null } | null {
  return existsSync(file) ? JSON.parse(readFileSync(file, 'utf8')) : null;
}
const escapee = () => processesWithMarker(MARKER).find((p) => p.cmd.includes(' escapee ') && p.state !== 'Z');

/** A state dir and the means to open supervisors on it, in this process or in another one (to SIGKILL). */
function stateDir() {
  const dir = tmpDir('custody-cgrec-');
  const state = join(dir.path, 'state');
  const strangers: ChildProcess[] = [];
  const sups: Supervisor[] = [];
  cleanups.push(async () => {
    for (const s of sups) await s.close();
    await Promise.all(strangers.map(killAndWait));
    dir.cleanup();
  });
  return {
    root: dir.path,
    state,
    strangers,
    async open() {
      const events: CustodyEvent[] = [];
      const r = await Supervisor.open({
        stateDir: state,
        cgroup: { root: CGROUP_ROOT },
        onEvent: (e) => events.push(e),
      });
      sups.push(r.supervisor);
      return { ...r, events };
    },
    /**
     * Runs each of `launches` (a LaunchSpec's source text), one after another, in a supervisor in another
     * process; resolves with what it printed first (the first instance).
     */
    holder(...launches: string[]): { child: ChildProcess; line: Promise<string> } {
      const script = `
        const { Supervisor } = await import(${JSON.stringify(join(packageRoot, 'dist', 'index.js'))});
        const { writeFileSync } = await import('node:fs');
        const { supervisor } = await Supervisor.open({ stateDir: ${JSON.stringify(state)}, cgroup: { root: ${JSON.stringify(CGROUP_ROOT)} }, onEvent: () => {} });
        setInterval(() => {}, 1000);
        for (const spec of [${launches.join(', ')}]) {
          const inst = await supervisor.launch(spec);
          console.log(JSON.stringify({ pid: inst.pid, cgroup: inst.cgroup }));
        }`;
      const child = cpSpawn(process.execPath, ['--input-type=module', '-e', script], {
        stdio: ['ignore', 'pipe', 'inherit'],
        env: { ...process.env, CUSTODY_BACKEND: backend.name },
      });
      strangers.push(child);
      const line = new Promise<string>((resolve) => {
        let out = '';
        child.stdout!.on('data', (d: Buffer) => {
          out += d.toString();
          if (out.includes('\n')) resolve(out.split('\n')[0]!);
        });
      });
      return { child, line };
    },
  };
}

const sigkill = async (c: ChildProcess) => {
  c.kill('SIGKILL');
  await waitFor(() => c.exitCode !== null || c.signalCode !== null, 5000, 'the holder to die');
};

describe(`recovery with instance cgroups (${backend.name})`, () => {
  it('a supervisor SIGKILLed and reopened adopts its instance with its cgroup; stop still ends the escapee', async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const s = stateDir();
    const h = s.holder(
      `{ id: 'esc', command: ${JSON.stringify(PERL)}, args: (t) => ['-e', ${JSON.stringify(ESCAPER)}, '--', t, ${JSON.stringify(MARKER)}] }`,
    );
    const launched = JSON.parse(await h.line) as { pid: number; cgroup: string };
    const e = await waitFor(escapee, 5000, 'the escapee');
    await sigkill(h.child);
    const { supervisor, report } = await s.open();
    expect(report.adopted).toEqual([{ id: 'esc', pid: launched.pid }]);
    expect(supervisor.get('esc')!.cgroup).toBe(launched.cgroup);
    expect(supervisor.list()).toEqual([
      expect.objectContaining({ id: 'esc', status: 'running', cgroup: launched.cgroup }),
    ]);
    expect(procsOf(launched.cgroup)).toEqual(expect.arrayContaining([launched.pid, e.pid]));
    expect(supervisor.usage('esc').pids).toBe(2);
    await supervisor.stop('esc', { graceMs: 2000 });
    expect(isGone(e.pid)).toBe(true);
    expect(existsSync(launched.cgroup)).toBe(false);
  });

  it('recovery of a starting manifest takes its target from the cgroup, never a bystander carrying the token outside', async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const s = stateDir();
    const tokenFile = join(s.root, 'token');
    // The launcher is a shell that execs perl once the gate opens; the holder is SIGKILLed before that.
    const h = s.holder(`{ id: 'vm', command: '/bin/sh', executable: ${JSON.stringify(PERL)}, confirmTimeoutMs: 10000,
      args: (t) => { writeFileSync(${JSON.stringify(tokenFile)}, t); return ['-c', ${JSON.stringify(GATED_PERL_LAUNCH)}, ${JSON.stringify(PERL)}, t, ${JSON.stringify(MARKER)}, ${JSON.stringify(join(s.root, 'go'))}]; } }`);
    const token = await waitFor(
      () => (existsSync(tokenFile) ? readFileSync(tokenFile, 'utf8') : null),
      10_000,
      'the launch to start',
    );
    // The very program and argv the target will have, token included: only the cgroup tells them apart.
    const b = cpSpawn(PERL, ['-e', 'sleep 30', '--', token, MARKER], { stdio: 'ignore' });
    s.strangers.push(b);
    await waitFor(() => processesWithMarker(token).some((p) => p.cmd.startsWith('/bin/sh')), 5000, 'the launcher');
    await sigkill(h.child);
    writeFileSync(join(s.root, 'go'), '');
    const { supervisor, report } = await s.open();
    expect(report.adopted).toEqual([expect.objectContaining({ id: 'vm', reason: 'starting' })]);
    const pid = report.adopted[0]!.pid!;
    expect(pid).not.toBe(b.pid);
    expect(inspect(pid).argv).toEqual(inspect(b.pid!).argv);
    const cg = supervisor.get('vm')!.cgroup!;
    expect(procsOf(cg)).toEqual([pid]);
    await supervisor.stop('vm', { graceMs: 2000 });
    expect(isGone(b.pid!)).toBe(false);
  });

  it('an interrupted launch that never became its target: its cgroup is ended, the bystander outside is untouched', async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const s = stateDir();
    const tokenFile = join(s.root, 'token');
    const h = s.holder(`{ id: 'vm', command: '/bin/sh', executable: ${JSON.stringify(PERL)}, confirmTimeoutMs: 60000,
      args: (t) => { writeFileSync(${JSON.stringify(tokenFile)}, t); return ['-c', 'sleep 60', t, ${JSON.stringify(MARKER)}]; } }`);
    const token = await waitFor(
      () => (existsSync(tokenFile) ? readFileSync(tokenFile, 'utf8') : null),
      10_000,
      'the launch to start',
    );
    const log = join(s.root, 'bystander.log');
    const b = cpSpawn(
      PERL,
      [
        '-e',
        `$SIG{TERM} = sub { open(my $f, '>>', $ARGV[0]); print $f "TERM\\n"; exit 0 }; sleep 60`,
        log,
        token,
        MARKER,
      ],
      { stdio: 'ignore' },
    );
    s.strangers.push(b);
    const launcher = await waitFor(
      () => processesWithMarker(token).find((p) => p.cmd.startsWith('/bin/sh')),
      5000,
      'the launcher',
    );
    await sigkill(h.child);
    const { report, events } = await s.open();
    expect(report.cleaned).toEqual([expect.objectContaining({ id: 'vm', reason: 'gone' })]);
    expect(isGone(launcher.pid)).toBe(true);
    expect(isGone(b.pid!)).toBe(false);
    expect(loggedSignals(log)).toEqual([]);
    expect(events.some((e) => e.type === 'warning' && e.id === 'vm' && Array.isArray(e.pids))).toBe(true);
  });

  it('a launch cut off before readiness, its target moved out and its cgroup removed, is judged as a running instance is: never cleaned while it runs', async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const s = stateDir();
    const sleeper = `args: (t) => ['-e', 'sleep 60', '--', t, ${JSON.stringify(MARKER)}]`;
    // A running twin first; then a launch confirmed whose readiness never comes: its manifest is `starting`
    // with the confirmed identity when the holder dies.
    const h = s.holder(
      `{ id: 'run', command: ${JSON.stringify(PERL)}, ${sleeper} }`,
      `{ id: 'vm', command: ${JSON.stringify(PERL)}, ${sleeper}, readyTimeoutMs: 60000, ready: () => new Promise(() => {}) }`,
    );
    await h.line;
    const onDisk = (id: string) => readManifest(join(s.state, id, 'manifest.json'));
    const vm = await waitFor(() => onDisk('vm')?.identity && onDisk('vm'), 10_000, 'the confirmed identity on disk');
    const run = onDisk('run')!;
    expect([run.state, vm.state]).toEqual(['running', 'starting']);
    const targets = [run, vm].map((m) => ({ pid: m.identity!.pid, start: startOf(m.identity!.pid) }));
    await sigkill(h.child);
    // While no supervisor runs, both targets are moved into a cgroup of the test's own and their cgroups removed.
    const elsewhere = join(CGROUP_ROOT, 'elsewhere');
    mkdirSync(elsewhere);
    cleanups.push(async () => {
      await endOwn(targets);
      await waitFor(() => procsOf(elsewhere).length === 0, 5000, 'the moved targets to end');
      rmdirSync(elsewhere);
    });
    for (const m of [run, vm]) {
      writeFileSync(join(elsewhere, 'cgroup.procs'), String(m.identity!.pid));
      rmdirSync(m.cgroup!.path);
    }
    const { report } = await s.open();
    const outcome = (id: string) => {
      for (const kind of ['adopted', 'repaired', 'cleaned', 'quarantined', 'deferred'] as const) {
        const e = report[kind].find((x) => x.id === id);
        if (e) return { kind, field: 'field' in e ? e.field : undefined, reason: kind === 'adopted' ? '' : e.reason };
      }
      return null;
    };
    expect(report.cleaned).toEqual([]);
    // Whichever way the running rule goes for a main outside its cgroup, the confirmed launch goes the same way.
    expect(outcome('run')).not.toBeNull();
    expect(outcome('vm')).toEqual(outcome('run'));
    for (const { pid } of targets) expect(isGone(pid)).toBe(false);
  });

  it('a launch cut off before confirm, its target moved out and its cgroup removed: quarantined with its pid, not cleaned, not signalled', async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const s = stateDir();
    const tokenFile = join(s.root, 'token');
    const gate = join(s.root, 'go');
    const h = s.holder(`{ id: 'vm', command: '/bin/sh', executable: ${JSON.stringify(PERL)}, confirmTimeoutMs: 10000,
      args: (t) => { writeFileSync(${JSON.stringify(tokenFile)}, t); return ['-c', ${JSON.stringify(GATED_PERL_LAUNCH)}, ${JSON.stringify(PERL)}, t, ${JSON.stringify(MARKER)}, ${JSON.stringify(gate)}]; } }`);
    const token = await waitFor(
      () => (existsSync(tokenFile) ? readFileSync(tokenFile, 'utf8') : null),
      10_000,
      'the launch to start',
    );
    const launcher = await waitFor(
      () => processesWithMarker(token).find((p) => p.cmd.startsWith('/bin/sh')),
      5000,
      'the launcher',
    );
    await sigkill(h.child);
    // The launcher execs its target (the same pid) only now, with no supervisor to confirm it.
    writeFileSync(gate, '');
    await waitFor(() => inspect(launcher.pid).argv[0] === PERL, 5000, 'the target to exec');
    const target = { pid: launcher.pid, start: startOf(launcher.pid) };
    const m = readManifest(join(s.state, 'vm', 'manifest.json'))!;
    expect(m.identity).toBeNull();
    const elsewhere = join(CGROUP_ROOT, 'elsewhere');
    mkdirSync(elsewhere);
    cleanups.push(async () => {
      await endOwn([target]);
      await waitFor(() => procsOf(elsewhere).length === 0, 5000, 'the moved target to end');
      rmdirSync(elsewhere);
    });
    writeFileSync(join(elsewhere, 'cgroup.procs'), String(target.pid));
    rmdirSync(m.cgroup!.path);
    const { report, events } = await s.open();
    expect(report.cleaned).toEqual([]);
    expect(report.quarantined).toEqual([{ id: 'vm', pid: target.pid, reason: 'mismatch', field: 'cgroup' }]);
    expect(events).toContainEqual(
      expect.objectContaining({
        type: 'warning',
        id: 'vm',
        pid: target.pid,
        message: expect.stringContaining(nodeOf(elsewhere)),
      }),
    );
    expect(isGone(target.pid)).toBe(false);
    expect(startOf(target.pid)).toBe(target.start);
    expect(readManifest(join(s.state, 'vm', 'manifest.json'))?.state).toBe('quarantined');
  });

  it('an instance whose main process died while no supervisor ran: what it left in its cgroup is ended with it', async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const s = stateDir();
    const first = await s.open();
    const inst = await first.supervisor.launch({
      id: 'esc',
      command: PERL,
      args: (tok) => ['-e', ESCAPER, '--', tok, MARKER],
    });
    const e = await waitFor(escapee, 5000, 'the escapee');
    await first.supervisor.close();
    process.kill(inst.pid, 'SIGKILL');
    await waitFor(() => isGone(inst.pid), 5000, 'the main process to die');
    const { report } = await s.open();
    expect(report.cleaned).toEqual([{ id: 'esc', pid: inst.pid, reason: 'gone' }]);
    expect(isGone(e.pid)).toBe(true);
    expect(existsSync(inst.cgroup!)).toBe(false);
  });

  it('a cgroup no manifest names is reported and left alone while it has processes, removed when empty', async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const s = stateDir();
    const first = await s.open();
    const inst = await first.supervisor.launch({
      id: 'kept',
      command: PERL,
      args: (tok) => ['-e', 'sleep 60', tok, MARKER],
    });
    await first.supervisor.close();
    // The manifest deleted by hand; an empty cgroup beside it (a crash between creating one and its manifest).
    rmSync(join(s.state, 'kept'), { recursive: true });
    const empty = join(dirname(inst.cgroup!), 'stray.0123456789ab');
    mkdirSync(empty);
    cleanups.push(async () => {
      // This test's own process, ended by its pid; then the cgroups custody left alone.
      process.kill(inst.pid, 'SIGKILL');
      await waitFor(() => isGone(inst.pid) && procsOf(inst.cgroup!).length === 0, 5000, 'the orphan to die');
      rmdirSync(inst.cgroup!);
      rmdirSync(dirname(inst.cgroup!));
    });
    const { report, events, supervisor } = await s.open();
    expect(report).toMatchObject({ adopted: [], cleaned: [], quarantined: [] });
    const warning = events.find((e) => e.type === 'warning' && e.cgroup === inst.cgroup);
    expect(warning).toMatchObject({ pids: [inst.pid] });
    expect(isGone(inst.pid)).toBe(false);
    expect(existsSync(inst.cgroup!)).toBe(true);
    expect(existsSync(empty)).toBe(false);
    await supervisor.close();
    // Its sub-cgroup stays while the orphan's cgroup is in it.
    expect(existsSync(dirname(inst.cgroup!))).toBe(true);
  });
});
