/**
 * A cgroup root other uids could write, and a sub-cgroup custody did not
 * make: refused at open (ERR_CUSTODY_UNSAFE_PATH naming the directory)
 * before any instance is touched, with a real second uid (65534) making
 * the directories first; the sub-cgroup's record beside the stamp (its id
 * and boot), reused only as recorded; and a running instance whose cgroup
 * path became writable by others is neither frozen nor stopped through it.
 * Every test ends with no cgroup, process or fd left behind.
 */
import { execFileSync } from 'node:child_process';
import {
  chmodSync,
  chownSync,
  existsSync,
  lstatSync,
  mkdirSync,
  readFileSync,
  rmdirSync,
  statSync,
  unlinkSync,
  writeFileSync,
} from 'node:fs';
import { dirname, join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backend } from '../src/backend/index.js';
import { type CustodyEvent, Supervisor } from '../src/index.js';
import { ownCgroupName } from '../src/process/cgroup-guard.js';
import { readStateDir } from '../src/state/reads.js';
import { CGROUP_ROOT, CGROUP_SKIP, cgroupsBelow, expectNoCgroupsLeft, procsOf } from './helpers/cgroup.js';
import { cleanupAfterEach } from './helpers/cleanups.js';
import {
  catchesSignal,
  endOwn,
  isGone,
  isRoot,
  loggedSignals,
  MARKER,
  signalLoggerArgs,
  tmpDir,
  waitFor,
} from './helpers/procs.js';
import { PERL, PYTHON } from './helpers/supervisor.js';

const cleanups = cleanupAfterEach({ marker: MARKER });
expectNoCgroupsLeft();

const NOBODY = 65534;
const RECORD = '.custody.cgroup';
const UNSAFE = 'ERR_CUSTODY_UNSAFE_PATH';
const BOOT = readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();

/** A state dir of the test's own (made, so the sub-cgroup's name can be computed before the first open). */
function stateDir(): string {
  const d = tmpDir('custody-cgroot-');
  cleanups.push(d.cleanup);
  const dir = join(d.path, 'state');
  mkdirSync(dir, { mode: 0o700 });
  return dir;
}

/** A root of this test below the worker's; what is left in it is removed after the test (deepest first). */
function rootOf(name: string): string {
  const root = join(CGROUP_ROOT, name);
  cleanups.push(() => {
    for (const dir of [...cgroupsBelow(root), root]) if (existsSync(dir)) rmdirSync(dir);
  });
  return root;
}

/** `mkdir` as uid 65534: a real second uid, not a chown after the fact. */
function mkdirAsNobody(...dirs: string[]): void {
  execFileSync('setpriv', [`--reuid=${NOBODY}`, `--regid=${NOBODY}`, '--clear-groups', 'mkdir', ...dirs], {
    stdio: 'pipe',
    timeout: 5000,
  });
}

const openWith = (dir: string, root: string, events: CustodyEvent[] = []) =>
  Supervisor.open({ stateDir: dir, cgroup: { root }, onEvent: (e) => events.push(e) });
const idOf = (dir: string) => String(statSync(dir, { bigint: true }).ino);
const record = (dir: string) => JSON.parse(readFileSync(join(dir, RECORD), 'utf8'));

/** An instance `vm` (perl sleeping) launched into a root of the test's, its supervisor closed: it runs on. */
async function sleeperIn(name: string) {
  const root = rootOf(name);
  const dir = stateDir();
  const { supervisor } = await openWith(dir, root);
  try {
    const inst = await supervisor.launch({
      id: 'vm',
      command: PERL,
      args: (tok) => ['-e', 'sleep 60', '--', tok, MARKER],
    });
    cleanups.push(() => endOwn([inst.pid]));
    return { root, dir, inst };
  } finally {
    await supervisor.close();
  }
}

const skipWithout = (t: { skip: (c: boolean, why: string) => void }, root = false) => {
  t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
  t.skip(root && !isRoot(), 'needs root: acts as a second uid (setpriv, chown)');
};

