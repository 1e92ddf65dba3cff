/**
 * src/lifecycle/launch.ts, confirm.ts and abandon.ts on their own: the attempt's functions called directly, without a Supervisor (the behavioural
 * suites reach them only through it). The confirm decider is a table; the rest runs real processes.
 */
import { randomBytes } from 'node:crypto';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { abandon } from '../../src/lifecycle/abandon.js';
import { confirm, type ConfirmFacts, decideConfirm } from '../../src/lifecycle/confirm.js';
import { type Attempt, childEnv, claimOf, type LaunchSpec, obtainPid, startChild } from '../../src/lifecycle/launch.js';
import { TOKEN_VAR } from '../../src/process/ownership.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { isGone, MARKER, tmpDir } from '../helpers/procs.js';
import { PERL } from '../helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });

function attempt(more: Partial<Attempt> = {}): Attempt {
  const token = randomBytes(16).toString('hex');
  return {
    id: 'unit',
    token,
    tokenMode: 'argv',
    command: PERL,
    argv: ['-e', 'sleep 30', MARKER, token],
    uid: null,
    expect: [],
    executable: null,
    executablePath: null,
    paths: [],
    pidSpec: 'child',
    launcherExits: true,
    child: null,
    session: null,
    target: null,
    cgroup: null,
    identity: null,
    stderrTail: () => undefined,
    stdoutTail: () => undefined,
    notify: null,
    ...more,
  };
}
const specOf = (a: Attempt, more: Partial<LaunchSpec> = {}): LaunchSpec => ({
  id: a.id,
  command: a.command,
  args: a.argv,
  stderr: 'pipe',
  ...more,
});
const noEvents = () => {};

describe('decideConfirm', () => {
  const facts = (more: Partial<ConfirmFacts>): ConfirmFacts => ({
    own: true,
    gone: false,
    why: null,
    argvEmpty: false,
    spins: 0,
    timedOut: false,
    ...more,
  });
  const cases: Array<[string, Partial<ConfirmFacts>, unknown]> = [
    ['it carries the marks: confirmed', {}, { do: 'confirmed' }],
    ['gone before it carried them: exited', { gone: true, why: 'token' }, { do: 'exited' }],
    ['a reported pid of another uid: not ours, at once', { own: false, why: 'uid' }, { do: 'not-ours', why: 'uid' }],
    ['a reported pid 1: not ours', { own: false, why: 'init' }, { do: 'not-ours', why: 'init' }],
    ['our child may still be exec-ing into another uid', { why: 'uid' }, { do: 'retry' }],
    ['an environment that may not be read stays so', { why: 'environ' }, { do: 'not-ours', why: 'environ' }],
    ['a launcher still exec-ing: later', { own: false, why: 'token' }, { do: 'retry' }],
    ["our child's argv not laid out yet: spin", { why: 'token', argvEmpty: true }, { do: 'spin' }],
    ['spun enough: wait on a timer', { why: 'token', argvEmpty: true, spins: 40 }, { do: 'retry' }],
    ['past the deadline: timeout', { why: 'expect', timedOut: true }, { do: 'timeout' }],
    [
      'our child outside the cgroup, showing the target by its own marks (moved out after its exec): not ours, at once',
      { why: 'cgroup', execdOutside: true },
      { do: 'not-ours', why: 'cgroup' },
    ],
    [
      'our child outside the cgroup, still its own program (a wrapper not placed yet): later',
      { why: 'cgroup' },
      { do: 'retry' },
    ],
    [
      'a reported pid outside the cgroup: not ours, at once',
      { own: false, why: 'cgroup' },
      { do: 'not-ours', why: 'cgroup' },
    ],
  ];
  it.each(cases)('%s', (_, more, step) => {
    expect(decideConfirm(facts(more))).toEqual(step);
  });
});

