// Real software no one here wrote, under custody: Debian's QEMU (TCG,
// `-machine none`, QMP on a unix socket), daemonized (`-daemonize -pidfile`,
// systemd's Type=forking) and not; start-stop-daemon as a launcher; the
// systemd-run / Firecracker-jailer shape of a launcher that reports a pid
// before it has exec'd; a python daemon speaking sd_notify, and systemd's own
// systemd-notify from a shell script. Readiness is QMP answering
// (examples/qmp.js), the graceful stop QMP `quit`. Skipped, saying why, where
// QEMU is not installed (Debian: apt-get install qemu-system-x86).
import { spawn as cpSpawn, execFile, type ChildProcess } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it, type TestContext } from 'vitest';
import { qmpQuit, qmpReady, qmpStatus } from '../../examples/qmp.js';
import { packageRoot } from '../../src/backend/addon.js';
import { backend } from '../../src/backend/index.js';
import { Supervisor, type CustodyEvent } from '../../src/index.js';
import { expectNoLeaks, processesWithEnvMarker, processesWithMarker } from '../helpers/leaks.js';
import { isGone, killAndWait, MARKER, waitFor } from '../helpers/procs.js';
import { FIXTURES, openSupervisor, PYTHON } from '../helpers/supervisor.js';
import { installed, qemuArgs, ssdStart as ssd } from './programs.js';
import { plainEnv } from './plain-env.js';

const QEMU = installed('qemu-system-x86_64');
const SSD = installed('start-stop-daemon');
const NOTIFY = installed('systemd-notify');
const SPAWN_DETACHED = join(packageRoot, 'examples', 'spawn-detached.sh');
const NOTIFY_DAEMON = join(FIXTURES, 'notify-daemon.py');
const NO_QEMU = 'qemu-system-x86_64 is not installed (Debian: apt-get install qemu-system-x86; .ci/run installs it)';

/** Skips without QEMU, saying why; where CI installed it (CUSTODY_REQUIRE_QEMU=1) its absence is a failure. */
function needQemu(t: TestContext): string {
  if (QEMU === null && process.env.CUSTODY_REQUIRE_QEMU === '1')
    throw new Error(`CUSTODY_REQUIRE_QEMU=1, but ${NO_QEMU}`);
  t.skip(QEMU === null, NO_QEMU);
  return QEMU!;
}

expectNoLeaks({ marker: MARKER });

afterAll(() => {
  // Every QEMU here is named after the marker: none may be left, zombie or not.
  expect(
    processesWithMarker(MARKER).filter((p) => p.cmd.includes('qemu')),
    'QEMU left behind',
  ).toEqual([]);
});

let ctx: Awaited<ReturnType<typeof openSupervisor>>;
const strangers: ChildProcess[] = [];
afterEach(async () => {
  for (const s of strangers.splice(0)) await killAndWait(s);
  await ctx?.dispose();
});

const NO_SSD = 'start-stop-daemon is not installed (Debian package dpkg)';

/**
 * What every launch here adds: bounds with margin for a loaded machine (QEMU's -daemonize parent exits only
 * once its fork has initialized), and an environment without a sanitizer preload (QEMU is not under test).
 */
const QEMU_SPEC = { confirmTimeoutMs: 30_000, env: plainEnv() };

const quit = (qmp: string) => (_inst: unknown, signal: AbortSignal) => qmpQuit(qmp, { signal });
const types = (events: CustodyEvent[], id: string) => events.filter((e) => e.id === id).map((e) => e.type);

/** The first MAINPID=<pid> line of a launcher's stdout (spawn-detached.sh), polled within a bound. */
async function mainPidFrom(file: string): Promise<number> {
  const deadline = Date.now() + 5000;
  for (;;) {
    const m = existsSync(file) ? /^MAINPID=(\d+)$/m.exec(readFileSync(file, 'utf8')) : null;
    if (m) return Number(m[1]);
    if (Date.now() > deadline) throw new Error(`no MAINPID= in ${file}`);
    await new Promise((r) => setTimeout(r, 10));
  }
}