describe(`a cgroup root other uids could write (${backend.name})`, () => {
  it("another uid's sub-cgroup in a root anyone may write is refused at open, naming the dir, and left as it was", async (t) => {
    skipWithout(t, true);
    const root = rootOf('world');
    mkdirSync(root, { recursive: true });
    chmodSync(root, 0o1777);
    const dir = stateDir();
    const theirs = join(root, ownCgroupName(dir));
    mkdirAsNobody(theirs);
    expect(statSync(theirs).uid).toBe(NOBODY);
    await expect(openWith(dir, root)).rejects.toMatchObject({
      code: UNSAFE,
      path: root,
      message: expect.stringMatching(/writable by group or others \(mode 1777\)/),
    });
    // Only root or custody's uid may write the root now; the sub-cgroup is still theirs.
    chmodSync(root, 0o755);
    await expect(openWith(dir, root)).rejects.toMatchObject({
      code: UNSAFE,
      path: theirs,
      message: expect.stringMatching(/belongs to uid 65534/),
    });
    expect(statSync(theirs).uid).toBe(NOBODY);
    expect(existsSync(join(dir, RECORD))).toBe(false);
  });

  it('a root whose parent another uid can write is refused, made or not, naming the first dir that is not safe', async (t) => {
    skipWithout(t, true);
    const parent = rootOf('parent');
    const root = join(parent, 'root');
    mkdirSync(parent, { recursive: true });
    chownSync(parent, NOBODY, NOBODY);
    const dir = stateDir();
    // Absent: the dir it would be made in is another uid's, so nothing is made.
    await expect(openWith(dir, root)).rejects.toMatchObject({
      code: UNSAFE,
      path: parent,
      message: expect.stringMatching(/belongs to uid 65534/),
    });
    expect(existsSync(root)).toBe(false);
    // That uid makes the root and custody's sub-cgroup first.
    mkdirAsNobody(root, join(root, ownCgroupName(dir)));
    await expect(openWith(dir, root)).rejects.toMatchObject({
      code: UNSAFE,
      path: root,
      message: expect.stringMatching(/belongs to uid 65534/),
    });
    rmdirSync(join(root, ownCgroupName(dir)));
    rmdirSync(root);
    // Root's, but anyone may write it: refused the same way.
    chownSync(parent, 0, 0);
    chmodSync(parent, 0o777);
    await expect(openWith(dir, root)).rejects.toMatchObject({
      code: UNSAFE,
      path: parent,
      message: expect.stringMatching(/writable by group or others/),
    });
    expect(existsSync(root)).toBe(false);
    expect(existsSync(join(dir, RECORD))).toBe(false);
  });

  it('a root made writable by others while an instance runs: open refuses before the instance is touched', async (t) => {
    skipWithout(t);
    const { root, dir, inst } = await sleeperIn('live');
    const manifest = readFileSync(join(dir, 'vm', 'manifest.json'), 'utf8');
    chmodSync(root, 0o1777);
    await expect(openWith(dir, root)).rejects.toMatchObject({ code: UNSAFE, path: root });
    expect(isGone(inst.pid)).toBe(false);
    expect(procsOf(inst.cgroup!)).toEqual([inst.pid]);
    expect(readFileSync(join(dir, 'vm', 'manifest.json'), 'utf8')).toBe(manifest);
    chmodSync(root, 0o755);
    const events: CustodyEvent[] = [];
    const { supervisor } = await openWith(dir, root, events);
    try {
      expect(supervisor.list()).toEqual([
        expect.objectContaining({ id: 'vm', status: 'running', cgroup: inst.cgroup }),
      ]);
      await supervisor.stop('vm', { graceMs: 2000 });
    } finally {
      await supervisor.close();
    }
    expect(existsSync(inst.cgroup!)).toBe(false);
    expect(events.filter((e) => e.type === 'warning')).toEqual([]);
  });
});

