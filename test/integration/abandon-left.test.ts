// A failed launch never leaves half of an instance (src/lifecycle/abandon.ts,
// attempt.ts), with real daemons no one here wrote. A daemon that forks
// without exec (QEMU -daemonize, a python daemon) runs its launcher's program,
// so a launch that names no `executable` cannot confirm it; the abandon ends
// it all the same, as the launch's own fork the pidfile names, and only then
// removes its socket and pidfile. A daemon that drops to a uid the launch did
// not declare (QEMU -runas nobody, dnsmasq, which drops to nobody by default)
// is refused and never signalled: the launch then ends with no further
// attempt, the declared paths stay for it, and the id is quarantined
// (`abandon-left`) until released. Skipped, saying why, where QEMU or dnsmasq
// is not installed (.ci/run installs both), and without root for what needs
// another uid.
import { spawn as cpSpawn, execFile } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, realpathSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it, type TestContext } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { type CustodyEvent, type LaunchSpec, Supervisor } from '../../src/index.js';
import { expectNoLeaks, processesWithMarker } from '../helpers/leaks.js';
import { endOwn, goneSince, isRoot, MARKER, startOf, waitFor } from '../helpers/procs.js';
import { openSupervisor, PYTHON } from '../helpers/supervisor.js';
import { installed, qemuArgs } from './programs.js';
import { plainEnv } from './plain-env.js';

const QEMU = installed('qemu-system-x86_64');
const DNSMASQ = installed('dnsmasq');
const CLI = join(import.meta.dirname, '..', '..', 'dist', 'cli', 'main.js');

/** Skips without the program, saying why (test/integration/qemu.test.ts is the one that insists on QEMU). */
function need(t: TestContext, path: string | null, what: string): string {
  t.skip(path === null, `${what} is not installed (.ci/run installs it)`);
  return path!;
}

/** Another uid is what these daemons drop to: only root can start one that does. */
function needRoot(t: TestContext): void {
  t.skip(!isRoot(), 'a daemon that drops to another uid needs root to start');
}

expectNoLeaks({ marker: MARKER });

let ctx: Awaited<ReturnType<typeof openSupervisor>> | undefined;
/** The daemons a test started through a launch, ended at cleanup by pid and start time if a test left one. */
const daemons: Array<{ pid: number; start: string | null }> = [];
afterEach(async () => {
  // And any other the launches started (each carries the marker): a test that failed may have left several.
  await endOwn([...daemons.splice(0), ...processesWithMarker(MARKER).map((p) => p.pid)]);
  await ctx?.dispose();
  ctx = undefined;
});

/** Polls a pidfile until it names a live process: its pid and start time, for the checks and the cleanup. */
async function namedBy(pidfile: string): Promise<{ pid: number; start: string | null }> {
  const pid = await waitFor(
    () => {
      try {
        return Number(readFileSync(pidfile, 'utf8')) || null;
      } catch {
        return null;
      }
    },
    20_000,
    `a pid in ${pidfile}`,
  );
  const named = { pid, start: startOf(pid) };
  daemons.push(named);
  return named;
}

/**
 * Launches a daemonized QEMU as `vm`, its QMP socket and pidfile in the test's dir, and lets it fail: what
 * the launch threw, and the process its pidfile named.
 */
async function failedQemuLaunch(qemu: string, extra: string[], spec: Partial<LaunchSpec>) {
  const c = ctx!;
  const qmp = join(c.root, 'vm.qmp');
  const pidfile = join(c.root, 'vm.pid');
  const named = namedBy(pidfile);
  const err = await c.supervisor
    .launch({
      id: 'vm',
      command: qemu,
      args: (tok) => qemuArgs(tok, qmp, ['-daemonize', '-pidfile', pidfile, ...extra]),
      pid: { file: pidfile },
      ready: { socket: qmp },
      env: plainEnv(),
      ...spec,
    })
    .catch((e: unknown) => e);
  return { err, qmp, pidfile, vm: await named };
}

/** A process's argv, [] when it has none (gone, or not exec'd yet). */
const procArgv = (pid: number) => {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').filter(Boolean);
  } catch {
    return [];
  }
};

const onlyOf = (events: CustodyEvent[], type: CustodyEvent['type']) => events.filter((e) => e.type === type);

/** `custody ls --json` of a state dir, as users run it (read-only, beside the supervisor that holds it). */
function ls(stateDir: string): Promise<Array<{ id: string; state: string; quarantine: unknown }>> {
  return new Promise((resolve, reject) => {
    execFile(
      process.execPath,
      [CLI, 'ls', '--state-dir', stateDir, '--json'],
      { env: { ...process.env, CUSTODY_BACKEND: backend.name }, timeout: 20_000 },
      (err, stdout) => (err ? reject(err) : resolve(JSON.parse(stdout).instances)),
    );
  });
}

