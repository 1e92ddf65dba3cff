// token: 'env': programs with a fixed argv (/bin/sleep 300) carry the launch
// token as CUSTODY_TOKEN in their initial environment, proven from
// /proc/<pid>/environ: they launch, confirm, recover and are abandoned like
// any other; an environment that may not be read is unprovable.
import { spawn as cpSpawn, execFileSync, type ChildProcess } from 'node:child_process';
import {
  chownSync,
  closeSync,
  existsSync,
  constants as fsc,
  mkdirSync,
  openSync,
  readFileSync,
  realpathSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { packageRoot } from '../../src/backend/addon.js';
import { backend } from '../../src/backend/index.js';
import { inspect, Supervisor } from '../../src/index.js';
import { envToken, mayCarryEnvToken } from '../../src/process/ownership.js';
import { expectNoLeaks, processesWithMarker } from '../helpers/leaks.js';
import { isGone, isRoot, killAndWait, MARKER, tmpDir, waitFor } from '../helpers/procs.js';
import { CGROUP_ROOT, CGROUP_SKIP, expectNoCgroupsLeft } from '../helpers/cgroup.js';
import { FIXTURES, openSupervisor, PYTHON } from '../helpers/supervisor.js';
import { plainEnv } from '../integration/plain-env.js';

expectNoLeaks({ marker: MARKER });
expectNoCgroupsLeft();

const SLEEP = realpathSync('/bin/sleep');

let ctx: Awaited<ReturnType<typeof openSupervisor>>;
const strangers: ChildProcess[] = [];
afterEach(async () => {
  for (const s of strangers.splice(0)) await killAndWait(s);
  await ctx?.dispose();
});

const environOf = (pid: number) => readFileSync(`/proc/${pid}/environ`, 'latin1').split('\0');
const manifestOf = (stateDir: string, id: string) =>
  JSON.parse(readFileSync(join(stateDir, id, 'manifest.json'), 'utf8'));

describe('env tokens (pure)', () => {
  it('CUSTODY_TOKEN is read as getenv would: whole entries, the first one wins', () => {
    const env = (...kv: string[]) => Buffer.from(`${kv.join('\0')}\0`, 'latin1');
    expect(envToken(env('PATH=/bin', 'CUSTODY_TOKEN=abc', 'CUSTODY_TOKEN=def'))).toBe('abc');
    expect(envToken(env('XCUSTODY_TOKEN=abc', 'CUSTODY_TOKENS=x'))).toBeNull();
    expect(envToken(Buffer.from('CUSTODY_TOKEN=tail-without-nul'))).toBe('tail-without-nul');
    expect(envToken(Buffer.alloc(0))).toBeNull();
  });

  it("only processes whose argv is the launch's, or whose argv[0] names the executable, have their environment read", () => {
    expect(mayCarryEnvToken(['/bin/sleep', '300'], ['/bin/sleep', '300'], null)).toBe(true);
    expect(mayCarryEnvToken(['/bin/sleep', '301'], ['/bin/sleep', '300'], null)).toBe(false);
    expect(
      mayCarryEnvToken(['qemu-system-x86_64', '-m', '64'], ['/bin/sh', '-c', 'x'], '/usr/bin/qemu-system-x86_64'),
    ).toBe(true);
    expect(mayCarryEnvToken(['tail', '-f', 'x'], ['/bin/sh', '-c', 'x'], '/usr/bin/qemu-system-x86_64')).toBe(false);
  });
});

describe(`token: 'env' (${backend.name})`, () => {
  it('launches a fixed-argv program, confirms it by its environment, and records the mode; argv mode refuses it up front', async () => {
    ctx = await openSupervisor();
    await expect(ctx.supervisor.launch({ id: 'argv', command: SLEEP, args: ['300'] })).rejects.toMatchObject({
      code: 'ERR_CUSTODY_INVALID_ARG',
      // The message names the rule and the way out for a fixed argv.
      message: expect.stringMatching(/must carry the launch token: .*token: 'env'/),
    });
    await expect(
      ctx.supervisor.launch({ id: 'bad', command: SLEEP, args: ['300'], token: 'environ' as 'env' }),
    ).rejects.toMatchObject({
      code: 'ERR_CUSTODY_INVALID_ARG',
    });
    const inst = await ctx.supervisor.launch({
      id: 's',
      command: SLEEP,
      args: ['300'],
      token: 'env',
      env: { PATH: '/bin', CUSTODY_TOKEN: 'not-this-one' },
    });
    expect(inst.identity.argv).toEqual([SLEEP, '300']);
    // First, so a bounded read finds it; ours, whatever the spec's env said.
    expect(environOf(inst.pid).slice(0, 2)).toEqual([`CUSTODY_TOKEN=${inst.token}`, 'PATH=/bin']);
    expect(manifestOf(ctx.stateDir, 's')).toMatchObject({ state: 'running', tokenMode: 'env', args: ['300'] });
    await ctx.supervisor.stop('s', { graceMs: 2000 });
    expect(isGone(inst.pid)).toBe(true);
  });

  it('a reopened supervisor adopts it by its environment; one whose environment lacks the token is quarantined, not signalled', async () => {
    ctx = await openSupervisor();
    const a = await ctx.supervisor.launch({ id: 'a', command: SLEEP, args: ['300'], token: 'env' });
    const b = await ctx.supervisor.launch({ id: 'b', command: SLEEP, args: ['301'], token: 'env' });
    await ctx.supervisor.close();
    // b's record now names a token its process does not carry.
    const mb = manifestOf(ctx.stateDir, 'b');
    writeFileSync(join(ctx.stateDir, 'b', 'manifest.json'), JSON.stringify({ ...mb, token: 'f'.repeat(32) }), {
      mode: 0o600,
    });
    const events: unknown[] = [];
    const { supervisor, report } = await Supervisor.open({ stateDir: ctx.stateDir, onEvent: (e) => events.push(e) });
    try {
      // On a mismatch, the whole report and what recovery said of each manifest.
      const why = JSON.stringify({ report, events });
      expect(report.adopted, why).toEqual([{ id: 'a', pid: a.pid }]);
      expect(report.quarantined, why).toEqual([{ id: 'b', pid: b.pid, reason: 'mismatch', field: 'token' }]);
      await supervisor.stop('a', { graceMs: 2000 });
      expect(isGone(a.pid)).toBe(true);
      expect(isGone(b.pid)).toBe(false);
      await supervisor.release('b');
    } finally {
      await supervisor.close();
    }
    process.kill(b.pid, 'SIGKILL');
    await waitFor(() => isGone(b.pid), 5000, 'b to die');
  });

  it('an inspection that shows no argv (inside an execve) is not proven by the environment read after it: confirm waits for the argv, and a reopened supervisor adopts what it recorded', async () => {
    ctx = await openSupervisor();
    // Our own child, named by its pidfile once its argv reads empty, as /proc shows a process inside its
    // execve between the switch to its new memory and the layout of its argv (then it shows the program's
    // exe, and, a moment later, an environment with the token), for half a second instead of microseconds.
    const fixture = join(FIXTURES, 'empty-argv.py');
    const pidfile = join(ctx.root, 'late.pid');
    const args = [fixture, '30', MARKER, pidfile, '0.5'];
    const inst = await ctx.supervisor.launch({
      id: 'late',
      command: PYTHON,
      args,
      token: 'env',
      pid: { file: pidfile },
      launcherExits: false,
      confirmTimeoutMs: 10_000,
    });
    expect(inst.pid).toBe(Number(readFileSync(pidfile, 'utf8')));
    // Recorded from an inspection that shows the argv, not from the one inside the exec.
    expect(inst.identity.argv).toEqual([PYTHON, ...args]);
    await ctx.supervisor.close();
    const { supervisor, report } = await Supervisor.open({ stateDir: ctx.stateDir, onEvent: () => {} });
    try {
      // Verified as recorded: not repaired (an argv that "changed" from none) nor quarantined.
      expect(report, JSON.stringify(report)).toMatchObject({
        adopted: [{ id: 'late', pid: inst.pid }],
        repaired: [],
        quarantined: [],
      });
      await supervisor.stop('late', { graceMs: 2000 });
      expect(isGone(inst.pid)).toBe(true);
    } finally {
      await supervisor.close();
    }
  });

  it('in an instance cgroup too: confirmed by its environment, stopped with its cgroup', async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    ctx = await openSupervisor({ cgroup: { root: CGROUP_ROOT } });
    const inst = await ctx.supervisor.launch({ id: 'c', command: SLEEP, args: ['300'], token: 'env' });
    expect(inst.cgroup).not.toBeNull();
    expect(inst.identity.argv).toEqual([SLEEP, '300']);
    await ctx.supervisor.stop('c', { graceMs: 2000 });
    expect(isGone(inst.pid)).toBe(true);
    // The instance's own cgroup is gone with it (the supervisor's goes when it closes).
    expect(existsSync(inst.cgroup!)).toBe(false);
  });

  it('a launcher (pid: { file }) passes the token on in the environment; only the confirmed target must run the program', async () => {
    ctx = await openSupervisor();
    const pidfile = join(ctx.root, 'sleep.pid');
    const inst = await ctx.supervisor.launch({
      id: 'l',
      command: '/bin/sh',
      args: ['-c', `( exec ${SLEEP} 300 ) & echo $! > ${pidfile}`],
      pid: { file: pidfile },
      executable: SLEEP,
      token: 'env',
    });
    expect(inst.identity.argv).toEqual([SLEEP, '300']);
    expect(inst.pid).toBe(Number(readFileSync(pidfile, 'utf8')));
    await ctx.supervisor.stop('l', { graceMs: 2000 });
    expect(isGone(inst.pid)).toBe(true);
  });

  it('an interrupted launch is recovered by its environment from one scan; same-program bystanders are left alone', async () => {
    ctx = await openSupervisor();
    await ctx.supervisor.close();
    const dir = join(ctx.root, 'crash');
    mkdirSync(dir);
    // Bystanders running the very program: one without a token, one with another's.
    strangers.push(cpSpawn(SLEEP, ['30'], { stdio: 'ignore' }));
    strangers.push(cpSpawn(SLEEP, ['30'], { stdio: 'ignore', env: { ...process.env, CUSTODY_TOKEN: 'e'.repeat(32) } }));
    // A supervisor in another process, SIGKILLed while its child is still the shell that will exec into sleep.
    // The launcher execs once the test opens this FIFO for writing (after the kill): it forks nothing
    // meanwhile, and it execs at once then, however loaded the machine.
    const gate = join(dir, 'go');
    execFileSync('mkfifo', [gate]);
    const openGate = () => {
      try {
        closeSync(openSync(gate, fsc.O_WRONLY | fsc.O_NONBLOCK));
        return true;
      } catch {
        return false; // ENXIO: no reader (yet, or any more)
      }
    };
    const script = `
      const { Supervisor } = await import(${JSON.stringify(join(packageRoot, 'dist', 'index.js'))});
      const { writeFileSync } = await import('node:fs');
      const { supervisor } = await Supervisor.open({ stateDir: ${JSON.stringify(ctx.stateDir)}, onEvent: () => {} });
      writeFileSync(${JSON.stringify(join(dir, 'started'))}, '');
      await supervisor.launch({ id: 'vm', command: '/bin/sh', args: ['-c', 'read _ < "$1"; exec ${SLEEP} 30', 'launcher', ${JSON.stringify(gate)}],
        executable: ${JSON.stringify(SLEEP)}, token: 'env', confirmTimeoutMs: 10000 });`;
    const holder = cpSpawn(process.execPath, ['--input-type=module', '-e', script], { stdio: 'ignore' });
    strangers.push(holder);
    const launcher = await waitFor(
      // Found by its gate's path: the other backend's worker may run this very launch at the same time.
      () => processesWithMarker(gate).find((p) => p.cmd.startsWith('/bin/sh') && p.ppid === holder.pid),
      10_000,
      'the launch to start',
    );
    holder.kill('SIGKILL');
    await waitFor(() => holder.exitCode !== null || holder.signalCode !== null, 5000, 'the holder to die');
    expect(openGate()).toBe(true);
    const { supervisor, report } = await Supervisor.open({ stateDir: ctx.stateDir, onEvent: () => {} });
    try {
      expect(report.adopted, JSON.stringify(report)).toEqual([
        expect.objectContaining({ id: 'vm', pid: launcher.pid, reason: 'starting' }),
      ]);
      expect(inspect(launcher.pid).argv).toEqual([SLEEP, '30']);
      await supervisor.stop('vm', { graceMs: 2000 });
      expect(isGone(launcher.pid)).toBe(true);
      for (const s of strangers.slice(0, 2)) expect(isGone(s.pid!)).toBe(false);
    } finally {
      await supervisor.close();
    }
  }, 30_000);

  it('abandon ends a copy that double-forked away (found by its environment), never a same-program bystander', async () => {
    ctx = await openSupervisor();
    const bystander = cpSpawn(PYTHON, ['-c', 'import time; time.sleep(30)', MARKER], { stdio: 'ignore' });
    strangers.push(bystander);
    // The target forks a grandchild in a session of its own, whose parent exits: no longer a descendant, nor
    // in the instance's session; the same argv, and CUSTODY_TOKEN inherited.
    const forker = `import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        open(${JSON.stringify(join(ctx.root, 'away'))}, 'w').write(str(os.getpid()))
        time.sleep(30)
    os._exit(0)
time.sleep(30)`;
    let away = 0;
    const err = await ctx.supervisor
      .launch({
        id: 'f',
        command: PYTHON,
        args: ['-c', forker, MARKER],
        token: 'env',
        ready: async () => {
          away = await waitFor(
            () => {
              try {
                return Number(readFileSync(join(ctx.root, 'away'), 'utf8')) || null;
              } catch {
                return null;
              }
            },
            5000,
            'the copy',
          );
          throw new Error('not ready, ever');
        },
      })
      .catch((e: unknown) => e);
    expect(err).toMatchObject({ message: 'not ready, ever' });
    expect(isGone(away)).toBe(true);
    expect(isGone(bystander.pid!)).toBe(false);
    expect(ctx.events.filter((e) => e.type === 'warning')).toEqual([]);
  });

  it('an environment that may not be read is unprovable: confirm refuses it; recovery, of a running or an interrupted launch, quarantines it (field environ)', async (t) => {
    // Root reads every environment; run the supervisor as another uid (or as we are, when not root).
    const python = realpathSync('/usr/bin/python3');
    const dir = tmpDir('custody-env-unprovable-');
    try {
      const state = join(dir.path, 'state');
      const asUser = isRoot() ? ['setpriv', '--reuid=65534', '--regid=65534', '--clear-groups', '--'] : [];
      if (isRoot()) chownSync(dir.path, 65534, 65534);
      try {
        execFileSync(asUser[0] ?? python, [...asUser.slice(1), ...(asUser.length ? [python] : []), '-c', '0'], {
          stdio: 'ignore',
        });
      } catch {
        t.skip(true, `${python} cannot run as uid 65534 here`);
      }
      const argv = [...asUser, process.execPath, join(FIXTURES, 'env-unprovable.mjs'), state, python];
      const out = execFileSync(argv[0]!, argv.slice(1), {
        encoding: 'utf8',
        timeout: 30_000,
        cwd: '/',
        env: plainEnv(),
      });
      const r = JSON.parse(out.trim().split('\n').pop()!);
      expect(r.confirm).toMatchObject({
        code: 'ERR_CUSTODY_NOT_OURS',
        message: expect.stringMatching(/unprovable/),
        cleaned: true,
      });
      expect(r.quarantined).toEqual([expect.objectContaining({ id: 'late', reason: 'unprovable', field: 'environ' })]);
      expect(r).toMatchObject({ adopted: 0, alive: true, ended: true });
      expect(r.starting).toEqual({
        quarantined: [expect.objectContaining({ id: 'mid', reason: 'unprovable', field: 'environ' })],
        cleaned: 0,
        alive: true,
        ended: true,
      });
    } finally {
      dir.cleanup();
    }
  }, 40_000);
});