describe(`the sub-cgroup's record (${backend.name})`, () => {
  it('records the id and boot of the sub-cgroup custody made, reuses only that one on that boot, takes an unrecorded one', async (t) => {
    skipWithout(t);
    const root = rootOf('rec');
    const dir = stateDir();
    const own = join(root, ownCgroupName(dir));
    const cycle = async (events: CustodyEvent[] = []) => (await openWith(dir, root, events)).supervisor.close();

    await cycle();
    // Removed on close (empty); its record stays, beside the stamp, its owner's alone, never an instance.
    expect(existsSync(own)).toBe(false);
    const first = record(dir);
    expect(first).toEqual({ path: own, id: expect.stringMatching(/^\d+$/), bootId: BOOT });
    expect(lstatSync(join(dir, RECORD)).mode & 0o777).toBe(0o600);
    expect(readStateDir(dir)).toMatchObject({ foreign: [], entries: [] });

    // Made again by the next open, and recorded anew.
    let { supervisor } = await openWith(dir, root);
    expect(record(dir)).toEqual({ path: own, id: idOf(own), bootId: BOOT });
    expect(record(dir).id).not.toBe(first.id);
    await supervisor.close();

    // Made by someone else while no supervisor held it: not the one recorded this boot, refused, left there.
    mkdirSync(own);
    const made = idOf(own);
    await expect(openWith(dir, root)).rejects.toMatchObject({
      code: UNSAFE,
      path: own,
      message: expect.stringMatching(new RegExp(`is cgroup ${made}, not cgroup \\d+ that custody made`)),
    });
    expect(idOf(own)).toBe(made);

    // Recorded on another boot, whose cgroups went with it: one there now was made by someone else.
    const before = { ...record(dir), bootId: 'another-boot' };
    writeFileSync(join(dir, RECORD), JSON.stringify(before));
    await expect(openWith(dir, root)).rejects.toMatchObject({
      code: UNSAFE,
      path: own,
      message: expect.stringMatching(/was made on this boot by someone other than custody/),
    });
    expect(record(dir)).toEqual(before);
    // Gone, it is made and recorded anew.
    rmdirSync(own);
    ({ supervisor } = await openWith(dir, root));
    expect(record(dir)).toEqual({ path: own, id: idOf(own), bootId: BOOT });
    await supervisor.close();

    // No record (a state dir of custody 0.2), the dir there: taken and recorded.
    mkdirSync(own);
    unlinkSync(join(dir, RECORD));
    ({ supervisor } = await openWith(dir, root));
    expect(record(dir)).toEqual({ path: own, id: idOf(own), bootId: BOOT });
    await supervisor.close();

    // A record custody did not write: said, and recorded anew.
    writeFileSync(join(dir, RECORD), 'not json');
    const events: CustodyEvent[] = [];
    await cycle(events);
    expect(events).toContainEqual(
      expect.objectContaining({
        type: 'warning',
        message: expect.stringMatching(/\.custody\.cgroup is not a cgroup record custody wrote; .* recorded anew/),
      }),
    );
    expect(record(dir)).toMatchObject({ path: own, bootId: BOOT });
  });
});

describe(`a running instance's cgroup path made writable by others (${backend.name})`, () => {
  it('freeze() and stop() refuse with ERR_CUSTODY_UNSAFE_PATH and signal nothing; once safe again, stop() ends it', async (t) => {
    skipWithout(t);
    const root = rootOf('guard');
    const dir = stateDir();
    const log = join(dirname(dir), 'signals.log');
    const { supervisor } = await openWith(dir, root);
    try {
      const inst = await supervisor.launch({
        id: 'vm',
        command: PYTHON,
        args: (tok) => [...signalLoggerArgs(log, false), tok],
      });
      await waitFor(() => catchesSignal(inst.pid, 15), 5000, 'the SIGTERM handler');
      const own = dirname(inst.cgroup!);
      chmodSync(own, 0o777);
      for (const refused of [supervisor.freeze('vm'), supervisor.stop('vm', { graceMs: 2000 })])
        await expect(refused).rejects.toMatchObject({ code: UNSAFE, path: own });
      expect(loggedSignals(log)).toEqual([]);
      expect(readFileSync(join(inst.cgroup!, 'cgroup.freeze'), 'utf8').trim()).toBe('0');
      expect(supervisor.list()).toEqual([expect.objectContaining({ id: 'vm', status: 'running' })]);
      expect(JSON.parse(readFileSync(join(dir, 'vm', 'manifest.json'), 'utf8')).state).toBe('running');
      chmodSync(own, 0o755);
      expect(await supervisor.stop('vm', { graceMs: 2000 })).toMatchObject({ outcome: 'exited', escalated: false });
      expect(loggedSignals(log)).toEqual(['SIGTERM']);
      expect(existsSync(inst.cgroup!)).toBe(false);
    } finally {
      await supervisor.close();
    }
  });
});

describe(`recovery by the recorded cgroup (${backend.name})`, () => {
  it('a manifest of another boot is cleaned without a look at what is at its cgroup path now: nothing signalled', async (t) => {
    skipWithout(t);
    const { root, dir, inst } = await sleeperIn('boot');
    // Cgroup ids recur across boots: a record of another boot proves nothing about the directory there now.
    const file = join(dir, 'vm', 'manifest.json');
    const m = JSON.parse(readFileSync(file, 'utf8'));
    writeFileSync(file, JSON.stringify({ ...m, identity: { ...m.identity, bootId: 'another-boot' } }));
    const events: CustodyEvent[] = [];
    const reopened = await openWith(dir, root, events);
    await reopened.supervisor.close();
    expect(reopened.report.cleaned).toEqual([expect.objectContaining({ id: 'vm', reason: 'rebooted' })]);
    expect(isGone(inst.pid)).toBe(false);
    expect(procsOf(inst.cgroup!)).toEqual([inst.pid]);
    expect(events).toContainEqual(
      expect.objectContaining({
        type: 'warning',
        cgroup: inst.cgroup,
        message: expect.stringMatching(/no manifest names it: left alone, nothing signalled/),
      }),
    );
  });
});