describe(`an abandon never leaves half of an instance (${backend.name})`, () => {
  it('QEMU -daemonize without `executable`: confirm refuses the fork, and the abandon ends it before its paths go', async (t) => {
    const qemu = need(t, QEMU, 'qemu-system-x86_64');
    ctx = await openSupervisor();
    // QEMU's -daemonize parent exits once its fork has initialized: well within the bound on a loaded machine.
    const { err, qmp, pidfile, vm } = await failedQemuLaunch(qemu, [], { confirmTimeoutMs: 5000 });
    // The error stays what it is: the fork runs QEMU, like its launcher, and is never recorded as the target.
    expect(err).toMatchObject({ code: 'ERR_CUSTODY_CONFIRM_TIMEOUT' });
    expect(onlyOf(ctx.events, 'confirm')).toEqual([]);
    expect(onlyOf(ctx.events, 'abandon')).toEqual([
      expect.objectContaining({ pids: expect.arrayContaining([vm.pid]) }),
    ]);
    expect(goneSince(vm.pid, vm.start)).toBe(true);
    expect([existsSync(qmp), existsSync(pidfile)]).toEqual([false, false]);
    expect(ctx.supervisor.list()).toEqual([]);
    expect(onlyOf(ctx.events, 'warning')).toEqual([]);
  }, 30_000);

  it('a python launcher whose daemon never execs: the fork the pidfile names is the launch’s, ended with it', async () => {
    ctx = await openSupervisor();
    const sock = join(ctx.root, 'py.sock');
    const pidfile = join(ctx.root, 'py.pid');
    // Double-forks without exec: the daemon binds its socket and writes the pidfile, then the launcher exits 0.
    const daemon = `import os, socket, sys, time
r, w = os.pipe()
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        s = socket.socket(socket.AF_UNIX)
        s.bind(${JSON.stringify(sock)})
        s.listen()
        open(${JSON.stringify(pidfile)}, 'w').write(str(os.getpid()))
        os.write(w, b'1')
        time.sleep(30)
    os._exit(0)
os.read(r, 1)`;
    const named = namedBy(pidfile);
    const err = await ctx.supervisor
      .launch({
        id: 'py',
        command: PYTHON,
        args: (tok) => ['-c', daemon, tok, MARKER],
        pid: { file: pidfile },
        ready: { socket: sock },
        confirmTimeoutMs: 1500,
      })
      .catch((e: unknown) => e);
    const py = await named;
    expect(err).toMatchObject({ code: 'ERR_CUSTODY_CONFIRM_TIMEOUT' });
    expect(onlyOf(ctx.events, 'abandon')).toEqual([
      expect.objectContaining({ pids: expect.arrayContaining([py.pid]) }),
    ]);
    expect(goneSince(py.pid, py.start)).toBe(true);
    expect([existsSync(sock), existsSync(pidfile)]).toEqual([false, false]);
    expect(ctx.supervisor.list()).toEqual([]);
  }, 30_000);

  it('QEMU -runas nobody: refused, never signalled, no retry; its socket and pidfile kept, the id quarantined until released', async (t) => {
    const qemu = need(t, QEMU, 'qemu-system-x86_64');
    needRoot(t);
    ctx = await openSupervisor();
    const { err, qmp, pidfile, vm } = await failedQemuLaunch(qemu, ['-runas', 'nobody'], {
      executable: qemu,
      attempts: 3,
      confirmTimeoutMs: 20_000,
    });
    expect(err).toMatchObject({
      code: 'ERR_CUSTODY_NOT_OURS',
      message: expect.stringMatching(
        new RegExp(`runs as another uid.*abandon left pid ${vm.pid} \\(uid\\).*quarantined.*custody release vm`),
      ),
    });
    // One attempt: another would have removed the paths the first left running.
    expect(onlyOf(ctx.events, 'launch')).toHaveLength(1);
    expect(onlyOf(ctx.events, 'abandon')).toEqual([]);
    expect(onlyOf(ctx.events, 'quarantine')).toEqual([
      expect.objectContaining({ id: 'vm', reason: 'abandon-left', field: String(vm.pid) }),
    ]);
    expect(goneSince(vm.pid, vm.start)).toBe(false);
    expect([existsSync(qmp), existsSync(pidfile)]).toEqual([true, true]);
    expect(ctx.supervisor.list()).toEqual([
      expect.objectContaining({ id: 'vm', status: 'quarantined', reason: 'abandon-left', field: String(vm.pid) }),
    ]);
    await expect(
      ctx.supervisor.launch({ id: 'vm', command: qemu, args: (tok) => [tok], pid: { file: pidfile } }),
    ).rejects.toMatchObject({ code: 'ERR_CUSTODY_QUARANTINED' });
    // The operator's part: what was left is ended (by the test, which started it), the quarantine released,
    // the kept paths removed.
    await endOwn(daemons.splice(0));
    await ctx.supervisor.release('vm');
    expect(ctx.supervisor.list()).toEqual([]);
    rmSync(qmp);
    rmSync(pidfile);
    expect(readdirSync(ctx.root).filter((n) => n !== 'state')).toEqual([]);
  }, 30_000);

  it('dnsmasq forking (drops to nobody): quarantined on disk, shown by custody ls, kept across a reopen, cleared by release', async (t) => {
    const dnsmasq = need(t, DNSMASQ, 'dnsmasq');
    needRoot(t);
    t.skip(!existsSync(CLI), 'dist/ is not built (npm run build:ts)');
    ctx = await openSupervisor();
    const pidfile = join(ctx.root, 'dns.pid');
    const named = namedBy(pidfile);
    const err = await ctx.supervisor
      .launch({
        id: 'dns',
        command: dnsmasq,
        // No DNS port, no DHCP, nothing read: it only forks, drops to nobody and idles. The lease file it
        // never writes carries the token and the marker.
        args: (tok) => [
          '--port=0',
          '--no-resolv',
          '--no-hosts',
          '--conf-file=/dev/null',
          `--pid-file=${pidfile}`,
          `--dhcp-leasefile=${join(ctx!.root, `${MARKER}-${tok}.leases`)}`,
        ],
        pid: { file: pidfile },
        attempts: 2,
        // dnsmasq is not under test: no sanitizer preload (as nobody it could not even write its reports).
        env: plainEnv(),
      })
      .catch((e: unknown) => e);
    const dns = await named;
    expect(err).toMatchObject({
      code: 'ERR_CUSTODY_NOT_OURS',
      message: expect.stringMatching(new RegExp(`abandon left pid ${dns.pid} \\(uid\\).*custody release dns`)),
    });
    expect(onlyOf(ctx.events, 'launch')).toHaveLength(1);
    expect(goneSince(dns.pid, dns.start)).toBe(false);
    expect(existsSync(pidfile)).toBe(true);
    const quarantine = { reason: 'abandon-left', field: String(dns.pid) };
    expect(await ls(ctx.stateDir)).toEqual([
      expect.objectContaining({ id: 'dns', state: 'quarantined', quarantine: expect.objectContaining(quarantine) }),
    ]);
    // Persisted: a supervisor opened after this one finds it quarantined, and nothing is signalled.
    await ctx.supervisor.close();
    const reopened = await Supervisor.open({ stateDir: ctx.stateDir, onEvent: () => {} });
    try {
      expect(reopened.report.quarantined).toEqual([expect.objectContaining({ id: 'dns', ...quarantine })]);
      expect(goneSince(dns.pid, dns.start)).toBe(false);
      await endOwn(daemons.splice(0));
      await reopened.supervisor.release('dns');
      expect(reopened.supervisor.list()).toEqual([]);
    } finally {
      await reopened.supervisor.close();
    }
    rmSync(pidfile);
    expect(readdirSync(ctx.root).filter((n) => n !== 'state')).toEqual([]);
  }, 30_000);
  it("env mode: another uid's process of the launched program counts only if its environment carries the token", async (t) => {
    needRoot(t);
    // Not a python under /root: nobody must be able to run it.
    const python = realpathSync('/usr/bin/python3');
    ctx = await openSupervisor();
    const started: Array<{ pid: number; start: string | null }> = [];
    /** The launched program as nobody, with or without the launch's token in its environment. */
    const asNobody = async (token: string | null) => {
      const env = { ...plainEnv(), ...(token ? { CUSTODY_TOKEN: token } : {}) };
      const child = cpSpawn(
        'setpriv',
        ['--reuid=65534', '--regid=65534', '--clear-groups', '--', python, '-c', 'import time; time.sleep(30)', MARKER],
        { stdio: 'ignore', env },
      );
      child.unref();
      const pid = child.pid!;
      await waitFor(() => procArgv(pid)[0] === python, 5000, 'the process as nobody');
      const own = { pid, start: startOf(pid) };
      started.push(own);
      daemons.push(own);
      return own;
    };
    const launch = (id: string, withToken: boolean) =>
      ctx!.supervisor
        .launch({
          id,
          command: python,
          args: ['-c', 'import time; time.sleep(30)', MARKER],
          token: 'env',
          executable: python,
          ready: async (inst) => {
            await asNobody(withToken ? inst.token : null);
            throw new Error('not ready, ever');
          },
        })
        .catch((e: unknown) => e);
    // The same program, without the token: no reason to keep anything.
    expect(await launch('plain', false)).toMatchObject({ message: 'not ready, ever' });
    expect(ctx.supervisor.list()).toEqual([]);
    // With it: never signalled, and the id is quarantined.
    const err = await launch('carried', true);
    const carrier = started[1]!;
    expect(err).toMatchObject({ message: expect.stringContaining(`abandon left pid ${carrier.pid} (uid)`) });
    expect(ctx.supervisor.list()).toEqual([
      expect.objectContaining({ id: 'carried', status: 'quarantined', field: String(carrier.pid) }),
    ]);
    expect(started.map((s) => goneSince(s.pid, s.start))).toEqual([false, false]);
    await endOwn(daemons.splice(0));
    await ctx.supervisor.release('carried');
  }, 30_000);
});