describe('childEnv and claimOf', () => {
  it('adds nothing in argv mode without notify; puts CUSTODY_TOKEN first, over anything inherited, in env mode', () => {
    const a = attempt();
    const env = { A: '1' };
    expect(childEnv(a, env)).toBe(env);
    const e = attempt({ tokenMode: 'env' });
    const out = childEnv(e, { [TOKEN_VAR]: 'forged', A: '1' });
    expect(out).toEqual({ [TOKEN_VAR]: e.token, A: '1' });
    expect(Object.keys(out ?? {})[0]).toBe(TOKEN_VAR);
  });

  it('the child is proven by its argv; a launcher by the named program, never by its own exe', () => {
    const a = attempt();
    expect(claimOf(a)).toMatchObject({ token: a.token, program: { argv: [PERL, ...a.argv] }, launcherExe: null });
    const exe = { dev: 1, ino: 2 };
    const l = attempt({ pidSpec: { file: '/run/x.pid' }, executable: exe, launcherExe: { dev: 3, ino: 4 } });
    expect(claimOf(l)).toMatchObject({ program: { exe }, launcherExe: { dev: 3, ino: 4 }, cgroup: null });
    expect(claimOf(attempt({ pidSpec: () => 5 }))).toMatchObject({ program: null });
  });
});

describe('an attempt, step by step', () => {
  it('spawns, takes the child as the pid, confirms it from one inspection, and abandon ends and reaps it', async () => {
    const a = attempt();
    startChild(a, specOf(a), null);
    const child = a.child;
    if (!child) throw new Error('startChild set no child');
    expect(a.session).toBe(child.pid);
    const deadline = Date.now() + 5000;
    const pid = await obtainPid(a, deadline, 5000);
    expect(pid).toBe(child.pid);
    await confirm(a, pid, deadline, 5000);
    expect(a.target).toBe(child);
    expect(a.identity).toMatchObject({ pid, argv: [PERL, ...a.argv] });
    expect((await abandon(a, 2000, noEvents)).ended).toContain(pid);
    expect(child.hasExited).toBe(true);
    expect(isGone(pid)).toBe(true);
  });

  it('a child that exits before carrying an expected element is ERR_CUSTODY_LAUNCH_EXITED with its status and stderr', async () => {
    const dir = tmpDir();
    try {
      const a = attempt({ argv: ['-e', 'print STDERR "no disk\\n"; exit 3', MARKER, ''], expect: ['--never-there'] });
      a.argv[3] = a.token;
      // A file's tail is read back when the error is made; a pipe's may not have arrived yet.
      startChild(a, specOf(a, { stderr: { file: join(dir.path, 'err.log') } }), null);
      const pid = a.child?.pid ?? 0;
      const err = await confirm(a, pid, Date.now() + 10_000, 10_000).catch((e: unknown) => e);
      expect(err).toMatchObject({ code: 'ERR_CUSTODY_LAUNCH_EXITED', exitCode: 3, signal: null });
      expect((err as Error).message).toMatch(/no disk/);
      await abandon(a, 2000, noEvents);
    } finally {
      dir.cleanup();
    }
  });

  it('a pidfile launcher that exits non-zero fails obtainPid with its status; a pid function out of range is refused', async () => {
    const dir = tmpDir();
    try {
      const a = attempt({
        argv: ['-e', 'exit 4', MARKER, ''],
        pidSpec: { file: join(dir.path, 'x.pid') },
      });
      a.argv[3] = a.token;
      startChild(a, specOf(a), null);
      await expect(obtainPid(a, Date.now() + 10_000, 10_000)).rejects.toMatchObject({
        code: 'ERR_CUSTODY_LAUNCH_EXITED',
        exitCode: 4,
      });
      await abandon(a, 2000, noEvents);
      const f = attempt({ pidSpec: () => 2 ** 40 });
      startChild(f, specOf(f), null);
      await expect(obtainPid(f, Date.now() + 5000, 5000)).rejects.toMatchObject({ code: 'ERR_CUSTODY_INVALID_ARG' });
      await abandon(f, 2000, noEvents);
    } finally {
      dir.cleanup();
    }
  });

  it('an abort stops the wait for a pidfile with AbortError; abandon still ends the launcher', async () => {
    const dir = tmpDir();
    try {
      const a = attempt({ pidSpec: { file: join(dir.path, 'never.pid') }, launcherExits: false });
      startChild(a, specOf(a), null);
      const ac = new AbortController();
      const waiting = obtainPid(a, Date.now() + 30_000, 30_000, ac.signal);
      setTimeout(() => ac.abort(new Error('cancelled')), 50);
      await expect(waiting).rejects.toMatchObject({ name: 'AbortError' });
      const pid = a.child?.pid ?? 0;
      expect((await abandon(a, 2000, noEvents)).ended).toContain(pid);
      expect(isGone(pid)).toBe(true);
    } finally {
      dir.cleanup();
    }
  });
});
