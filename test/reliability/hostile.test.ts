// Hostile input: manifests that point where they should not, numbers that
// are not numbers, symlinks, a world-writable state dir, ids and argv with
// NUL bytes, newlines and great length. Never a signal to an unproven
// process, never a crash; each refused with a reason.
import { spawn as cpSpawn, type ChildProcess } from 'node:child_process';
import { chmodSync, mkdirSync, readFileSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { inspect, Supervisor } from '../../src/index.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { endOwn, isRoot, killAndWait, loggedSignals, MARKER, tmpDir, untilReady } from '../helpers/procs.js';
import { PERL } from '../helpers/supervisor.js';

const cleanups = cleanupAfterEach({ marker: MARKER });

const kids: ChildProcess[] = [];
afterEach(async () => {
  for (const k of kids.splice(0)) await killAndWait(k);
});

/** A state dir holding one real running instance, whose manifest is the template for forgeries. */
async function withTemplate() {
  const dir = tmpDir('custody-hostile-');
  const stateDir = join(dir.path, 'state');
  const { supervisor } = await Supervisor.open({ stateDir, onEvent: () => {} });
  const inst = await supervisor.launch({ id: 'real', command: PERL, args: (t) => ['-e', 'sleep 300', t, MARKER] });
  await supervisor.close();
  cleanups.push(async () => {
    await endOwn([inst.pid]);
    dir.cleanup();
  });
  const template = JSON.parse(readFileSync(join(stateDir, 'real', 'manifest.json'), 'utf8'));
  const forge = (id: string, m: unknown) => {
    mkdirSync(join(stateDir, id), { mode: 0o700 });
    writeFileSync(join(stateDir, id, 'manifest.json'), typeof m === 'string' ? m : JSON.stringify(m), { mode: 0o600 });
  };
  return { dir: dir.path, stateDir, inst, template, forge };
}

describe(`hostile manifests (${backend.name})`, () => {
  it('huge, negative and fractional numbers are bad manifests, quarantined, never a crash', async () => {
    const t = await withTemplate();
    const bad: Record<string, unknown> = {
      'pid-huge': { ...t.template, identity: { ...t.template.identity, pid: 1e30 } },
      'pid-negative': { ...t.template, identity: { ...t.template.identity, pid: -7 } },
      'pid-fraction': { ...t.template, identity: { ...t.template.identity, pid: 1.5 } },
      'pid-string': { ...t.template, identity: { ...t.template.identity, pid: '1' } },
      'ticks-negative': { ...t.template, identity: { ...t.template.identity, startTicks: -1 } },
      'ticks-fraction': { ...t.template, identity: { ...t.template.identity, startTicks: 0.25 } },
      'pidfs-garbage': { ...t.template, identity: { ...t.template.identity, pidfsId: '../../etc' } },
      'argv-not-strings': { ...t.template, identity: { ...t.template.identity, argv: [1, 2] } },
      'token-short': { ...t.template, token: 'abc' },
      'id-elsewhere': { ...t.template, id: 'someone-else' },
      'not-object': '[1,2,3]',
      'nul-bytes': '\u0000\u0000\u0000',
    };
    for (const [id, m] of Object.entries(bad))
      t.forge(id, typeof m === 'string' ? m : { ...(m as object), id: id === 'id-elsewhere' ? 'someone-else' : id });
    const { supervisor, report } = await Supervisor.open({ stateDir: t.stateDir, onEvent: () => {} });
    cleanups.push(() => supervisor.close());
    expect(report.adopted.map((a) => a.id)).toEqual(['real']);
    const q = Object.fromEntries(report.quarantined.map((e) => [e.id, e.reason]));
    for (const id of Object.keys(bad)) expect([id, q[id]]).toEqual([id, 'bad-manifest']);
    expect(report.quarantined.find((e) => e.id === 'id-elsewhere')?.field).toMatch(/does not match its directory/);
  });

  it("a manifest pointing at another uid's process is quarantined, and that process is never signalled", async (ctx) => {
    ctx.skip(!isRoot(), 'needs root: starts a process as another uid (65534)');
    const t = await withTemplate();
    const dir = tmpDir();
    cleanups.push(() => dir.cleanup());
    chmodSync(dir.path, 0o777);
    const log = join(dir.path, 'log');
    const script =
      '$SIG{$_} = sub { open my $f, ">>", $ARGV[0]; print $f "SIG$_[0]\\n"; close $f } for qw(TERM INT HUP USR1 USR2); print "ready\\n"; $| = 1; sleep 1 while 1';
    // It even carries the token: only the uid gives it away.
    const other = cpSpawn(PERL, ['-e', script, log, t.template.token, MARKER], {
      stdio: ['ignore', 'pipe', 'ignore'],
      uid: 65534,
      gid: 65534,
    });
    kids.push(other);
    await untilReady(other.stdout!);
    t.forge('other-uid', { ...t.template, id: 'other-uid', identity: inspect(other.pid!) });
    const { supervisor, report } = await Supervisor.open({ stateDir: t.stateDir, onEvent: () => {} });
    cleanups.push(() => supervisor.close());
    expect(report.quarantined).toContainEqual({ id: 'other-uid', pid: other.pid, reason: 'unprovable', field: 'uid' });
    await expect(supervisor.stop('other-uid')).rejects.toMatchObject({ code: 'ERR_CUSTODY_QUARANTINED' });
    expect(loggedSignals(log)).toEqual([]);
  });

  it('a symlinked instance dir or manifest is never followed', async () => {
    const t = await withTemplate();
    const elsewhere = join(t.dir, 'elsewhere');
    mkdirSync(elsewhere, { mode: 0o700 });
    writeFileSync(join(elsewhere, 'manifest.json'), JSON.stringify({ ...t.template, id: 'linkdir' }), { mode: 0o600 });
    symlinkSync(elsewhere, join(t.stateDir, 'linkdir'));
    mkdirSync(join(t.stateDir, 'linkfile'), { mode: 0o700 });
    writeFileSync(join(elsewhere, 'other.json'), JSON.stringify({ ...t.template, id: 'linkfile' }), { mode: 0o600 });
    symlinkSync(join(elsewhere, 'other.json'), join(t.stateDir, 'linkfile', 'manifest.json'));
    const { supervisor, report } = await Supervisor.open({ stateDir: t.stateDir, onEvent: () => {} });
    cleanups.push(() => supervisor.close());
    const q = Object.fromEntries(report.quarantined.map((e) => [e.id, e]));
    expect(q.linkdir).toMatchObject({ reason: 'bad-manifest', field: expect.stringMatching(/symlink/) });
    expect(q.linkfile).toMatchObject({ reason: 'bad-manifest', field: expect.stringMatching(/symlink/) });
    expect(report.adopted.map((a) => a.id)).toEqual(['real']);
  });

  it('refuses a state dir that others can write, or that is a symlink', async () => {
    const dir = tmpDir();
    cleanups.push(() => dir.cleanup());
    const open = join(dir.path, 'open');
    mkdirSync(open, { mode: 0o700 });
    chmodSync(open, 0o777);
    await expect(Supervisor.open({ stateDir: open })).rejects.toMatchObject({
      code: 'ERR_CUSTODY_UNSAFE_PATH',
      message: expect.stringMatching(/writable by group or others/),
    });
    const real = join(dir.path, 'real');
    mkdirSync(real, { mode: 0o700 });
    symlinkSync(real, join(dir.path, 'link'));
    await expect(Supervisor.open({ stateDir: join(dir.path, 'link') })).rejects.toMatchObject({
      code: 'ERR_CUSTODY_UNSAFE_PATH',
    });
  });
});

describe(`hostile launch input (${backend.name})`, () => {
  it('ids with NUL, newline, slash or great length are refused; argv with NUL is refused, with a newline or great length it works', async () => {
    const dir = tmpDir();
    cleanups.push(() => dir.cleanup());
    const { supervisor } = await Supervisor.open({ stateDir: join(dir.path, 'state'), onEvent: () => {} });
    cleanups.push(() => supervisor.close());
    for (const id of ['a\nb', 'a\0b', 'x'.repeat(129), 'a b', 'ü']) {
      await expect(supervisor.launch({ id, command: PERL, args: (t) => [t] })).rejects.toMatchObject({
        code: 'ERR_CUSTODY_INVALID_ARG',
      });
    }
    await expect(
      supervisor.launch({ id: 'nul', command: PERL, args: (t) => ['-e', 'sleep 1', `${t}\0x`] }),
    ).rejects.toMatchObject({ code: 'ERR_CUSTODY_INVALID_ARG' });
    await expect(supervisor.launch({ id: 'nulcmd', command: 'pe\0rl', args: (t) => [t] })).rejects.toMatchObject({
      code: 'ERR_CUSTODY_INVALID_ARG',
    });
    await expect(
      supervisor.launch({
        id: 'throws',
        command: PERL,
        args: () => {
          throw new Error("the caller's args function failed");
        },
      }),
    ).rejects.toThrow(/args function failed/);
    const long = 'L'.repeat(100_000);
    const inst = await supervisor.launch({
      id: 'odd-argv',
      command: PERL,
      args: (t) => ['-e', 'sleep 300', `line1\nline2 ${t}`, long, MARKER],
    });
    try {
      expect(inst.identity.argv[4] === long).toBe(true);
      expect(inst.identity.argv[3]).toContain('\n');
    } finally {
      await supervisor.stop('odd-argv', { graceMs: 2000 });
    }
    expect(supervisor.list()).toEqual([]);
  });
});
