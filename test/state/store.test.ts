// The manifests of a state dir: files users put there never make open,
// stop or recovery fail; one id rule everywhere, and every quarantined
// entry releasable by the name list() shows; the decoder's ranges; a write
// that fails leaves nothing; declared paths removed only when they are
// sockets or regular files.
import { execFile, execFileSync } from 'node:child_process';
import {
  chmodSync,
  existsSync,
  lstatSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { emitter, type CustodyEvent } from '../../src/events.js';
import { Supervisor } from '../../src/index.js';
import { removeDeclaredPaths } from '../../src/state/paths.js';
import { decodeManifest } from '../../src/state/manifest.js';
import { pidMax } from '../../src/validate.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { processesWithMarker } from '../helpers/leaks.js';
import { endOwn, goneFrom, isGone, isRoot, loggedSignals, MARKER, tmpDir, waitFor } from '../helpers/procs.js';
import { DIST } from '../helpers/state.js';
import { PERL } from '../helpers/supervisor.js';

const cleanups = cleanupAfterEach({ marker: MARKER });

const sleeperArgs = (t: string) => ['-e', 'sleep 300', t, MARKER];

/** Runs an ES module body in a Node child of its own whose fd limit is 64 (this worker keeps its fds); its last line. */
async function underFdLimit(script: string, timeoutMs: number) {
  const { stdout } = await promisify(execFile)(
    'sh',
    ['-c', 'ulimit -n 64 && exec "$0" --input-type=module -e "$1"', process.execPath, script],
    { env: { ...process.env, CUSTODY_BACKEND: backend.name }, timeout: timeoutMs },
  );
  return JSON.parse(stdout.trim().split('\n').pop() ?? 'null');
}
const warnings = (events: CustodyEvent[]) => events.filter((e) => e.type === 'warning');

/** A supervisor on a fresh state dir; `reopen` closes it and opens the dir again, as an agent restarting. */
async function opened() {
  const dir = tmpDir('custody-store-');
  const stateDir = join(dir.path, 'state');
  const events: CustodyEvent[] = [];
  const pids = new Set<number>();
  let current = await Supervisor.open({ stateDir, onEvent: (e) => events.push(e) });
  cleanups.push(async () => {
    await current.supervisor.close();
    await endOwn(pids);
    dir.cleanup();
  });
  return {
    root: dir.path,
    stateDir,
    events,
    get supervisor() {
      return current.supervisor;
    },
    async launch(id: string, extra: object = {}) {
      const inst = await current.supervisor.launch({ id, command: PERL, args: sleeperArgs, ...extra });
      pids.add(inst.pid);
      return inst;
    },
    async reopen() {
      await current.supervisor.close();
      events.length = 0;
      current = await Supervisor.open({ stateDir, onEvent: (e) => events.push(e) });
      return current.report;
    },
    manifest: (id: string) => JSON.parse(readFileSync(join(stateDir, id, 'manifest.json'), 'utf8')),
    plant(name: string, m: unknown) {
      mkdirSync(join(stateDir, name), { mode: 0o700 });
      writeFileSync(join(stateDir, name, 'manifest.json'), typeof m === 'string' ? m : JSON.stringify(m), {
        mode: 0o600,
      });
    },
  };
}

describe(`files custody did not write (${backend.name})`, () => {
  it('a file a user put in an instance dir: stop, open and recovery succeed, custody removes its own and names the rest', async () => {
    const s = await opened();
    const inst = await s.launch('vm');
    writeFileSync(join(s.stateDir, 'vm', 'console.log'), "the user's log\n");
    mkdirSync(join(s.stateDir, 'vm', 'dumps'));
    expect(await s.supervisor.stop('vm', { graceMs: 2000 })).toMatchObject({ outcome: 'exited' });
    expect(s.supervisor.list()).toEqual([]);
    expect(readdirSync(join(s.stateDir, 'vm')).sort()).toEqual(['console.log', 'dumps']);
    expect(warnings(s.events)).toEqual([
      expect.objectContaining({
        id: 'vm',
        left: ['console.log', 'dumps'],
        message: expect.stringContaining('"console.log"'),
      }),
    ]);
    // Opened again: not an instance any more, not a failure, still named.
    expect(await s.reopen()).toEqual({ adopted: [], repaired: [], cleaned: [], quarantined: [], deferred: [] });
    expect(warnings(s.events).map((e) => e.left)).toEqual([['console.log', 'dumps']]);
    // The id launches again beside the user's files; recovery adopts it, then cleans it once it is gone.
    const again = await s.launch('vm');
    expect(again.pid).not.toBe(inst.pid);
    expect((await s.reopen()).adopted).toEqual([{ id: 'vm', pid: again.pid }]);
    await s.supervisor.close();
    process.kill(again.pid, 'SIGKILL');
    await waitFor(() => isGone(again.pid), 5000, 'exit');
    expect((await s.reopen()).cleaned).toEqual([{ id: 'vm', pid: again.pid, reason: 'gone' }]);
    expect(warnings(s.events)).toEqual([expect.objectContaining({ id: 'vm', left: ['console.log', 'dumps'] })]);
    expect(readFileSync(join(s.stateDir, 'vm', 'console.log'), 'utf8')).toBe("the user's log\n");
  });

  it("a launch that fails beside a user's file is abandoned as usual: its error, not the state's", async () => {
    const s = await opened();
    mkdirSync(join(s.stateDir, 'quick'), { mode: 0o700 });
    writeFileSync(join(s.stateDir, 'quick', 'notes'), 'x');
    const err = await s.supervisor
      .launch({
        id: 'quick',
        command: PERL,
        args: (t) => ['-e', 'select(undef, undef, undef, 0.2); exit 3', t, MARKER],
        ready: () => new Promise(() => {}),
      })
      .catch((e) => e);
    expect(err).toMatchObject({ code: 'ERR_CUSTODY_LAUNCH_EXITED', exitCode: 3 });
    expect(readdirSync(join(s.stateDir, 'quick'))).toEqual(['notes']);
    expect(warnings(s.events)).toEqual([expect.objectContaining({ id: 'quick', left: ['notes'] })]);
  });

  it('a file at the top of the state dir is left alone with a warning, never an instance', async () => {
    const s = await opened();
    await s.launch('vm');
    writeFileSync(join(s.stateDir, 'README'), 'what this dir is\n');
    const report = await s.reopen();
    expect(report.adopted.map((a) => a.id)).toEqual(['vm']);
    expect(report.quarantined).toEqual([]);
    expect(warnings(s.events)).toEqual([
      expect.objectContaining({
        path: join(s.stateDir, 'README'),
        message: expect.stringMatching(/a regular file custody did not write; left alone/),
      }),
    ]);
    expect(s.supervisor.list().map((i) => i.id)).toEqual(['vm']);
    await s.supervisor.stop('vm', { graceMs: 2000 });
    expect(readFileSync(join(s.stateDir, 'README'), 'utf8')).toBe('what this dir is\n');
  });
});

describe(`ids and names (${backend.name})`, () => {
  it('one id rule at launch, checked before anything is touched: no leading dot, no path, no more than 128', async () => {
    const s = await opened();
    const before = readdirSync(s.stateDir).sort();
    for (const id of ['.vm', '...', '.', '..', 'a/b', '../x', 'a b', '', 'x'.repeat(129), 'ü', 'a\0b']) {
      await expect(s.supervisor.launch({ id, command: PERL, args: sleeperArgs })).rejects.toMatchObject({
        code: 'ERR_CUSTODY_INVALID_ARG',
      });
      await expect(s.supervisor.stop(id)).rejects.toMatchObject({ code: 'ERR_CUSTODY_INVALID_ARG' });
    }
    expect(readdirSync(s.stateDir).sort()).toEqual(before);
    for (const name of ['../x', 'a/b', '..', '.', 'a\0b', '', 'y'.repeat(256)]) {
      await expect(s.supervisor.release(name)).rejects.toMatchObject({ code: 'ERR_CUSTODY_INVALID_ARG' });
    }
    await expect(s.supervisor.release('not-there')).rejects.toMatchObject({ code: 'ERR_CUSTODY_NOT_FOUND' });
    // The longest and oddest ids that are valid work.
    for (const id of ['x'.repeat(128), '-_.9a', 'a..b']) {
      await s.launch(id);
      await s.supervisor.stop(id, { graceMs: 2000 });
    }
  });

  it('entries whose names are not ids (a 0.1 `.vm`, `bad id`, `...`) are quarantined, listed and releasable by that name, never signalled', async () => {
    const s = await opened();
    const log = join(s.root, 'signals.log');
    const inst = await s.launch('real', {
      args: (t: string) => [
        '-e',
        '$SIG{TERM} = sub { open my $f, ">>", $ARGV[1]; print $f "TERM\\n" }; sleep 300 while 1',
        t,
        log,
        MARKER,
      ],
    });
    const m = s.manifest('real');
    await s.supervisor.close();
    // As custody 0.1 accepted it: a leading dot, its live process carrying its token.
    s.plant('.vm', { ...m, version: 1, id: '.vm' });
    s.plant('bad id', { ...m, id: 'bad id' });
    mkdirSync(join(s.stateDir, '...'));
    const long = 'z'.repeat(200);
    mkdirSync(join(s.stateDir, long));
    const report = await s.reopen();
    expect(report.adopted).toEqual([{ id: 'real', pid: inst.pid }]);
    const names = ['...', '.vm', 'bad id', long];
    expect(report.quarantined.map((q) => [q.id, q.reason])).toEqual(names.map((n) => [n, 'bad-manifest']));
    for (const q of report.quarantined) expect(q.field).toMatch(/is not an instance id/);
    expect(
      s.supervisor
        .list()
        .filter((i) => i.status === 'quarantined')
        .map((i) => i.id),
    ).toEqual(names);
    for (const n of names) await s.supervisor.release(n);
    expect(s.events.filter((e) => e.type === 'release').map((e) => e.id)).toEqual(names);
    expect(readdirSync(s.stateDir).filter((n) => !/^\.(custody|lock|logs)/.test(n))).toEqual(['real']);
    expect(s.supervisor.list().map((i) => i.id)).toEqual(['real']);
    expect(loggedSignals(log)).toEqual([]);
    expect(isGone(inst.pid)).toBe(false);
  });

  it('releaseAll clears every quarantine at once, one release event each, nothing signalled', async () => {
    const s = await opened();
    const a = await s.launch('a');
    const b = await s.launch('b');
    const keep = await s.launch('keep');
    await s.supervisor.close();
    const ma = s.manifest('a');
    writeFileSync(
      join(s.stateDir, 'a', 'manifest.json'),
      JSON.stringify({ ...ma, identity: { ...ma.identity, startTicks: ma.identity.startTicks + 9 } }),
    );
    writeFileSync(join(s.stateDir, 'b', 'manifest.json'), '{ torn');
    s.plant('bad id', { ...ma, id: 'bad id' });
    const report = await s.reopen();
    expect(report.adopted).toEqual([{ id: 'keep', pid: keep.pid }]);
    expect(report.quarantined.map((q) => `${q.id}:${q.reason}`)).toEqual([
      'a:reused',
      'b:bad-manifest',
      'bad id:bad-manifest',
    ]);
    const released = await s.supervisor.releaseAll();
    expect(released).toEqual(['a', 'b', 'bad id']);
    expect(s.events.filter((e) => e.type === 'release')).toEqual(
      released.map((id) => expect.objectContaining({ id, message: expect.stringMatching(/nothing was signalled/) })),
    );
    expect(s.supervisor.list()).toMatchObject([{ id: 'keep', status: 'running', pid: keep.pid }]);
    expect(readdirSync(s.stateDir).filter((n) => !n.startsWith('.'))).toEqual(['keep']);
    expect([a.pid, b.pid].map(isGone)).toEqual([false, false]);
    expect(await s.supervisor.releaseAll()).toEqual([]);
  });
});

describe(`the manifest decoder (${backend.name})`, () => {
  /** Decodes what custody wrote for a live instance, with identity fields replaced. */
  async function decoder() {
    const s = await opened();
    await s.launch('vm');
    const m = s.manifest('vm');
    return (identity: Record<string, unknown>, version = 3) =>
      decodeManifest(JSON.stringify({ ...m, version, identity: { ...m.identity, ...identity } }), 'm', 'vm');
  }

  it('reads versions 1, 2 and 3, with pidNs absent, null or an inode number, and nothing else', async () => {
    const decode = await decoder();
    for (const version of [1, 2, 3]) expect(decode({}, version).version).toBe(version);
    expect(decode({ pidNs: null }).identity).toMatchObject({ pidNs: null });
    expect(decode({ pidNs: 4026531836 }).identity).toMatchObject({ pidNs: 4026531836 });
    for (const pidNs of [-1, 1.5, '4026531836', 2 ** 60, true, {}])
      expect(() => decode({ pidNs })).toThrow(/identity\.pidNs/);
    expect(() => decode({}, 4)).toThrow(/unknown schema version 4/);
  });

  it('takes identity.pid only as a pid, 1 to pid_max', async () => {
    const decode = await decoder();
    expect(decode({ pid: pidMax() }).identity!.pid).toBe(pidMax());
    for (const pid of [0, pidMax() + 1, -3, 2.5])
      expect(() => decode({ pid })).toThrow(/identity\.pid is not an integer from 1 to/);
  });

  it('each state carries its own fields only: a mix custody never writes is a bad manifest', async () => {
    const s = await opened();
    await s.launch('vm');
    const m = s.manifest('vm') as unknown as Record<string, unknown>;
    const decode = (more: Record<string, unknown>) => decodeManifest(JSON.stringify({ ...m, ...more }), 'm', 'vm');
    const q = { reason: 'reused', field: 'startTicks', at: new Date().toISOString() };
    // What custody writes: a starting one without identity, a running one with it, a quarantine with its record.
    expect(decode({ state: 'starting', identity: null }).state).toBe('starting');
    const held = decode({ state: 'quarantined', quarantine: q });
    expect(held.state === 'quarantined' && held.quarantine.reason).toBe('reused');
    expect(decode({ state: 'quarantined', identity: null, quarantine: q }).identity).toBeNull();
    expect(() => decode({ identity: null })).toThrow(/a running manifest has no identity/);
    // Version 3 keeps the confirmed identity on a starting manifest (readiness pending); no earlier version did.
    expect(decode({ state: 'starting' }).identity).toEqual(m.identity);
    expect(() => decode({ state: 'starting', version: 2 })).toThrow(/a starting manifest has an identity/);
    // A stop under way: its identity and when it began.
    const since = new Date().toISOString();
    expect(decode({ state: 'stopping', stoppingSince: since }).state).toBe('stopping');
    expect(() => decode({ state: 'stopping' })).toThrow(/stoppingSince is malformed/);
    expect(() => decode({ state: 'stopping', stoppingSince: since, identity: null })).toThrow(
      /a stopping manifest has no identity/,
    );
    expect(() => decode({ state: 'stopping', stoppingSince: since, version: 2 })).toThrow(/unknown state "stopping"/);
    expect(() => decode({ quarantine: q })).toThrow(/a running manifest has a quarantine/);
    expect(() => decode({ state: 'quarantined' })).toThrow(/a quarantined manifest has no quarantine/);
    // A main process named by MAINPID=: only ever true, and only where the launch had a notify socket.
    const notify = `custody/notify/${'a'.repeat(32)}`;
    expect(decode({ notify, handedOff: true }).handedOff).toBe(true);
    for (const handedOff of [false, 'true', 1, null])
      expect(() => decode({ notify, handedOff })).toThrow(/handedOff is malformed/);
    expect(() => decode({ handedOff: true })).toThrow(/handedOff is malformed/);
    // A systemd unit's cgroup is flagged as such (custody never removes it); the flag is true or absent.
    const unit = { path: '/sys/fs/cgroup/system.slice/vm-x.service', id: '123', unit: true };
    expect(decode({ cgroup: unit }).cgroup).toEqual(unit);
    for (const bad of [false, 1, 'yes'])
      expect(() => decode({ cgroup: { ...unit, unit: bad } })).toThrow(/cgroup\.unit is malformed/);
  });

  it('a manifest with a pid beyond pid_max is quarantined as a bad manifest; open does not fail', async () => {
    const s = await opened();
    const inst = await s.launch('real');
    const m = s.manifest('real');
    await s.supervisor.close();
    s.plant('far', { ...m, id: 'far', identity: { ...m.identity, pid: pidMax() + 1 } });
    const report = await s.reopen();
    expect(report.adopted).toEqual([{ id: 'real', pid: inst.pid }]);
    expect(report.quarantined).toEqual([
      { id: 'far', reason: 'bad-manifest', field: expect.stringMatching(/identity\.pid is not an integer from 1 to/) },
    ]);
  });
});

describe(`writes that fail (${backend.name})`, () => {
  it('a first manifest write that fails (ENOSPC) leaves no instance dir, and nothing is spawned', async (ctx) => {
    ctx.skip(!isRoot(), 'needs root: mounts a tiny tmpfs');
    const fsDir = tmpDir('custody-tiny-');
    execFileSync('mount', ['-t', 'tmpfs', '-o', 'size=64k,mode=0700', 'custody-test', fsDir.path]);
    cleanups.push(() => {
      execFileSync('umount', ['-l', fsDir.path]);
      fsDir.cleanup();
    });
    const stateDir = join(fsDir.path, 'state');
    const { supervisor } = await Supervisor.open({ stateDir, onEvent: () => {} });
    cleanups.push(() => supervisor.close());
    try {
      execFileSync('dd', ['if=/dev/zero', `of=${join(fsDir.path, 'ballast')}`, 'bs=4k'], { stdio: 'ignore' });
    } catch {
      // "No space left on device": the point
    }
    for (let i = 0; i < 20; i++) {
      const err = await supervisor.launch({ id: `full-${i}`, command: PERL, args: sleeperArgs }).catch((e) => e);
      expect(err).toMatchObject({ code: 'ERR_CUSTODY_STATE_IO', cause: { code: 'ENOSPC' } });
    }
    expect(readdirSync(stateDir).filter((n) => !n.startsWith('.'))).toEqual([]);
    expect(processesWithMarker(MARKER)).toEqual([]);
  });

  it('1 000 launches failing on a 64-fd limit leave nothing to clean', { timeout: 180_000 }, async () => {
    const dir = tmpDir('custody-emfile-');
    cleanups.push(() => dir.cleanup());
    const stateDir = join(dir.path, 'state');
    // A child of its own whose limit is 64, so this worker keeps its fds.
    const script = `
      const { openSync, closeSync, readdirSync } = await import('node:fs');
      const { Supervisor } = await import(${JSON.stringify(DIST)});
      const steps = {};
      const warnings = new Set();
      const onEvent = (e) => {
        steps[e.type] = (steps[e.type] ?? 0) + 1;
        if (e.type === 'warning') warnings.add(e.message);
      };
      const { supervisor } = await Supervisor.open({ stateDir: ${JSON.stringify(stateDir)}, onEvent });
      const hoard = [];
      try { for (;;) hoard.push(openSync('/dev/null', 'r')); } catch (e) { if (e.code !== 'EMFILE') throw e; }
      const codes = {};
      let launched = 0;
      for (let i = 0; i < 1000; i++) {
        // 0 to 3 fds free: the failure lands in the first write, or after it (the logs, the spawn, confirm) and is abandoned.
        for (const fd of hoard.splice(0, i % 4)) closeSync(fd);
        try {
          await supervisor.launch({ id: 'fd-' + i, command: ${JSON.stringify(PERL)}, args: (t) => ['-e', 'sleep 300', t, ${JSON.stringify(MARKER)}] });
          launched++;
          await supervisor.stop('fd-' + i, { graceMs: 2000 });
        } catch (e) {
          const code = e.cause?.code ?? e.code;
          codes[code] = (codes[code] ?? 0) + 1;
        }
        try { for (;;) hoard.push(openSync('/dev/null', 'r')); } catch (e) { if (e.code !== 'EMFILE') throw e; }
      }
      for (const fd of hoard) closeSync(fd);
      const list = supervisor.list();
      await supervisor.close();
      console.log(JSON.stringify({ codes, steps, warnings: [...warnings], launched, list, left: readdirSync(${JSON.stringify(stateDir)}).filter((n) => !/^\\.(custody|logs|lock(\\.\\d+)?)$/.test(n)) }));`;
    const r = await underFdLimit(script, 170_000);
    console.log(
      `${backend.name}: 1000 launches at the fd limit: ${JSON.stringify(r.codes)}, ${r.launched} got through (and were stopped); events ${JSON.stringify(r.steps)}; warnings ${JSON.stringify(r.warnings)}`,
    );
    expect(r.left).toEqual([]);
    expect(r.list).toEqual([]);
    // Half fail at the first write; the others fail after it and are abandoned, or get through and are stopped.
    const failed = Object.values(r.codes as Record<string, number>).reduce((x, y) => x + y, 0);
    expect(failed + r.launched).toBe(1000);
    expect(r.codes.EMFILE).toBeGreaterThanOrEqual(500);
    expect(r.steps.abandon).toBeGreaterThan(0);
    expect(processesWithMarker(MARKER)).toEqual([]);
  });
  it('an attempt undone with no fd to scan with still ends what is its own, and says the rest is unproven', async () => {
    const dir = tmpDir('custody-undo-');
    cleanups.push(() => dir.cleanup());
    // abandon() itself, in a child whose fd table is then filled: the child it spawned must end all the same.
    const script = `
      const { openSync, closeSync } = await import('node:fs');
      const { spawn } = await import(${JSON.stringify(DIST)});
      const { abandon } = await import(${JSON.stringify(join(DIST, '..', 'lifecycle', 'abandon.js'))});
      const token = 'f'.repeat(32);
      const child = spawn(${JSON.stringify(PERL)}, ['-e', 'sleep 300', token, ${JSON.stringify(MARKER)}], { stdio: 'ignore', detached: true });
      const a = { id: 'undo', token, argv: [], expect: [], executable: null, paths: [], pidSpec: 'child', launcherExits: true,
        child, target: child, identity: null, stderrTail: () => undefined, stdoutTail: () => undefined };
      const hoard = [];
      try { for (;;) hoard.push(openSync('/dev/null', 'r')); } catch (e) { if (e.code !== 'EMFILE') throw e; }
      let error = null;
      try { await abandon(a, 500, () => {}); } catch (e) { error = e.code; }
      for (const fd of hoard) closeSync(fd);
      console.log(JSON.stringify({ error, pid: child.pid, exit: child.exitStatus ?? null }));`;
    const r = await underFdLimit(script, 60_000);
    expect(r.error).toBe('EMFILE');
    expect(r.exit).toMatchObject({ signal: 'SIGTERM' });
    expect(goneFrom(r.pid)).toBe(true);
    expect(processesWithMarker(MARKER)).toEqual([]);
  });
});

describe(`declared paths (${backend.name})`, () => {
  it('removes sockets and regular files only, never through a symlink; every other finding is a warning', async () => {
    const root = tmpDir('custody-paths-');
    cleanups.push(() => root.cleanup());
    const p = (n: string) => join(root.path, n);
    writeFileSync(p('pidfile'), '123');
    // Listening while removed: Node unlinks its socket when the server closes.
    const server = createServer();
    await new Promise<void>((r) => server.listen(p('vm.sock'), r));
    cleanups.push(() => new Promise<void>((r) => server.close(() => r())));
    writeFileSync(p('target'), 'not to be removed');
    symlinkSync(p('target'), p('link'));
    mkdirSync(p('dir'));
    execFileSync('mkfifo', [p('fifo')]);
    const events: CustodyEvent[] = [];
    const removed = removeDeclaredPaths(
      [p('pidfile'), p('vm.sock'), p('link'), p('dir'), p('fifo'), p('missing')],
      emitter((e) => events.push(e)),
      'vm',
    );
    expect(removed).toEqual([p('pidfile'), p('vm.sock')]);
    expect(
      events.map((e) => [e.type, e.id, e.type === 'warning' ? e.path : null, e.message.replace(/.* is /, '')]),
    ).toEqual([
      ['warning', 'vm', p('link'), 'a symlink (never followed), not a socket or regular file: left alone'],
      ['warning', 'vm', p('dir'), 'a directory, not a socket or regular file: left alone'],
      ['warning', 'vm', p('fifo'), 'a FIFO, not a socket or regular file: left alone'],
    ]);
    expect(readFileSync(p('target'), 'utf8')).toBe('not to be removed');
    expect(lstatSync(p('link')).isSymbolicLink()).toBe(true);
  });

  it('a removal that fails is reported, not swallowed', async (ctx) => {
    ctx.skip(!isRoot(), 'needs root: a read-only bind mount gives EROFS');
    const root = tmpDir('custody-paths-');
    cleanups.push(() => root.cleanup());
    const p = (n: string) => join(root.path, n);
    mkdirSync(p('dir'));
    writeFileSync(p('dir/stuck'), 'x');
    execFileSync('mount', ['--bind', '-o', 'ro', p('dir'), p('dir')]);
    cleanups.push(() => void execFileSync('umount', ['-l', p('dir')]));
    const events: CustodyEvent[] = [];
    expect(
      removeDeclaredPaths(
        [p('dir/stuck')],
        emitter((e) => events.push(e)),
      ),
    ).toEqual([]);
    expect(events).toEqual([
      expect.objectContaining({
        type: 'warning',
        path: p('dir/stuck'),
        message: expect.stringMatching(/could not be removed: .*EROFS/),
      }),
    ]);
  });

  it('a stop whose declared paths are not its own to remove warns and still succeeds', async () => {
    const s = await opened();
    const keep = join(s.root, 'keep');
    mkdirSync(keep);
    chmodSync(keep, 0o700);
    await s.launch('vm', { paths: [keep] });
    expect(await s.supervisor.stop('vm', { graceMs: 2000 })).toMatchObject({ outcome: 'exited' });
    expect(existsSync(keep)).toBe(true);
    // Once before the launch (a stale path would make readiness lie), once at the stop.
    expect(warnings(s.events).map((e) => e.path)).toEqual([keep, keep]);
  });
});
