// ready: 'notify' with a launcher that forks its daemon and names it with systemd's own tool,
// `daemon & systemd-notify --ready --pid=$!` (systemd's NotifyAccess= semantics): the daemon carries no token
// (the launcher's argv has it) and is taken for being a member of the instance, a child of the launcher or a
// process in its cgroup; the launcher then exits freely. A pid named that is no member is refused and never
// signalled. As root, systemd-notify sends with the named pid's credentials (root may name any pid), so the
// datagram comes from the daemon as the kernel tells it; as another uid it comes from systemd-notify itself.
// Each test says what each does. Recovery after an agent's SIGKILL is tested on both backends.
import { type ChildProcess, spawn as cpSpawn, execFileSync } from 'node:child_process';
import { chmodSync, existsSync, mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import {
  Supervisor,
  type CustodyEvent,
  type CustodyEventOf,
  type CustodyEventType,
  type LaunchSpec,
} from '../../src/index.js';
import { CGROUP_ROOT, CGROUP_SKIP, expectNoCgroupsLeft, procsOf } from '../helpers/cgroup.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { processesWithMarker } from '../helpers/leaks.js';
import {
  endOwn,
  exited,
  goneFrom,
  isGone,
  isRoot,
  killAndWait,
  loggedSignals,
  MARKER,
  signalLoggerArgs,
  tmpDir,
  untilReady,
  waitFor,
} from '../helpers/procs.js';
import { FIXTURES, openSupervisor, PERL, PYTHON } from '../helpers/supervisor.js';

const cleanups = cleanupAfterEach({ marker: MARKER });
expectNoCgroupsLeft();

const native = backend.name === 'native';
const DAEMON = join(FIXTURES, 'handoff-daemon.py');
const AGENT = join(FIXTURES, 'handoff-agent.mjs');
const has = (tool: string) => {
  try {
    execFileSync('sh', ['-c', `command -v ${tool}`], { stdio: 'ignore' });
    return true;
  } catch {
    return false;
  }
};
const HAS_NOTIFY = has('systemd-notify');
const NO_TOOL = HAS_NOTIFY ? null : 'systemd-notify is not installed (.ci/run installs it: apt-get install systemd)';

// The launchers: sh -c SCRIPT <token> PYTHON DAEMON PIDFILE LOG MARKER [GATE...], so "$1".."$5" run the daemon.
/** Waits (at most 20 s) until the daemon wrote its pid: named past its exec, with its signal handlers. */
const WAIT_PID = 'for i in $(seq 1000); do [ -s "$3" ] && break; sleep 0.02; done';
/** Waits (at most 20 s) until the file "$n" exists. */
const gate = (n: number) => `for i in $(seq 1000); do [ -e "$${n}" ] && break; sleep 0.02; done`;
/** Forks the daemon (a child of the launcher), names it, exits. */
const FORKS = `"$1" "$2" "$3" "$4" "$5" & ${WAIT_PID}; systemd-notify --ready --pid="$(cat "$3")"`;
/** Starts the daemon in a session of its own, its parent gone at once (setsid -f), names it, exits. */
const DETACHES = `setsid -f "$1" "$2" "$3" "$4" "$5"; ${WAIT_PID}; systemd-notify --ready --pid="$(cat "$3")"`;

/** The daemon's files in a test's dir: the pid it writes once it runs, the signals it got. */
function daemonFiles(dir: string) {
  return { dir, pidfile: join(dir, 'daemon.pid'), log: join(dir, 'daemon.log') };
}
type Files = ReturnType<typeof daemonFiles>;

const daemonArgv = (f: Files) => [PYTHON, DAEMON, f.pidfile, f.log, MARKER];
const daemonPid = (f: Files) => Number(readFileSync(f.pidfile, 'utf8'));

function spec(id: string, script: string, f: Files, gates: string[] = []): LaunchSpec {
  return {
    id,
    command: '/bin/sh',
    args: (t) => ['-c', script, t, ...daemonArgv(f), ...gates],
    ready: 'notify',
    readyTimeoutMs: 20_000,
  };
}

const of = <T extends CustodyEventType>(events: CustodyEvent[], id: string, type: T) =>
  events.filter((e): e is CustodyEventOf<T> => e.id === id && e.type === type);
const manifestOf = (stateDir: string, id: string) =>
  JSON.parse(readFileSync(join(stateDir, id, 'manifest.json'), 'utf8')) as Record<string, unknown>;

/** A supervisor on a fresh state dir, disposed (what runs stopped) after the test. */
async function supervisor(extra: Parameters<typeof openSupervisor>[0] = {}) {
  const ctx = await openSupervisor(extra);
  cleanups.push(() => ctx.dispose());
  return ctx;
}

/** Opens a state dir as the next agent would; closed after the test, what runs stopped first. */
async function reopen(stateDir: string, options: { cgroup?: { root: string } } = {}, events: CustodyEvent[] = []) {
  const opened = await Supervisor.open({ stateDir, ...options, onEvent: (e) => events.push(e) });
  cleanups.push(async () => {
    for (const i of opened.supervisor.list())
      if (i.status === 'running') await opened.supervisor.stop(i.id, { graceMs: 1000 }).catch(() => {});
    await opened.supervisor.close();
  });
  return opened;
}

describe.skipIf(!native || !!NO_TOOL)(
  `a launcher that names its daemon with systemd-notify --pid (${backend.name})`,
  () => {
    it('its forked daemon, no token, is the target (a member by descent); the launcher exits freely', async () => {
      const ctx = await supervisor();
      const f = daemonFiles(ctx.root);
      const inst = await ctx.supervisor.launch(spec('d', FORKS, f));
      const spawned = of(ctx.events, 'd', 'spawn')[0]!.pid as number;
      expect(inst.pid).toBe(daemonPid(f));
      expect(inst.pid).not.toBe(spawned);
      expect(inst.identity).toMatchObject({ pid: inst.pid, argv: daemonArgv(f) });
      expect(inst.identity.argv.join(' ')).not.toContain(inst.token);
      const confirms = of(ctx.events, 'd', 'confirm');
      expect(confirms.map((e) => e.pid)).toEqual([spawned, inst.pid]);
      expect(confirms[1]!.message).toMatch(/^MAINPID=\d+ .*a member of the instance \(by descent\)/);
      expect(of(ctx.events, 'd', 'warning')).toEqual([]);
      await waitFor(() => goneFrom(spawned), 5000, 'the launcher to exit');
      expect(ctx.supervisor.list()).toEqual([expect.objectContaining({ id: 'd', status: 'running', pid: inst.pid })]);
      expect(manifestOf(ctx.stateDir, 'd')).toMatchObject({
        state: 'running',
        handedOff: true,
        identity: { pid: inst.pid, argv: daemonArgv(f) },
      });
      await ctx.supervisor.stop('d', { graceMs: 2000 });
      expect(isGone(inst.pid)).toBe(true);
      expect(loggedSignals(f.log)).toEqual(['SIGTERM']);
    });

    it('in an instance cgroup, a daemon in a session of its own, parented to nobody of the launch, is a member by cgroup', async (t) => {
      t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
      const ctx = await supervisor({ cgroup: { root: CGROUP_ROOT } });
      const f = daemonFiles(ctx.root);
      const inst = await ctx.supervisor.launch(spec('d', DETACHES, f));
      expect(inst.pid).toBe(daemonPid(f));
      expect(inst.cgroup).not.toBeNull();
      expect(procsOf(inst.cgroup!)).toContain(inst.pid);
      expect(of(ctx.events, 'd', 'confirm')[1]!.message).toMatch(/a member of the instance \(by cgroup\)/);
      expect(of(ctx.events, 'd', 'warning')).toEqual([]);
      await ctx.supervisor.stop('d', { graceMs: 2000 });
      expect(isGone(inst.pid)).toBe(true);
      expect(loggedSignals(f.log)).toEqual(['SIGTERM']);
      expect(existsSync(inst.cgroup!)).toBe(false);
    });

    it('without a cgroup, that daemon is no member: refused, never signalled', async () => {
      // No subreaper: the daemon goes to init, which reaps it once the test ends it.
      const ctx = await supervisor({ subreaper: false });
      const f = daemonFiles(ctx.root);
      const result = await ctx.supervisor.launch(spec('d', DETACHES, f)).catch((e: unknown) => e);
      const daemon = daemonPid(f);
      cleanups.push(() => endOwn([daemon]));
      const spawned = of(ctx.events, 'd', 'spawn')[0]!.pid as number;
      const warnings = of(ctx.events, 'd', 'warning').map((e) => e.message);
      if (isRoot()) {
        // The datagram is the daemon's, by the kernel's word: a stranger's READY=1 and MAINPID=, both ignored.
        expect(result).toMatchObject({ code: 'ERR_CUSTODY_LAUNCH_EXITED' });
        expect(warnings).toEqual([
          expect.stringMatching(new RegExp(`ignored: pid ${daemon} is not taken for the instance: .*launch token`)),
        ]);
      } else {
        // systemd-notify's own, a member: READY=1 counts for the launcher, MAINPID= is refused.
        expect(result).toMatchObject({ pid: spawned });
        expect(warnings).toEqual([
          expect.stringMatching(
            new RegExp(`MAINPID=${daemon}: pid ${daemon} is not taken for the instance: .*launch token`),
          ),
        ]);
        await waitFor(() => ctx.supervisor.list()[0]?.status !== 'running', 10_000, 'the launcher to exit');
      }
      expect(isGone(daemon)).toBe(false);
      expect(loggedSignals(f.log)).toEqual([]);
    });

    it('MAINPID= naming no member is refused, the bystander never signalled: one carrying the token, and pid 1', async () => {
      const ctx = await supervisor();
      const log = join(ctx.root, 'bystander.log');
      const go = join(ctx.root, 'go');
      let bystander: ChildProcess | undefined;
      // The launcher names the bystander, then pid 1, then says READY=1 (its own) and stays.
      const script = `${gate(2)}; systemd-notify --pid="$1"; systemd-notify --pid=1; systemd-notify --ready; sleep 30`;
      const launching = ctx.supervisor.launch({
        id: 'h',
        command: '/bin/sh',
        args: (t) => {
          bystander = cpSpawn(PYTHON, [...signalLoggerArgs(log, false), t], { stdio: ['ignore', 'pipe', 'ignore'] });
          return ['-c', script, t, String(bystander.pid), go, MARKER];
        },
        ready: 'notify',
        readyTimeoutMs: 20_000,
      });
      cleanups.push(() => bystander && killAndWait(bystander));
      await untilReady(bystander!.stdout!);
      writeFileSync(go, '');
      const inst = await launching;
      const b = bystander!.pid!;
      // The target stays the launcher. As root each datagram naming a pid comes from that pid (refused as a
      // sender); as another uid from systemd-notify (a member), whose MAINPID= is refused.
      expect(inst.pid).toBe(of(ctx.events, 'h', 'spawn')[0]!.pid);
      expect(of(ctx.events, 'h', 'confirm')).toHaveLength(1);
      expect(of(ctx.events, 'h', 'warning').map((e) => e.message)).toEqual([
        expect.stringMatching(new RegExp(`pid ${b} is not taken for the instance: its argv is not the launched argv`)),
        expect.stringMatching(/pid 1 is not taken for the instance: it is pid 1/),
      ]);
      await ctx.supervisor.stop('h', { graceMs: 2000 });
      expect(isGone(inst.pid)).toBe(true);
      expect(isGone(b)).toBe(false);
      expect(loggedSignals(log)).toEqual([]);
    });

    it.runIf(isRoot() && has('setpriv'))(
      'a daemon its launcher started as another uid is handed off: that uid is recorded, and the next supervisor adopts it',
      async () => {
        const ctx = await supervisor();
        // Where uid 65534 may write its pid: the test's dir is root's.
        const shared = join(ctx.root, 'shared');
        mkdirSync(shared);
        chmodSync(shared, 0o777);
        chmodSync(ctx.root, 0o711);
        const pidfile = join(shared, 'daemon.pid');
        const daemon =
          'open(my $f, ">", "$ARGV[0].tmp") or die; print $f $$; close $f; rename("$ARGV[0].tmp", $ARGV[0]) or die; sleep 60';
        const script = `setpriv --reuid=65534 --regid=65534 --clear-groups "$1" -e "$2" -- "$3" "$4" & ${WAIT_PID}; systemd-notify --ready --pid="$(cat "$3")"`;
        const inst = await ctx.supervisor.launch({
          id: 'u',
          command: '/bin/sh',
          args: (t) => ['-c', script, t, PERL, daemon, pidfile, MARKER],
          ready: 'notify',
          readyTimeoutMs: 20_000,
        });
        expect(inst.pid).toBe(Number(readFileSync(pidfile, 'utf8')));
        expect(inst.identity.uid).toBe(65534);
        expect(manifestOf(ctx.stateDir, 'u')).toMatchObject({ handedOff: true, uid: 65534, identity: { uid: 65534 } });
        await ctx.supervisor.close();
        const { supervisor: next, report } = await reopen(ctx.stateDir);
        expect(report).toMatchObject({ adopted: [{ id: 'u', pid: inst.pid }], repaired: [], quarantined: [] });
        await next.stop('u', { graceMs: 2000 });
        expect(isGone(inst.pid)).toBe(true);
      },
    );

    it("a daemon named before its exec, exec'd before READY=1: recorded as it runs now, by its pidfs id", async () => {
      const ctx = await supervisor();
      const f = daemonFiles(ctx.root);
      const [exec, ready] = [join(ctx.root, 'exec'), join(ctx.root, 'ready')];
      // The subshell is named while it still runs the launcher's shell; it execs the daemon once `exec` exists.
      const script = `( ${gate(6)}; exec "$1" "$2" "$3" "$4" "$5" ) & systemd-notify --pid=$!; ${WAIT_PID}; ${gate(7)}; systemd-notify --ready`;
      const launching = ctx.supervisor.launch(spec('d', script, f, [exec, ready]));
      const named = await waitFor(() => of(ctx.events, 'd', 'confirm')[1], 10_000, 'the hand-off');
      expect(named.identity?.argv).toContain('/bin/sh');
      writeFileSync(exec, '');
      await waitFor(() => existsSync(f.pidfile), 10_000, 'the exec');
      writeFileSync(ready, '');
      const inst = await launching;
      expect(inst.pid).toBe(named.pid);
      expect(inst.pid).toBe(daemonPid(f));
      expect(inst.identity.argv).toEqual(daemonArgv(f));
      expect(manifestOf(ctx.stateDir, 'd')).toMatchObject({ handedOff: true, identity: { argv: daemonArgv(f) } });
      expect(of(ctx.events, 'd', 'warning').map((e) => e.message)).toEqual([
        expect.stringMatching(/changed its argv and exe since MAINPID= named it/),
      ]);
      await ctx.supervisor.stop('d', { graceMs: 2000 });
      expect(loggedSignals(f.log)).toEqual(['SIGTERM']);
    });

    it("a daemon named before its exec, exec'd once running: the next supervisor repairs it by its pidfs id (renamed)", async () => {
      const ctx = await supervisor();
      const f = daemonFiles(ctx.root);
      const exec = join(ctx.root, 'exec');
      const script = `( ${gate(6)}; exec "$1" "$2" "$3" "$4" "$5" ) & systemd-notify --ready --pid=$!`;
      const inst = await ctx.supervisor.launch(spec('d', script, f, [exec]));
      // Recorded as named: a fork of the launcher.
      expect(inst.identity.argv).toContain(inst.token);
      await ctx.supervisor.close();
      writeFileSync(exec, '');
      await waitFor(() => existsSync(f.pidfile), 10_000, 'the exec');
      expect(daemonPid(f)).toBe(inst.pid);
      const events: CustodyEvent[] = [];
      const { supervisor: next, report } = await reopen(ctx.stateDir, {}, events);
      expect(report).toMatchObject({ adopted: [], quarantined: [] });
      expect(report.repaired).toEqual([{ id: 'd', pid: inst.pid, reason: 'renamed', field: 'exe' }]);
      expect(of(events, 'd', 'repair')[0]!.message).toMatch(/exec'd since it was recorded .*MAINPID= named/);
      expect(manifestOf(ctx.stateDir, 'd')).toMatchObject({ handedOff: true, identity: { argv: daemonArgv(f) } });
      await next.stop('d', { graceMs: 2000 });
      expect(isGone(inst.pid)).toBe(true);
      expect(loggedSignals(f.log)).toEqual(['SIGTERM']);
    });
  },
);

/** The agent fixture (native) running `script` (sh -c script <token> ...args); SIGKILLed at the test's end at the latest. */
function startAgent(stateDir: string, cgroupRoot: string | null, script: string, args: string[]) {
  const child = cpSpawn(process.execPath, [AGENT, stateDir, cgroupRoot ?? '-', script, ...args], {
    env: { ...process.env, CUSTODY_BACKEND: 'native' },
    stdio: ['ignore', 'pipe', 'inherit'],
  });
  cleanups.push(() => killAndWait(child));
  return { child, kill: () => killAndWait(child) };
}

/** The agent fixture, once it runs the hand-off (FORKS): what it printed, and its SIGKILL. */
async function agent(stateDir: string, cgroupRoot: string | null, f: Files) {
  const { child, kill } = startAgent(stateDir, cgroupRoot, FORKS, daemonArgv(f));
  const line = await new Promise<string>((resolve, reject) => {
    let seen = '';
    child.stdout!.on('data', (d: Buffer) => {
      seen += String(d);
      if (seen.includes('\n')) resolve(seen.slice(0, seen.indexOf('\n')));
    });
    void exited(child).then(() => reject(new Error(`the agent exited (${child.exitCode}) before it launched`)));
  });
  const printed = JSON.parse(line) as { pid: number; spawned: number; cgroup: string | null };
  return { ...printed, kill };
}

describe.skipIf(!!NO_TOOL)(`an agent SIGKILLed while it runs a handed-off daemon (reopened on ${backend.name})`, () => {
  async function afterKill(cgroup: boolean) {
    const dir = tmpDir('custody-handoff-');
    cleanups.push(dir.cleanup);
    const f = daemonFiles(dir.path);
    const stateDir = join(dir.path, 'state');
    const first = await agent(stateDir, cgroup ? CGROUP_ROOT : null, f);
    expect(first.pid).toBe(daemonPid(f));
    await first.kill();
    await waitFor(() => goneFrom(first.spawned), 5000, 'the launcher to exit');
    const events: CustodyEvent[] = [];
    const options = cgroup ? { cgroup: { root: CGROUP_ROOT } } : {};
    const opened = await reopen(stateDir, options, events);
    return { ...opened, first, f, events };
  }

  it(`without a cgroup: ${native ? 'adopted by its pidfs id' : 'quarantined (no pidfs id, no cgroup: nothing proves it), never signalled'}`, async () => {
    const { supervisor: sup, report, first, f } = await afterKill(false);
    if (native) {
      expect(report.adopted).toEqual([{ id: 'd', pid: first.pid }]);
      await sup.stop('d', { graceMs: 2000 });
      expect(isGone(first.pid)).toBe(true);
      expect(loggedSignals(f.log)).toEqual(['SIGTERM']);
    } else {
      expect(report.adopted).toEqual([]);
      expect(report.quarantined).toEqual([{ id: 'd', pid: first.pid, reason: 'mismatch', field: 'token' }]);
      cleanups.push(() => endOwn([first.pid]));
      expect(isGone(first.pid)).toBe(false);
      expect(loggedSignals(f.log)).toEqual([]);
    }
  });

  it(`killed after the hand-off, before READY=1: its record names the daemon, ${native ? 'adopted' : 'quarantined on js'}`, async () => {
    const dir = tmpDir('custody-handoff-');
    cleanups.push(dir.cleanup);
    const f = daemonFiles(dir.path);
    const stateDir = join(dir.path, 'state');
    const go = join(dir.path, 'go');
    // The launcher names the daemon, then waits for `go` before its READY=1.
    const script = `"$1" "$2" "$3" "$4" "$5" & ${WAIT_PID}; systemd-notify --pid="$(cat "$3")"; ${gate(6)}; systemd-notify --ready`;
    const first = startAgent(stateDir, null, script, [...daemonArgv(f), go]);
    const recorded = await waitFor(
      () => {
        try {
          const m = manifestOf(stateDir, 'd');
          return m.handedOff === true && m;
        } catch {
          return null;
        }
      },
      20_000,
      'the hand-off recorded',
    );
    const pid = daemonPid(f);
    expect(recorded).toMatchObject({ state: 'starting', identity: { pid } });
    await first.kill();
    // Its READY=1 now goes to no socket: it fails, and the launcher exits.
    writeFileSync(go, '');
    const launchers = () => processesWithMarker(MARKER).filter((p) => p.cmd.startsWith('/bin/sh'));
    await waitFor(() => launchers().length === 0, 10_000, 'the launcher to exit');
    const { supervisor: sup, report } = await reopen(stateDir);
    if (native) {
      expect(report.adopted).toEqual([{ id: 'd', pid, reason: 'starting' }]);
      expect(manifestOf(stateDir, 'd')).toMatchObject({ state: 'running', handedOff: true });
      await sup.stop('d', { graceMs: 2000 });
      expect(isGone(pid)).toBe(true);
      expect(loggedSignals(f.log)).toEqual(['SIGTERM']);
    } else {
      expect(report.quarantined).toEqual([{ id: 'd', pid, reason: 'mismatch', field: 'token' }]);
      cleanups.push(() => endOwn([pid]));
      expect(loggedSignals(f.log)).toEqual([]);
    }
  });

  it('in its instance cgroup: adopted', async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    const { supervisor: sup, report, first, f } = await afterKill(true);
    expect(first.cgroup).not.toBeNull();
    expect(report.adopted).toEqual([{ id: 'd', pid: first.pid }]);
    expect(sup.list()).toEqual([expect.objectContaining({ id: 'd', status: 'running', cgroup: first.cgroup })]);
    await sup.stop('d', { graceMs: 2000 });
    expect(isGone(first.pid)).toBe(true);
    expect(loggedSignals(f.log)).toEqual(['SIGTERM']);
    expect(existsSync(first.cgroup!)).toBe(false);
  });
});
