// Which dirs custody takes as its state dir: its own (stamped), one that
// custody 0.1 left (upgraded in place, nothing lost), and nothing else; no
// path another uid could change (StrictModes); never /, $HOME or /etc; a
// read-only look that creates nothing; and a dir swapped under an open
// supervisor by another uid redirects nothing.
import { execFileSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import {
  chmodSync,
  chownSync,
  existsSync,
  lstatSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  statSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { inspect, spawn, Supervisor, type CustodyEvent, type ProcessHandle } from '../../src/index.js';
import { readStateDir } from '../../src/state/reads.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { isGone, isRoot, MARKER, tmpDir, unusedPid } from '../helpers/procs.js';
import { fill01, fillFixture, identityVars, write01 } from '../helpers/state.js';
import { FIXTURES, PERL } from '../helpers/supervisor.js';

const cleanups = cleanupAfterEach({ marker: MARKER });

function scratch(): string {
  const dir = tmpDir('custody-statedir-');
  cleanups.push(() => dir.cleanup());
  return dir.path;
}

/** Every name under `dir`, recursively, with its mode: what "nothing changed" compares. */
function tree(dir: string): string[] {
  const out: string[] = [];
  const walk = (d: string, rel: string) => {
    for (const n of readdirSync(d).sort()) {
      const st = lstatSync(join(d, n));
      out.push(`${rel}${n} ${(st.mode & 0o7777).toString(8)}`);
      if (st.isDirectory()) walk(join(d, n), `${rel}${n}/`);
    }
  };
  walk(dir, '');
  return out;
}

const EMPTY_REPORT = { adopted: [], repaired: [], cleaned: [], quarantined: [], deferred: [] };
/**
 * A process for a manifest to name, spawned by custody: it reaps its own
 * children whoever adopts them later, as it would after a restart.
 */
/** A sleeper in a session of its own, as every instance custody launched has been (its sid is its pid, never 0). */
const perlSleeper = (args: string[]): ProcessHandle => {
  const h = spawn(PERL, ['-e', 'sleep 300', ...args], { stdio: 'ignore', detached: true });
  cleanups.push(async () => {
    h.signal('SIGKILL');
    await h.exited;
    h.close();
  });
  return h;
};

describe(`what custody takes as its state dir (${backend.name})`, () => {
  it('refuses an existing non-empty dir without the stamp, naming it, and touches nothing in it', async () => {
    const home = join(scratch(), 'home');
    mkdirSync(join(home, 'Documents'), { recursive: true, mode: 0o700 });
    mkdirSync(join(home, 'work'), { mode: 0o700 });
    writeFileSync(join(home, 'work', '.manifest.123.1.tmp'), "a file of the user's");
    writeFileSync(join(home, '.bashrc'), 'export X=1\n');
    const before = tree(home);
    const err = await Supervisor.open({ stateDir: home }).catch((e) => e);
    expect(err).toMatchObject({
      code: 'ERR_CUSTODY_NOT_CUSTODY_DIR',
      stateDir: home,
      message: expect.stringContaining(home),
    });
    expect(() => readStateDir(home)).toThrow(expect.objectContaining({ code: 'ERR_CUSTODY_NOT_CUSTODY_DIR' }));
    // Only empty dirs, as a fresh home may have: no mark of custody either.
    const bare = join(scratch(), 'bare');
    mkdirSync(join(bare, 'a'), { recursive: true });
    await expect(Supervisor.open({ stateDir: bare })).rejects.toMatchObject({ code: 'ERR_CUSTODY_NOT_CUSTODY_DIR' });
    expect(tree(bare)).toEqual(['a 755']);
    expect(tree(home)).toEqual(before);
  });

  it('never takes /, $HOME or /etc, writing nothing there', async () => {
    const probe = ['/.lock', '/.custody', '/etc/.lock', '/etc/.custody'].filter((p) => !existsSync(p));
    const home = process.env.HOME!;
    const homeBefore = readdirSync(home).sort();
    for (const stateDir of ['/', '/etc', home, '/etc/..', `${home}/`]) {
      const err = await Supervisor.open({ stateDir }).catch((e) => e);
      expect([stateDir, err.code, err.message]).toEqual([
        stateDir,
        'ERR_CUSTODY_UNSAFE_PATH',
        expect.stringMatching(/never a state dir/),
      ]);
      expect(() => readStateDir(stateDir)).toThrow(expect.objectContaining({ code: 'ERR_CUSTODY_UNSAFE_PATH' }));
    }
    expect(probe.filter((p) => existsSync(p))).toEqual([]);
    expect(readdirSync(home).sort()).toEqual(homeBefore);
  });

  it('stamps a dir it creates, or finds empty, with its format', async () => {
    const root = scratch();
    for (const stateDir of [join(root, 'new', 'nested'), join(root, 'empty')]) {
      if (stateDir.endsWith('empty')) mkdirSync(stateDir, { mode: 0o700 });
      const { supervisor } = await Supervisor.open({ stateDir, onEvent: () => {} });
      await supervisor.close();
      expect(JSON.parse(readFileSync(join(stateDir, '.custody'), 'utf8'))).toMatchObject({ format: 3 });
      expect(statSync(stateDir).mode & 0o777).toBe(0o700);
    }
    // A stamp from a newer custody is not guessed at.
    const newer = join(root, 'empty');
    writeFileSync(join(newer, '.custody'), JSON.stringify({ format: 99 }));
    await expect(Supervisor.open({ stateDir: newer })).rejects.toMatchObject({
      code: 'ERR_CUSTODY_UNSUPPORTED',
      message: expect.stringMatching(/format 99/),
    });
  });

  it('a read-only look creates nothing, and says when the dir does not exist', async () => {
    const root = scratch();
    const missing = join(root, 'typo');
    expect(() => readStateDir(missing)).toThrow(
      expect.objectContaining({ code: 'ERR_CUSTODY_NO_STATE_DIR', stateDir: missing }),
    );
    await expect(Supervisor.open({ stateDir: missing, create: false })).rejects.toMatchObject({
      code: 'ERR_CUSTODY_NO_STATE_DIR',
    });
    expect(readdirSync(root)).toEqual([]);
    // On a state dir in use: what it holds, and nothing changes (no stamp, no lock taken).
    const stateDir = join(root, 'state');
    const { supervisor } = await Supervisor.open({ stateDir, onEvent: () => {} });
    cleanups.push(() => supervisor.close());
    const inst = await supervisor.launch({ id: 'vm', command: PERL, args: (t) => ['-e', 'sleep 300', t, MARKER] });
    cleanups.push(() => void supervisor.stop('vm', { graceMs: 1000 }).catch(() => {}));
    const before = tree(stateDir);
    const listing = readStateDir(stateDir);
    expect(listing).toMatchObject({ stateDir, format: 3, foreign: [] });
    expect(listing.entries.map((e) => [e.name, e.manifest?.identity?.pid])).toEqual([['vm', inst.pid]]);
    expect(tree(stateDir)).toEqual(before);
  });
});

describe(`StrictModes: no path another uid could change (${backend.name})`, () => {
  it("refuses a state dir below a dir others can write, or that is not its owner's alone, naming the component", async () => {
    const root = scratch();
    const parent = join(root, 'parent');
    const stateDir = join(parent, 'state');
    mkdirSync(stateDir, { recursive: true, mode: 0o700 });
    const refusal = async () => {
      const err = await Supervisor.open({ stateDir }).catch((e) => e);
      expect(() => readStateDir(stateDir)).toThrow(expect.objectContaining({ code: err.code }));
      return err;
    };
    for (const mode of [0o777, 0o775, 0o757]) {
      chmodSync(parent, mode);
      expect(await refusal()).toMatchObject({
        code: 'ERR_CUSTODY_UNSAFE_PATH',
        path: parent,
        message: expect.stringMatching(/writable by group or others/),
      });
    }
    chmodSync(parent, 0o755);
    chmodSync(root, 0o777);
    expect(await refusal()).toMatchObject({ code: 'ERR_CUSTODY_UNSAFE_PATH', path: root });
    chmodSync(root, 0o700);
    chmodSync(stateDir, 0o770);
    expect(await refusal()).toMatchObject({ code: 'ERR_CUSTODY_UNSAFE_PATH', path: stateDir });
    chmodSync(stateDir, 0o700);
    // Sticky and world-writable, like /tmp: fine, as long as what is below it is ours.
    chmodSync(parent, 0o1777);
    const { supervisor } = await Supervisor.open({ stateDir, onEvent: () => {} });
    await supervisor.close();
    // Not created below an unsafe dir either.
    chmodSync(parent, 0o777);
    const fresh = join(parent, 'fresh');
    await expect(Supervisor.open({ stateDir: fresh })).rejects.toMatchObject({
      code: 'ERR_CUSTODY_UNSAFE_PATH',
      path: parent,
    });
    expect(existsSync(fresh)).toBe(false);
  });

  it('refuses a dir owned by another uid, above the state dir or as it, even in a sticky dir', async (ctx) => {
    ctx.skip(!isRoot(), 'needs root: hands dirs to another uid (chown)');
    const root = scratch();
    const parent = join(root, 'parent');
    const stateDir = join(parent, 'state');
    mkdirSync(stateDir, { recursive: true, mode: 0o700 });
    chownSync(parent, 65534, 65534);
    await expect(Supervisor.open({ stateDir })).rejects.toMatchObject({
      code: 'ERR_CUSTODY_UNSAFE_PATH',
      path: parent,
      message: expect.stringMatching(/belongs to uid 65534/),
    });
    chownSync(parent, 0, 0);
    chmodSync(parent, 0o1777);
    chownSync(stateDir, 65534, 65534);
    await expect(Supervisor.open({ stateDir })).rejects.toMatchObject({
      code: 'ERR_CUSTODY_UNSAFE_PATH',
      path: stateDir,
      message: expect.stringMatching(/belongs to uid 65534/),
    });
  });

  it('a state dir swapped for a symlink by another uid after open: launch refuses, nothing reaches the other dir, nothing planted is acted on', async (ctx) => {
    ctx.skip(!isRoot(), 'needs root: another uid (setpriv) does the swap');
    const root = scratch();
    chmodSync(root, 0o755);
    const parent = join(root, 'shared');
    mkdirSync(parent, { mode: 0o755 });
    const stateDir = join(parent, 'state');
    const secret = join(root, 'secret');
    writeFileSync(secret, 'root only', { mode: 0o600 });
    const events: CustodyEvent[] = [];
    const { supervisor } = await Supervisor.open({ stateDir, onEvent: (e) => events.push(e) });
    cleanups.push(() => supervisor.close());
    const before = await supervisor.launch({
      id: 'before',
      command: PERL,
      args: (t) => ['-e', 'sleep 300', t, MARKER],
    });
    cleanups.push(() => void supervisor.stop('before', { graceMs: 1000 }).catch(() => {}));
    const template = JSON.parse(readFileSync(join(stateDir, 'before', 'manifest.json'), 'utf8'));
    // The mistake that lets another uid in, and what it then does: the dir
    // moved aside, a symlink to its own dir in its place, a manifest there
    // naming a root-only file as a declared path.
    chmodSync(parent, 0o777);
    execFileSync(
      'setpriv',
      [
        '--reuid=65534',
        '--regid=65534',
        '--clear-groups',
        'sh',
        '-c',
        'cd "$1" && mv state moved && mkdir evil && ln -s evil state && mkdir evil/planted && cat > evil/planted/manifest.json',
        'sh',
        parent,
      ],
      // Its process gone: a recovery that read it would clean it, and remove its paths.
      {
        input: JSON.stringify({
          ...template,
          id: 'planted',
          identity: { ...template.identity, pid: unusedPid() },
          paths: [secret],
        }),
        timeout: 10_000,
      },
    );
    expect(lstatSync(stateDir).isSymbolicLink()).toBe(true);
    const marker = `${MARKER}-after`;
    const err = await supervisor
      .launch({ id: 'after', command: PERL, args: (t) => ['-e', 'sleep 300', t, marker] })
      .catch((e) => e);
    expect(err).toMatchObject({
      code: 'ERR_CUSTODY_UNSAFE_PATH',
      path: stateDir,
      message: expect.stringMatching(/replaced by a symlink/),
    });
    expect(readdirSync(join(parent, 'evil'))).toEqual(['planted']);
    // Recovery reads the dir it holds, never the one the path now names.
    expect(await supervisor.recover()).toEqual(EMPTY_REPORT);
    expect(readFileSync(secret, 'utf8')).toBe('root only');
    // What it already runs stays in its care: stopped, its state removed where it was written.
    await supervisor.stop('before', { graceMs: 2000 });
    expect(isGone(before.pid)).toBe(true);
    expect(readdirSync(join(parent, 'moved')).filter((n) => !n.startsWith('.'))).toEqual([]);
    await supervisor.close();
    // Opened again: the symlink, and the real dir below a dir others can write, are both refused.
    await expect(Supervisor.open({ stateDir })).rejects.toMatchObject({ code: 'ERR_CUSTODY_UNSAFE_PATH' });
    await expect(Supervisor.open({ stateDir: join(parent, 'moved') })).rejects.toMatchObject({
      code: 'ERR_CUSTODY_UNSAFE_PATH',
      path: parent,
    });
    expect(events.filter((e) => e.id === 'planted')).toEqual([]);
  });
});

type Upgraded = { manifest: (id: string) => Record<string, unknown>; pids: Record<'a' | 'b' | 'q' | 's', number> };

/**
 * What an upgrade leaves of the fixtures' instances: the proven ones rewritten as version 3 (the
 * interrupted launch as running), the quarantine untouched (not proven, not rewritten: read in its old
 * version as long as it stays), every process alive, and no warning.
 */
function expectUpgraded(
  d: Upgraded,
  before: Record<'a' | 'b' | 'q' | 's', Record<string, unknown>>,
  events: CustodyEvent[],
) {
  for (const key of ['a', 'b'] as const) expect(d.manifest(`vm-${key}`)).toEqual({ ...before[key], version: 3 });
  expect(d.manifest('vm-s')).toMatchObject({
    version: 3,
    state: 'running',
    token: before.s.token,
    identity: { pid: d.pids.s },
  });
  expect(d.manifest('vm-q')).toEqual(before.q);
  expect(Object.values(d.pids).every((p) => !isGone(p))).toBe(true);
  expect(events.filter((e) => e.type === 'warning')).toEqual([]);
}

describe(`upgrading a state dir custody 0.1 left (${backend.name})`, () => {
  /** A 0.1 state dir, from the fixtures, for processes this test starts: what 0.1 would have left for them. */
  function dir01(options: { held?: number } = {}) {
    const root = scratch();
    const stateDir = join(root, 'state');
    mkdirSync(stateDir, { mode: 0o700 });
    const token = () => randomBytes(16).toString('hex');
    const tokens = { a: token(), b: token(), q: token(), s: token() };
    const a = perlSleeper([tokens.a, MARKER]);
    const b = perlSleeper([tokens.b]);
    const q = perlSleeper([tokens.q]);
    const s = perlSleeper([tokens.s]);
    const common = { DIR: root, PERL, SH: '/bin/sh', MARKER };
    write01(
      stateDir,
      'vm-a',
      fill01('running-child.json', { ...common, TOKEN: tokens.a, ...identityVars(inspect(a.pid)) }),
    );
    write01(
      stateDir,
      'vm-b',
      fill01('running-pidfile.json', { ...common, TOKEN: tokens.b, ...identityVars(inspect(b.pid)) }),
    );
    write01(
      stateDir,
      'vm-q',
      fill01('quarantined.json', { ...common, TOKEN: tokens.q, ...identityVars(inspect(q.pid)) }),
    );
    write01(stateDir, 'vm-s', fill01('starting.json', { ...common, TOKEN: tokens.s }));
    // Its launcher had written the pidfile (the pid it then exec'd into) when 0.1 died.
    writeFileSync(join(root, 'vm-s.pid'), `${s.pid}\n`);
    // A write 0.1 was killed in the middle of.
    mkdirSync(join(stateDir, 'vm-t'), { mode: 0o700 });
    writeFileSync(join(stateDir, 'vm-t', '.manifest.4242.1.tmp'), '{"version":1,"id":"vm-t","tok', { mode: 0o600 });
    const holder = options.held ? inspect(options.held) : null;
    writeFileSync(
      join(stateDir, '.lock'),
      holder ? fill01('lock-held', { PID: holder.pid, START_TICKS: holder.startTicks }) : '',
      { mode: 0o600 },
    );
    const manifest = (id: string) => JSON.parse(readFileSync(join(stateDir, id, 'manifest.json'), 'utf8'));
    return { stateDir, root, pids: { a: a.pid, b: b.pid, q: q.pid, s: s.pid }, manifest };
  }

  it('adopts every instance 0.1 recorded, rewrites each as version 3 once proven, and quarantines nothing for its version', async () => {
    const d = dir01();
    const v1 = { a: d.manifest('vm-a'), b: d.manifest('vm-b'), q: d.manifest('vm-q'), s: d.manifest('vm-s') };
    // A look before the upgrade changes nothing, and says it is 0.1's.
    expect(readStateDir(d.stateDir).format).toBe(1);
    expect(existsSync(join(d.stateDir, '.custody'))).toBe(false);
    const events: CustodyEvent[] = [];
    const { supervisor, report } = await Supervisor.open({ stateDir: d.stateDir, onEvent: (e) => events.push(e) });
    cleanups.push(() => supervisor.close());
    expect(report.adopted).toEqual([
      { id: 'vm-a', pid: d.pids.a },
      { id: 'vm-b', pid: d.pids.b },
      { id: 'vm-s', pid: d.pids.s, reason: 'starting' },
    ]);
    // The one quarantine is the one 0.1 had persisted; none is for the version.
    expect(report.quarantined).toEqual([{ id: 'vm-q', pid: d.pids.q, reason: 'reused', field: 'startTicks' }]);
    expect(report.cleaned).toEqual([{ id: 'vm-t', reason: 'incomplete' }]);
    expect(report.repaired).toEqual([]);
    expect(JSON.parse(readFileSync(join(d.stateDir, '.custody'), 'utf8'))).toMatchObject({ format: 3 });
    expectUpgraded(d, v1, events);
    await supervisor.stop('vm-a', { graceMs: 2000 });
    expect(existsSync(join(d.stateDir, 'vm-a'))).toBe(false);
    await supervisor.close();
    // Upgraded once: the next open finds a dir of its own format, and the same instances.
    const again = await Supervisor.open({ stateDir: d.stateDir, onEvent: () => {} });
    cleanups.push(() => again.supervisor.close());
    expect(again.report.adopted.map((x) => x.id)).toEqual(['vm-b', 'vm-s']);
    expect(again.report.quarantined.map((x) => x.id)).toEqual(['vm-q']);
    await again.supervisor.release('vm-q');
  });

  it('a 0.1 dir whose 0.1 supervisor still runs is refused as locked, and left unstamped', async () => {
    const holder = perlSleeper([MARKER]);
    const d = dir01({ held: holder.pid });
    await expect(Supervisor.open({ stateDir: d.stateDir })).rejects.toMatchObject({
      code: 'ERR_CUSTODY_STATE_LOCKED',
      holderPid: holder.pid,
    });
    expect(existsSync(join(d.stateDir, '.custody'))).toBe(false);
    expect(d.manifest('vm-a').version).toBe(1);
    // Once it has gone (crashed, its record left in .lock), the dir is upgraded.
    holder.signal('SIGKILL');
    await holder.exited;
    const { supervisor, report } = await Supervisor.open({ stateDir: d.stateDir, onEvent: () => {} });
    cleanups.push(() => supervisor.close());
    expect(report.adopted.map((x) => x.id)).toEqual(['vm-a', 'vm-b', 'vm-s']);
  });
});

describe(`upgrading a state dir custody 0.2 left (${backend.name})`, () => {
  /** A 0.2 state dir, from the fixtures, for processes this test starts: what 0.2 would have left for them. */
  function dir02() {
    const root = scratch();
    const stateDir = join(root, 'state');
    mkdirSync(stateDir, { mode: 0o700 });
    writeFileSync(join(stateDir, '.custody'), readFileSync(join(FIXTURES, 'state-0.2', 'stamp')), { mode: 0o600 });
    const token = () => randomBytes(16).toString('hex');
    const tokens = { a: token(), b: token(), q: token(), s: token() };
    const a = perlSleeper([tokens.a, MARKER]);
    const b = perlSleeper([tokens.b]);
    const q = perlSleeper([tokens.q, MARKER]);
    const s = perlSleeper([tokens.s]);
    const common = { DIR: root, PERL, MARKER };
    const put = (id: string, name: string, vars: Record<string, string | number>) =>
      write01(stateDir, id, fillFixture('state-0.2', `${name}.json.tmpl`, { ...common, ...vars }));
    put('vm-a', 'running-child', { TOKEN: tokens.a, ...identityVars(inspect(a.pid)) });
    put('vm-b', 'running-pidfile', { TOKEN: tokens.b, ...identityVars(inspect(b.pid)) });
    put('vm-q', 'quarantined', { TOKEN: tokens.q, ...identityVars(inspect(q.pid)) });
    put('vm-s', 'starting', { TOKEN: tokens.s });
    // Its launcher had written the pidfile (the pid it then exec'd into) when 0.2 died.
    writeFileSync(join(root, 'vm-s.pid'), `${s.pid}\n`);
    const manifest = (id: string) => JSON.parse(readFileSync(join(stateDir, id, 'manifest.json'), 'utf8'));
    return { stateDir, pids: { a: a.pid, b: b.pid, q: q.pid, s: s.pid }, manifest };
  }

  it('gives every instance the outcome 0.2 would, rewrites the proven ones as version 3, and stamps the dir 3', async () => {
    const d = dir02();
    const v2 = { a: d.manifest('vm-a'), b: d.manifest('vm-b'), q: d.manifest('vm-q'), s: d.manifest('vm-s') };
    expect(readStateDir(d.stateDir).format).toBe(2);
    const events: CustodyEvent[] = [];
    const { supervisor, report } = await Supervisor.open({ stateDir: d.stateDir, onEvent: (e) => events.push(e) });
    cleanups.push(() => supervisor.close());
    expect(report).toEqual({
      adopted: [
        { id: 'vm-a', pid: d.pids.a },
        { id: 'vm-b', pid: d.pids.b },
        { id: 'vm-s', pid: d.pids.s, reason: 'starting' },
      ],
      repaired: [],
      cleaned: [],
      // The one quarantine is the one 0.2 had persisted; none is for the version.
      quarantined: [{ id: 'vm-q', pid: d.pids.q, reason: 'reused', field: 'pidfsId' }],
      deferred: [],
    });
    expect(JSON.parse(readFileSync(join(d.stateDir, '.custody'), 'utf8'))).toEqual({ custody: 'state dir', format: 3 });
    expectUpgraded(d, v2, events);
    await supervisor.close();
    // Upgraded once: the next open finds a dir of its own format, and the same instances.
    const again = await Supervisor.open({ stateDir: d.stateDir, onEvent: () => {} });
    cleanups.push(() => again.supervisor.close());
    expect(again.report.adopted.map((x) => x.id)).toEqual(['vm-a', 'vm-b', 'vm-s']);
    expect(again.report.quarantined.map((x) => x.id)).toEqual(['vm-q']);
    await again.supervisor.release('vm-q');
  });
});
