// Recovery of a launch whose supervisor died before its child had exec'd,
// with real forks of a real (python) supervisor: what it waits for, and what
// it must not. test/reliability/preexec.test.ts kills a real custody
// supervisor with its child held at execve; these stage what that cannot.
import { spawn, type ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { imageOf } from '../../src/backend/procview.js';
import { Supervisor } from '../../src/index.js';
import type { StartingManifest } from '../../src/state/manifest.js';
import { StateStore } from '../../src/state/store.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { startingManifest } from '../helpers/state.js';
import { endOwn, isRoot, MARKER, type Own, startOf, tmpDir, tokenCarriers } from '../helpers/procs.js';
import { FIXTURES, PERL, PYTHON } from '../helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });

const ended: ChildProcess[] = [];
const extraPids: Own[] = [];
afterEach(async () => {
  await endOwn(extraPids.splice(0));
  for (const c of ended.splice(0)) {
    if (c.exitCode === null && c.signalCode === null) {
      c.kill('SIGKILL');
      await new Promise((r) => c.once('exit', r));
    }
  }
});

/** Writes starting manifests, as a supervisor killed mid-launch leaves them, into a new state dir. */
async function interrupted(list: Array<Partial<StartingManifest>>): Promise<string> {
  const dir = tmpDir('custody-forks-');
  const path = join(dir.path, 'state');
  const store = await StateStore.open(path, { emit: () => {}, create: true });
  for (const [k, extra] of list.entries()) {
    const token = randomBytes(16).toString('hex');
    await store.write(startingManifest(`i-${k}`, token, { args: ['-e', 'sleep 300', token, MARKER], ...extra }));
  }
  store.close();
  return path;
}

const firstLine = (c: ChildProcess) =>
  new Promise<string>((resolve, reject) => {
    c.stdout!.once('data', (d) => resolve(String(d).trim()));
    c.once('exit', (code) => reject(new Error(`exited ${code} before a line`)));
  });

/**
 * A dead "supervisor" whose fork waits 1 s and execs `argv` (a launcher carrying the token) for a launch
 * whose pid came from a function and whose program is perl; recovered by a new supervisor. Returns its
 * report, with every token carrier left registered for the end of the test.
 */
async function recoverLaunch(token: string, argv: string[]) {
  // Dated before the fork exists, as a launch writes its manifest before it spawns: a fork that seems
  // to predate its launch is no launch's child, and a slow write here must not make it seem so.
  const createdAt = new Date().toISOString();
  const sup = spawn(
    PYTHON,
    [
      '-c',
      'import os, sys, time\npid = os.fork()\nif pid == 0:\n    time.sleep(1)\n    os.execv(sys.argv[1], sys.argv[1:])\nprint(pid, flush=True)\ntime.sleep(60)',
      ...argv,
    ],
    { stdio: ['ignore', 'pipe', 'inherit'] },
  );
  ended.push(sup);
  const fork = Number(await firstLine(sup));
  extraPids.push({ pid: fork, start: startOf(fork) });
  const stateDir = await interrupted([
    {
      token,
      args: argv.slice(1),
      pidSource: 'function',
      executable: PERL,
      supervisorPid: sup.pid!,
      forkImage: imageOf(sup.pid!)!,
      createdAt,
      updatedAt: createdAt,
    },
  ]);
  sup.kill('SIGKILL');
  await new Promise((r) => (sup.exitCode !== null || sup.signalCode !== null ? r(null) : sup.once('exit', r)));
  const opened = await Supervisor.open({ stateDir, onEvent: () => {} });
  for (const pid of tokenCarriers(token)) extraPids.push({ pid, start: startOf(pid) });
  return opened;
}

/** recoverLaunch, then: the one process carrying the token is adopted as the target, and its stop ends it. */
async function expectTargetAdopted(token: string, argv: string[]): Promise<void> {
  const { supervisor, report } = await recoverLaunch(token, argv);
  try {
    expect(report.cleaned).toEqual([]);
    expect(report.adopted).toMatchObject([{ id: 'i-0', reason: 'starting' }]);
    const target = report.adopted[0]!.pid!;
    for (const pid of tokenCarriers(token)) extraPids.push({ pid, start: startOf(pid) });
    expect(tokenCarriers(token)).toEqual([target]);
    await supervisor.stop('i-0', { graceMs: 1000 });
    expect(tokenCarriers(token)).toEqual([]);
  } finally {
    await supervisor.close();
  }
}

describe(`recovery and the forks a dead supervisor left (${backend.name})`, () => {
  it('a launcher that starts the target in the background and exits while recovery watches it: the target is adopted, not lost', async () => {
    const token = randomBytes(16).toString('hex');
    // sh carries the token but is not the program (perl): a candidate, not the target. A second on, it starts
    // perl in the background and exits; perl forks the target and exits too. The target, re-parented to init,
    // is no child of any candidate recovery is watching.
    const perl = `${PERL} -e 'exit 0 if fork; sleep 30' -- ${token} ${MARKER}`;
    await expectTargetAdopted(token, ['/bin/sh', '-c', `sleep 1; ${perl} & exit 0`, 'sh', token]);
  });

  it('a process of another uid with no argv, and an old one of ours, hold no interrupted launch up', async (ctx) => {
    ctx.skip(!isRoot(), 'needs root: setpriv runs the squatter as uid 65534');
    const squat = (uid: string[]) => {
      const c = spawn('setpriv', [...uid, PYTHON, join(FIXTURES, 'empty-argv.py'), '60', MARKER], {
        stdio: ['ignore', 'pipe', 'inherit'],
      });
      ended.push(c);
      return firstLine(c);
    };
    // Ours, but older than the launch by more than btime's second of doubt: only its start tells it apart.
    const old = Number(await squat(['--reuid=0']));
    await new Promise((r) => setTimeout(r, 2600));
    const stateDir = await interrupted([{ forkImage: '94000000000000:95000000000000:140000000000000' }, {}]);
    // Started after the launch, under another uid: only its uid tells it apart.
    const stranger = Number(await squat(['--reuid=65534', '--regid=65534', '--clear-groups']));
    for (const pid of [old, stranger]) expect(readFileSync(`/proc/${pid}/cmdline`).length).toBe(0);
    const { supervisor, report } = await Supervisor.open({ stateDir, onEvent: () => {} });
    await supervisor.close();
    expect(report.deferred).toEqual([]);
    expect(report.cleaned.map((c) => c.id).sort()).toEqual(['i-0', 'i-1']);
  });

  it('a fork that execs a launcher which forks the target and exits at once: the target is adopted', async () => {
    const token = randomBytes(16).toString('hex');
    await expectTargetAdopted(token, [PERL, '-e', 'exit 0 if fork; sleep 30', token, MARKER]);
  });
});