/** Runs a node script (ESM, importing the built package) and resolves its first stdout line matching `want`. */
function nodeScript(script: string, want: RegExp): { child: ChildProcess; line: Promise<string> } {
  // Without a sanitizer's preload: that supervisor is not under test, and its QEMU must not inherit it.
  const child = cpSpawn(process.execPath, ['--input-type=module', '-e', script], {
    stdio: ['ignore', 'pipe', 'inherit'],
    env: plainEnv(),
  });
  strangers.push(child);
  const line = new Promise<string>((resolve, reject) => {
    let buf = '';
    child.stdout!.on('data', (d: Buffer) => {
      buf += d.toString();
      const m = buf.split('\n').find((l) => want.test(l));
      if (m) resolve(m);
    });
    child.once('exit', (code, sig) => reject(new Error(`the script exited (${code ?? sig}) before ${want}: ${buf}`)));
  });
  return { child, line };
}

describe(`QEMU under custody (${backend.name})`, () => {
  it('daemonized (-daemonize -pidfile): Type=forking, ready when QMP answers, stopped by QMP quit', async (t) => {
    const qemu = needQemu(t);
    ctx = await openSupervisor();
    const qmp = join(ctx.root, 'vm.qmp');
    const pidfile = join(ctx.root, 'vm.pid');
    const inst = await ctx.supervisor.launch({
      ...QEMU_SPEC,
      id: 'vm',
      command: qemu,
      args: (tok) => qemuArgs(tok, qmp, ['-daemonize', '-pidfile', pidfile]),
      executable: qemu,
      pid: { file: pidfile },
      ready: { socket: qmp, probe: qmpReady },
      readyTimeoutMs: 30_000,
    });
    expect(inst.pid).toBe(Number(readFileSync(pidfile, 'utf8')));
    expect(inst.pid).not.toBe(ctx.events.find((e) => e.type === 'spawn')!.pid);
    expect(await qmpStatus(qmp)).toBe('running');
    const r = await ctx.supervisor.stop('vm', { graceMs: 10_000, graceful: quit(qmp) });
    expect(r).toMatchObject({ outcome: 'exited', escalated: false });
    expect(types(ctx.events, 'vm')).toEqual(['launch', 'spawn', 'confirm', 'ready', 'running', 'stop']);
    expect(isGone(inst.pid)).toBe(true);
    expect([existsSync(qmp), existsSync(pidfile)]).toEqual([false, false]);
  }, 60_000);

  it('not daemonized: the child is QEMU; its exit status after quit is 0', async (t) => {
    const qemu = needQemu(t);
    ctx = await openSupervisor();
    const qmp = join(ctx.root, 'vm.qmp');
    const inst = await ctx.supervisor.launch({
      ...QEMU_SPEC,
      id: 'vm',
      command: qemu,
      args: (tok) => qemuArgs(tok, qmp),
      ready: { socket: qmp, probe: qmpReady },
    });
    expect(inst.identity.argv[0]).toBe(qemu);
    const r = await ctx.supervisor.stop('vm', { graceMs: 10_000, graceful: quit(qmp) });
    expect(r).toMatchObject({ outcome: 'exited', escalated: false, code: 0, signal: null });
  }, 60_000);

  it('an early exit (a bad option) is ERR_CUSTODY_LAUNCH_EXITED with the stderr tail, daemonized or not', async (t) => {
    const qemu = needQemu(t);
    ctx = await openSupervisor();
    const qmp = join(ctx.root, 'vm.qmp');
    const pidfile = join(ctx.root, 'vm.pid');
    const plain = await ctx.supervisor
      .launch({
        ...QEMU_SPEC,
        id: 'a',
        command: qemu,
        args: (tok) => qemuArgs(tok, qmp, ['-bogus-option']),
        ready: { socket: qmp, probe: qmpReady },
      })
      .catch((e: unknown) => e);
    expect(plain).toMatchObject({
      code: 'ERR_CUSTODY_LAUNCH_EXITED',
      exitCode: 1,
      stderrTail: expect.stringContaining('-bogus-option: invalid option'),
    });
    const forking = await ctx.supervisor
      .launch({
        ...QEMU_SPEC,
        id: 'b',
        command: qemu,
        args: (tok) => qemuArgs(tok, qmp, ['-daemonize', '-pidfile', pidfile, '-bogus-option']),
        executable: qemu,
        pid: { file: pidfile },
        ready: { socket: qmp, probe: qmpReady },
      })
      .catch((e: unknown) => e);
    expect(forking).toMatchObject({
      code: 'ERR_CUSTODY_LAUNCH_EXITED',
      exitCode: 1,
      stderrTail: expect.stringContaining('invalid option'),
    });
    expect(ctx.supervisor.list()).toEqual([]);
  }, 60_000);

  it('-device bogus is never reported running, daemonized or not (10 launches each)', async (t) => {
    const qemu = needQemu(t);
    ctx = await openSupervisor();
    const qmp = join(ctx.root, 'vm.qmp');
    const pidfile = join(ctx.root, 'vm.pid');
    const outcomes: string[] = [];
    for (let i = 0; i < 10; i++) {
      for (const daemonize of [false, true]) {
        const extra = daemonize ? ['-daemonize', '-pidfile', pidfile, '-device', 'bogus'] : ['-device', 'bogus'];
        const r = await ctx.supervisor
          .launch({
            ...QEMU_SPEC,
            id: `d${i}${daemonize ? 'f' : 'c'}`,
            command: qemu,
            args: (tok) => qemuArgs(tok, qmp, extra),
            ...(daemonize ? { executable: qemu, pid: { file: pidfile } } : {}),
            ready: { socket: qmp, probe: qmpReady },
            readyTimeoutMs: 20_000,
          })
          .then(
            () => 'running',
            (e: { code?: string; stderrTail?: string }) =>
              `${e.code}:${/not a valid device model name/.test(e.stderrTail ?? '')}`,
          );
        outcomes.push(r);
      }
    }
    expect(new Set(outcomes)).toEqual(new Set(['ERR_CUSTODY_LAUNCH_EXITED:true']));
    expect(ctx.events.filter((e) => e.type === 'running')).toEqual([]);
  }, 120_000);

  it('a supervisor SIGKILLed once QEMU runs, and one SIGKILLed mid-launch: reopened, each QEMU is adopted and stopped', async (t) => {
    const qemu = needQemu(t);
    ctx = await openSupervisor();
    await ctx.supervisor.close();
    const lib = JSON.stringify(join(packageRoot, 'dist', 'index.js'));
    const spec = (
      id: string,
      probe: string,
    ) => `{ id: '${id}', command: ${JSON.stringify(qemu)}, executable: ${JSON.stringify(qemu)},
        args: (t) => ${JSON.stringify(qemuArgs('TOKEN', join(ctx.root, `${id}.qmp`), ['-daemonize', '-pidfile', join(ctx.root, `${id}.pid`)]))}.map((a) => a.replace('TOKEN', t)),
        pid: { file: ${JSON.stringify(join(ctx.root, `${id}.pid`))} }, ready: { socket: ${JSON.stringify(join(ctx.root, `${id}.qmp`))}, probe: ${probe} },
        readyTimeoutMs: 60000, confirmTimeoutMs: 30000 }`;
    // One launch completes; the second one's probe never returns, so that supervisor dies with it in flight.
    const script = `
      const { Supervisor } = await import(${lib});
      const { supervisor } = await Supervisor.open({ stateDir: ${JSON.stringify(ctx.stateDir)}, onEvent: () => {} });
      const vm = await supervisor.launch(${spec('done', '() => {}')});
      console.log('running ' + vm.pid);
      await supervisor.launch(${spec('mid', "() => { console.log('probing'); return new Promise(() => {}); }")});`;
    const { child, line } = nodeScript(script, /^probing$/);
    await line;
    child.kill('SIGKILL');
    await waitFor(() => child.exitCode !== null || child.signalCode !== null, 5000, 'the supervisor to die');
    const { supervisor, report } = await Supervisor.open({ stateDir: ctx.stateDir, onEvent: () => {} });
    try {
      const done = Number(readFileSync(join(ctx.root, 'done.pid'), 'utf8'));
      const mid = Number(readFileSync(join(ctx.root, 'mid.pid'), 'utf8'));
      expect(report.adopted.sort((a, b) => a.id.localeCompare(b.id))).toEqual([
        { id: 'done', pid: done },
        { id: 'mid', pid: mid, reason: 'starting' },
      ]);
      for (const id of ['done', 'mid']) {
        expect(await qmpStatus(join(ctx.root, `${id}.qmp`))).toBe('running');
        expect(
          await supervisor.stop(id, { graceMs: 10_000, graceful: quit(join(ctx.root, `${id}.qmp`)) }),
        ).toMatchObject({ outcome: 'exited', escalated: false });
      }
      expect([isGone(done), isGone(mid)]).toEqual([true, true]);
    } finally {
      await supervisor.close();
    }
  }, 90_000);

  it('start-stop-daemon as the launcher: it writes the pidfile before exec and exits 0; confirm waits for QEMU', async (t) => {
    const qemu = needQemu(t);
    t.skip(SSD === null, NO_SSD);
    ctx = await openSupervisor();
    const qmp = join(ctx.root, 'vm.qmp');
    const pidfile = join(ctx.root, 'vm.pid');
    const inst = await ctx.supervisor.launch({
      ...QEMU_SPEC,
      id: 'ssd',
      command: SSD!,
      args: (tok) => ssd(pidfile, qemu, qemuArgs(tok, qmp)),
      executable: qemu,
      pid: { file: pidfile },
      ready: { socket: qmp, probe: qmpReady },
      readyTimeoutMs: 30_000,
    });
    expect(inst.identity.argv[0]).toBe(qemu);
    expect(inst.pid).toBe(Number(readFileSync(pidfile, 'utf8')));
    expect(await ctx.supervisor.stop('ssd', { graceMs: 10_000, graceful: quit(qmp) })).toMatchObject({
      outcome: 'exited',
      escalated: false,
    });
    expect(processesWithMarker(MARKER)).toEqual([]);
  }, 60_000);

  it('the systemd-run / jailer shape (examples/spawn-detached.sh): a pid reported before exec, by a launcher that does not wait', async (t) => {
    const qemu = needQemu(t);
    ctx = await openSupervisor();
    const qmp = join(ctx.root, 'vm.qmp');
    const out = join(ctx.root, 'launcher.out');
    const inst = await ctx.supervisor.launch({
      ...QEMU_SPEC,
      id: 'jail',
      command: '/bin/sh',
      args: (tok) => [SPAWN_DETACHED, qemu, ...qemuArgs(tok, qmp)],
      stdout: { file: out },
      pid: () => mainPidFrom(out),
      executable: qemu,
      ready: { socket: qmp, probe: qmpReady },
      readyTimeoutMs: 30_000,
    });
    // The pid was reported while it was still the launcher's shell; the identity is QEMU's.
    expect(inst.pid).toBe(await mainPidFrom(out));
    expect(inst.identity.argv[0]).toBe(qemu);
    expect(await ctx.supervisor.stop('jail', { graceMs: 10_000, graceful: quit(qmp) })).toMatchObject({
      outcome: 'exited',
    });
    expect(isGone(inst.pid)).toBe(true);
  }, 60_000);

  it.runIf(backend.name === 'native')(
    'a python daemon speaking sd_notify, started by start-stop-daemon: ready at its READY=1',
    async (t) => {
      t.skip(SSD === null, NO_SSD);
      ctx = await openSupervisor();
      const pidfile = join(ctx.root, 'py.pid');
      const inst = await ctx.supervisor.launch({
        ...QEMU_SPEC,
        id: 'py',
        command: SSD!,
        args: (tok) => ssd(pidfile, PYTHON, [NOTIFY_DAEMON, MARKER, tok, '--status', 'binding', '--delay', '0.3']),
        executable: PYTHON,
        pid: { file: pidfile },
        ready: 'notify',
        readyTimeoutMs: 30_000,
      });
      expect(inst.pid).toBe(Number(readFileSync(pidfile, 'utf8')));
      expect(ctx.events.filter((e) => e.type === 'status').map((e) => e.status)).toEqual(['binding']);
      expect(types(ctx.events, 'py')).toContain('ready');
      await ctx.supervisor.stop('py', { graceMs: 5000 });
      expect(isGone(inst.pid)).toBe(true);
    },
    60_000,
  );

  it.runIf(backend.name === 'native')(
    "a shell script's systemd-notify --ready (a member that exits right after, held by its BARRIER=1) counts",
    async (t) => {
      t.skip(NOTIFY === null, 'systemd-notify is not installed (Debian package systemd)');
      ctx = await openSupervisor();
      const script = `${NOTIFY} --status=loading; sleep 0.2; ${NOTIFY} --ready --status=serving; sleep 300`;
      const inst = await ctx.supervisor.launch({
        id: 'sh',
        command: '/bin/sh',
        args: (tok) => ['-c', script, tok, MARKER],
        ready: 'notify',
        readyTimeoutMs: 30_000,
      });
      expect(ctx.events.filter((e) => e.type === 'status').map((e) => e.status)).toEqual(['loading', 'serving']);
      expect(ctx.events.filter((e) => e.type === 'warning')).toEqual([]);
      await ctx.supervisor.stop('sh', { graceMs: 5000 });
      expect(isGone(inst.pid)).toBe(true);
      // Stopped the moment it is ready, the shell is forking its next command: that child, re-parented away
      // when the shell dies, is still in the instance's session and must go with it (20 times).
      const quick = `${NOTIFY} --ready; sleep 300`;
      for (let i = 0; i < 20; i++) {
        await ctx.supervisor.launch({
          id: `q${i}`,
          command: '/bin/sh',
          args: (tok) => ['-c', quick, tok, MARKER],
          ready: 'notify',
        });
        await ctx.supervisor.stop(`q${i}`, { graceMs: 5000 });
        const left = processesWithEnvMarker().filter((p) => p.state !== 'Z' && p.cmd === 'sleep 300');
        expect(left, `after stop ${i}`).toEqual([]);
      }
    },
    60_000,
  );

  it("docs/qemu.md's snippet is examples/qemu.js, and it runs as written", async (t) => {
    needQemu(t);
    const section = readFileSync(join(packageRoot, 'docs', 'qemu.md'), 'utf8');
    const snippet = /```js\n([\s\S]*?)```/.exec(section)?.[1];
    expect(snippet).toBe(readFileSync(join(packageRoot, 'examples', 'qemu.js'), 'utf8'));
    const out = await new Promise<string>((resolve, reject) => {
      execFile(
        process.execPath,
        [join(packageRoot, 'examples', 'qemu.js')],
        { timeout: 60_000, cwd: packageRoot, env: plainEnv() },
        (err, stdout, stderr) => (err ? reject(new Error(`${err.message}\n${stdout}\n${stderr}`)) : resolve(stdout)),
      );
    });
    expect(out).toMatch(/vm-1 is pid \d+; QMP says running/);
    expect(out).toMatch(/vm-1 stopped: exited\n/);
  }, 90_000);
});
