/**
 * The kernel truths identity must respect, each against real processes:
 * exec is a seam, /proc may be another pid namespace's, a zombie leader with
 * live threads is alive and a TID is not a process, argv is bytes, numbers
 * are range-checked at every boundary, and exhaustion is never an answer.
 */
import { execFileSync, spawn as cpSpawn, type ChildProcess } from 'node:child_process';
import { existsSync, readdirSync, readFileSync, statSync, writeFileSync, mkdirSync } from 'node:fs';
import { createRequire } from 'node:module';
import { join } from 'node:path';
import fc from 'fast-check';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { packageRoot } from '../src/backend/addon.js';
import { backend } from '../src/backend/index.js';
import { decodeArg, displayArg, encodeArg } from '../src/bytes.js';
import { inspect, open, spawn, Supervisor, sweep, verify, type ProcessIdentity } from '../src/index.js';
import { compileC, copyAs } from './helpers/cprog.js';
import { expectNoLeaks } from './helpers/leaks.js';
import { exited, killAndWait, MARKER, procStat, tmpDir, waitFor } from './helpers/procs.js';
import { DIST, NodeChild } from './helpers/state.js';
import { FIXTURES, openSupervisor, PERL } from './helpers/supervisor.js';

expectNoLeaks();

const SOAK = process.env.CUSTODY_SOAK === '1';
const isRoot = process.getuid?.() === 0;
// The addon's own decoding, loaded directly, so the js backend's can be compared with it.
const addon = createRequire(import.meta.url)('node-gyp-build')(packageRoot) as { decodeBytes(b: Buffer): string };

let bin: { path: string; cleanup: () => void };
let launcher: string;
let target: string;
let leaderExit: string;
beforeAll(() => {
  bin = tmpDir('custody-cbin-');
  const built = compileC('exec-race', bin.path);
  launcher = copyAs(built, join(bin.path, 'race-launcher'));
  target = copyAs(built, join(bin.path, 'race-target'));
  leaderExit = compileC('leader-exit', bin.path, ['-pthread']);
});
afterAll(() => bin.cleanup());

const exeOf = (path: string) => {
  const st = statSync(path);
  return { dev: st.dev, ino: st.ino };
};
const sameExe = (a: ProcessIdentity['exe'], b: { dev: number; ino: number }) =>
  a !== null && a.dev === b.dev && a.ino === b.ino;

describe(`exec is a seam (${backend.name})`, () => {
  it('every inspection of a launcher caught exec-ing at a random instant is all launcher or all target', async () => {
    const spawns = SOAK ? 2000 : 200;
    const [lExe, tExe] = [exeOf(launcher), exeOf(target)];
    let mixed = 0;
    let sawBoth = 0;
    let reads = 0;
    for (let i = 0; i < spawns; i++) {
      const token = `tok${i}`;
      const child = cpSpawn(launcher, ['--launch', target, token, 'vm-x'], { stdio: 'ignore' });
      let sawLauncher = false;
      try {
        const deadline = Date.now() + 2000;
        for (;;) {
          let id: ProcessIdentity;
          try {
            id = inspect(child.pid!);
          } catch (err) {
            if ((err as NodeJS.ErrnoException).code === 'EAGAIN') continue;
            throw err;
          }
          reads++;
          const asLauncher = sameExe(id.exe, lExe) && id.argv[1] === '--launch';
          const asTarget = sameExe(id.exe, tExe) && id.argv[1] === '--target';
          // Between clone and exec the child is briefly node's own fork: neither, and not mixed either.
          const forkOfNode = id.argv[1] !== '--launch' && id.argv[1] !== '--target';
          if (!asLauncher && !asTarget && !forkOfNode) mixed++;
          sawLauncher ||= asLauncher;
          if (asTarget) break;
          if (Date.now() > deadline) throw new Error(`pid ${child.pid} never exec'd into the target`);
        }
        if (sawLauncher) sawBoth++;
      } finally {
        await killAndWait(child);
      }
    }
    expect(mixed).toBe(0);
    // The race was really run: most launches were seen before and after their exec.
    expect(sawBoth).toBeGreaterThan(spawns / 2);
    expect(reads).toBeGreaterThan(spawns * 2);
  }, 120_000);

  it('confirm records the target, never the launcher argv with the target exe', async () => {
    const launches = SOAK ? 2000 : 60;
    const ctx = await openSupervisor();
    try {
      for (let i = 0; i < launches; i++) {
        const inst = await ctx.supervisor.launch({
          id: `race-${i}`,
          command: launcher,
          args: (t) => ['--launch', target, t, 'vm-x'],
          executable: target,
          expect: ['vm-x'],
        });
        expect(inst.identity.argv).toEqual([target, '--target', inst.token, 'vm-x']);
        expect(verify(inst.identity)).toEqual({ verdict: 'ok' });
        await ctx.supervisor.stop(inst.id, { graceMs: 1000 });
      }
    } finally {
      await ctx.dispose();
    }
  }, 300_000);
});

/** Runs the namespace fixture under unshare; returns the child and a reader of its JSON lines. */
function inNamespace(
  args: string[],
  mountProc: boolean,
): { child: ChildProcess; next: () => Promise<Record<string, unknown>> } {
  const child = cpSpawn(
    'unshare',
    [
      '--pid',
      '--fork',
      '--kill-child',
      ...(mountProc ? ['--mount', '--mount-proc'] : []),
      process.execPath,
      join(FIXTURES, 'ns-identity.mjs'),
      ...args,
    ],
    { stdio: ['pipe', 'pipe', 'inherit'] },
  );
  const lines: string[] = [];
  const waiters: Array<(l: string) => void> = [];
  let buf = '';
  child.stdout!.on('data', (d: Buffer) => {
    buf += d.toString();
    for (let nl = buf.indexOf('\n'); nl >= 0; nl = buf.indexOf('\n')) {
      const line = buf.slice(0, nl);
      buf = buf.slice(nl + 1);
      const w = waiters.shift();
      if (w) w(line);
      else lines.push(line);
    }
  });
  const next = () =>
    new Promise<Record<string, unknown>>((resolve, reject) => {
      const timer = setTimeout(() => reject(new Error('no line from the namespace fixture in 20 s')), 20_000);
      const take = (l: string) => (clearTimeout(timer), resolve(JSON.parse(l)));
      const l = lines.shift();
      if (l !== undefined) take(l);
      else waiters.push(take);
    });
  return { child, next };
}

describe.runIf(isRoot)(`pid namespaces (${backend.name})`, () => {
  it('a /proc of another pid namespace is refused by inspect, open, sweep and recovery, with a code', async () => {
    const dir = tmpDir();
    const { child, next } = inNamespace(['foreign', join(dir.path, 'state')], false);
    try {
      const r = await next();
      expect(r.pid).toBe(1);
      expect(r).toMatchObject({
        inspect: 'ERR_CUSTODY_FOREIGN_PROC',
        open: 'ERR_CUSTODY_FOREIGN_PROC',
        sweep: 'ERR_CUSTODY_FOREIGN_PROC',
        supervisor: 'ERR_CUSTODY_FOREIGN_PROC',
      });
      await exited(child);
    } finally {
      await killAndWait(child);
      dir.cleanup();
    }
  });

  it('a manifest written in another pid namespace is unprovable (kept, nothing removed), and adoptable in its own', async () => {
    const dir = tmpDir();
    const stateDir = join(dir.path, 'state');
    const sock = join(dir.path, 'vm.sock');
    const { child, next } = inNamespace(['launch', stateDir, PERL, sock], true);
    try {
      const inner = await next();
      const manifest = JSON.parse(readFileSync(join(stateDir, 'vm', 'manifest.json'), 'utf8'));
      expect(manifest.identity.pidNs).toBe(inner.pidNs);
      expect(manifest.identity.pidNs).not.toBe(inspect(process.pid).pidNs);
      // Whatever runs at that pid here (or nothing) says nothing about it.
      expect(verify(manifest.identity)).toEqual({ verdict: 'unprovable', field: 'pidNs' });
      const { supervisor, report } = await Supervisor.open({ stateDir, onEvent: () => {} });
      try {
        expect(report.cleaned).toEqual([]);
        expect(report.quarantined).toEqual([
          expect.objectContaining({ id: 'vm', reason: 'unprovable', field: 'pidNs' }),
        ]);
        expect(existsSync(sock)).toBe(true);
        await expect(supervisor.stop('vm')).rejects.toMatchObject({ code: 'ERR_CUSTODY_QUARANTINED' });
      } finally {
        await supervisor.close();
      }
      // Not persisted as quarantined: back in its namespace it is adopted and stopped.
      child.stdin!.write('go\n');
      const after = await next();
      expect(after).toMatchObject({ line: 'go', adopted: ['vm'], stop: { outcome: 'exited' } });
      await exited(child);
    } finally {
      await killAndWait(child);
      dir.cleanup();
    }
  });
});

describe(`threads (${backend.name})`, () => {
  const startLeaderExit = () => cpSpawn(leaderExit, [], { stdio: 'ignore' });
  const leaderIsZombie = (pid: number) => procStat(pid)?.[0] === 'Z';

  it('a process whose main thread exited while a worker runs is alive; its TID is not a process', async () => {
    const child = startLeaderExit();
    try {
      await waitFor(() => leaderIsZombie(child.pid!), 5000, 'the leader to exit');
      const id = inspect(child.pid!);
      expect(id.state).not.toBe('Z');
      expect(id.argv).toEqual([leaderExit]);
      expect(id.exe).toEqual(exeOf(leaderExit));
      expect(verify(id)).toEqual({ verdict: 'ok' });
      const tid = Number(readdirSync(`/proc/${child.pid}/task`).find((t) => t !== String(child.pid)));
      expect(() => inspect(tid)).toThrow(
        expect.objectContaining({ code: 'ERR_CUSTODY_NOT_A_PROCESS', tgid: child.pid }),
      );
      expect(() => open(tid)).toThrow(expect.objectContaining({ code: 'ERR_CUSTODY_NOT_A_PROCESS' }));
      const h = open(child.pid!);
      try {
        expect(h.isAlive()).toBe(true);
      } finally {
        h.close();
      }
    } finally {
      await killAndWait(child);
    }
  });

  it('is launched, watched, recovered and stopped as alive; a pid function returning a TID is refused', async () => {
    const ctx = await openSupervisor();
    try {
      // The token rides as an extra argument, which the program ignores.
      const inst = await ctx.supervisor.launch({
        id: 'mt',
        command: leaderExit,
        args: (t) => [t],
        confirmTimeoutMs: 500,
      });
      await waitFor(() => leaderIsZombie(inst.pid), 5000, 'the leader to exit');
      // Longer than the js exit poller's period: it must not take the zombie leader for an exit.
      await new Promise((r) => setTimeout(r, 300));
      expect(ctx.supervisor.list()).toMatchObject([{ id: 'mt', status: 'running' }]);
      await ctx.supervisor.close();
      const { supervisor, report } = await Supervisor.open({ stateDir: ctx.stateDir, onEvent: () => {} });
      try {
        expect(report.adopted).toEqual([expect.objectContaining({ id: 'mt' })]);
        expect(await supervisor.stop('mt', { graceMs: 2000 })).toMatchObject({ outcome: 'exited', escalated: false });
        expect(procStat(inst.pid)).toBeNull();
        const other = startLeaderExit();
        try {
          await waitFor(() => readdirSync(`/proc/${other.pid}/task`).length > 1, 5000, 'the worker thread');
          const tid = Number(readdirSync(`/proc/${other.pid}/task`).find((t) => t !== String(other.pid)));
          await expect(
            supervisor.launch({ id: 'tid', command: PERL, args: (t) => ['-e', 'sleep 5', '--', t], pid: () => tid }),
          ).rejects.toMatchObject({
            code: 'ERR_CUSTODY_NOT_A_PROCESS',
          });
        } finally {
          await killAndWait(other);
        }
      } finally {
        await supervisor.close();
      }
    } finally {
      await ctx.dispose();
    }
  });
});

describe(`argv is bytes (${backend.name})`, () => {
  /** A perl that re-execs itself with the given bytes as its last arguments, so argv holds exactly those bytes. */
  const withBytes = (args: Buffer[]) =>
    cpSpawn(
      PERL,
      [
        '-e',
        'exec {$^X} $^X, "-e", "sleep 30", "--", map { pack "H*", $_ } @ARGV',
        ...args.map((a) => a.toString('hex')),
      ],
      { stdio: 'ignore' },
    );
  const settled = async (child: ChildProcess, argc: number) =>
    waitFor(
      () => {
        const id = inspect(child.pid!);
        return id.argv.length === argc && id.argv[2] === 'sleep 30' ? id : null;
      },
      5000,
      'the re-exec',
    );

  it('random byte argv reads back byte-identical, decodes as the addon decodes it, and round-trips a manifest', async () => {
    const arg = fc
      .uint8Array({ minLength: 0, maxLength: 12 })
      .map((a) => Buffer.from(a.map((b) => (b === 0 ? 0xff : b))));
    await fc.assert(
      fc.asyncProperty(fc.array(arg, { minLength: 1, maxLength: 5 }), async (args) => {
        const child = withBytes(args);
        try {
          const id = await settled(child, 4 + args.length);
          const got = id.argv.slice(4);
          expect(got.map(encodeArg)).toEqual(args);
          expect(got).toEqual(args.map((a) => addon.decodeBytes(a)));
          expect(got).toEqual(args.map(decodeArg));
          expect(JSON.parse(JSON.stringify(id)).argv).toEqual(id.argv);
        } finally {
          await killAndWait(child);
        }
      }),
      { numRuns: SOAK ? 200 : 25 },
    );
  }, 120_000);

  it('a sweep pattern names one byte string: bytes, escapes and U+FFFD never match each other', async () => {
    const invalid = Buffer.from([0x76, 0x6d, 0xff]);
    const replacement = Buffer.from('vm\ufffd', 'utf8');
    const cafe = Buffer.from('vm-café', 'utf8');
    const kids = [withBytes([invalid]), withBytes([replacement]), withBytes([cafe])];
    try {
      await Promise.all(kids.map((k) => settled(k, 5)));
      const pids = kids.map((k) => k.pid);
      const prefix = [PERL, '-e', 'sleep 30', '--'];
      const matched = async (last: string | Buffer) =>
        (await sweep({ argv: [...prefix, last], dryRun: true })).matched.map((m) => m.pid);
      expect(await matched(invalid)).toEqual([pids[0]]);
      expect(await matched('vm\udcff')).toEqual([pids[0]]);
      expect(await matched('vm\ufffd')).toEqual([pids[1]]);
      expect(await matched('vm-café')).toEqual([pids[2]]);
      expect(displayArg(inspect(pids[0]!).argv[4]!)).toBe('vm\\xff');
      await expect(sweep({ argv: [...prefix, 'vm\ud800'], dryRun: true })).rejects.toMatchObject({
        code: 'ERR_CUSTODY_INVALID_ARG',
      });
    } finally {
      await Promise.all(kids.map(killAndWait));
    }
  });
});

describe(`paths are bytes (${backend.name})`, () => {
  it('a command or cwd with an escaped byte names that file, never its U+FFFD twin; js refuses it with a code', async () => {
    const dir = tmpDir();
    try {
      // Two scripts and two dirs whose names differ only as 0xff against U+FFFD (EF BF BD).
      const raw = (name: Buffer) => Buffer.concat([Buffer.from(`${dir.path}/`), name]);
      const ff = Buffer.from([0x78, 0xff]);
      const fffd = Buffer.from('x\ufffd', 'utf8');
      for (const [name, says] of [
        [ff, 'ff'],
        [fffd, 'fffd'],
      ] as const) {
        writeFileSync(
          raw(name),
          `#!/bin/sh\necho ${says} "$(printf %s "$(pwd)" | od -An -tx1 | tr -d ' \\n' | tail -c 4)"\n`,
          { mode: 0o755 },
        );
        mkdirSync(raw(Buffer.concat([Buffer.from('d'), name])));
      }
      const command = `${dir.path}/x\udcff`;
      const cwd = `${dir.path}/dx\udcff`;
      const run = () => spawn(command, [], { cwd, stdio: ['ignore', 'pipe', 'ignore'] });
      if (backend.name === 'js') {
        expect(run).toThrow(expect.objectContaining({ code: 'ERR_CUSTODY_UNSUPPORTED' }));
        return;
      }
      const h = run();
      let out = '';
      h.stdout!.on('data', (d: Buffer) => (out += d));
      await h.exited;
      await waitFor(() => (out.includes('\n') ? out : null), 5000, 'the output');
      // The 0xff script ran, in the 0xff dir (its cwd's last byte, in hex).
      expect(out.trim()).toBe('ff 78ff');
      h.close();
    } finally {
      dir.cleanup();
    }
  });
});

describe(`numbers (${backend.name})`, () => {
  it('a pid past 2^32 never pins the pid it would wrap to', () => {
    expect(() => inspect(2 ** 32 + process.pid)).toThrow(expect.objectContaining({ code: 'ERR_CUSTODY_INVALID_ARG' }));
    expect(() => open(2 ** 32 + process.pid)).toThrow(expect.objectContaining({ code: 'ERR_CUSTODY_INVALID_ARG' }));
    const raw = createRequire(import.meta.url)('node-gyp-build')(packageRoot);
    for (const call of [
      () => raw.pidfdOpen(2 ** 32 + process.pid),
      () => raw.inspect(2 ** 32 + process.pid),
      () => raw.close(2 ** 31),
    ]) {
      expect(call).toThrow(expect.objectContaining({ code: 'ERR_OUT_OF_RANGE' }));
    }
  });

  it('a manifest whose pid is out of range is quarantined as bad-manifest; open() does not fail', async () => {
    const ctx = await openSupervisor();
    try {
      const inst = await ctx.supervisor.launch({ id: 'big', command: PERL, args: (t) => ['-e', 'sleep 30', '--', t] });
      await ctx.supervisor.close();
      const path = join(ctx.stateDir, 'big', 'manifest.json');
      const m = JSON.parse(readFileSync(path, 'utf8'));
      writeFileSync(path, JSON.stringify({ ...m, identity: { ...m.identity, pid: 2 ** 32 + inst.pid } }));
      const { supervisor, report } = await Supervisor.open({ stateDir: ctx.stateDir, onEvent: () => {} });
      try {
        expect(report.quarantined).toEqual([expect.objectContaining({ id: 'big', reason: 'bad-manifest' })]);
        expect(procStat(inst.pid)?.[0]).not.toBe('Z');
      } finally {
        await supervisor.close();
        process.kill(inst.pid, 'SIGKILL');
        await waitFor(() => procStat(inst.pid) === null, 5000, 'the instance to go');
      }
    } finally {
      await ctx.dispose();
    }
  });
});

/** Runs the exhaustion fixture under a small fd limit with `free` fds left; returns its JSON line. */
function exhausted(mode: 'sweep' | 'recover', free: number, arg: string): Record<string, unknown> {
  const out = execFileSync(
    'sh',
    ['-c', `ulimit -n 96 && exec "$@"`, 'sh', process.execPath, join(FIXTURES, 'exhaust.mjs'), mode, String(free), arg],
    {
      encoding: 'utf8',
      timeout: 30_000,
    },
  );
  return JSON.parse(out.trim().split('\n').pop()!);
}

describe(`exhaustion is an error, not an answer (${backend.name})`, () => {
  it('with a few free fds a sweep fails with EMFILE or finds the process; it never reports no match', async () => {
    // The marker: the other backend's worker runs a twin of this test at the same time.
    const child = cpSpawn(PERL, ['-e', 'sleep 30', '--', 'exhaust-sweep-target', MARKER], { stdio: 'ignore' });
    try {
      await waitFor(() => inspect(child.pid!).argv.length === 6, 5000, 'perl to start');
      const results = [0, 1, 2, 3, 4].map((free) =>
        exhausted('sweep', free, JSON.stringify([PERL, '-e', 'sleep 30', '--', 'exhaust-sweep-target', MARKER])),
      );
      for (const r of results) {
        if (r.error === undefined) expect(r.matched).toEqual([child.pid]);
        else expect(r.error).toMatch(/^(EMFILE|ENFILE)$/);
      }
      expect(results.some((r) => r.error === 'EMFILE')).toBe(true);
    } finally {
      await killAndWait(child);
    }
  });

  it('recovery with a few free fds defers the instance (never cleans it); launch refuses it until a later recover()', async () => {
    const ctx = await openSupervisor();
    try {
      const inst = await ctx.supervisor.launch({ id: 'vm', command: PERL, args: (t) => ['-e', 'sleep 30', '--', t] });
      await ctx.supervisor.close();
      let deferred = 0;
      for (const free of [1, 2, 3, 4, 5, 6]) {
        const r = exhausted('recover', free, ctx.stateDir) as {
          error?: string;
          report?: Record<string, Array<{ id: string }>>;
          launch?: string;
          again?: Record<string, string[]>;
        };
        expect(existsSync(join(ctx.stateDir, 'vm', 'manifest.json'))).toBe(true);
        expect(procStat(inst.pid)?.[0]).toMatch(/^[RS]$/);
        if (r.error !== undefined) {
          // Too few fds to open the state dir at all: an error, nothing touched.
          expect(r.error).toMatch(/EMFILE|ERR_CUSTODY_STATE_IO/);
          continue;
        }
        expect(r.report!.cleaned).toEqual([]);
        expect(r.report!.quarantined).toEqual([]);
        if (r.report!.deferred!.length) {
          deferred++;
          expect(r.report!.deferred).toEqual([expect.objectContaining({ id: 'vm', reason: 'EMFILE' })]);
          expect(r.launch).toBe('ERR_CUSTODY_DEFERRED');
          expect(r.again!.adopted).toEqual(['vm']);
        } else {
          expect(r.report!.adopted).toEqual([expect.objectContaining({ id: 'vm' })]);
        }
      }
      // The addon holds a pidfd, a /proc dir fd and a file at once, so some
      // count of free fds defers; the js backend reads one file at a time and
      // either cannot open the state dir or has enough (never a wrong answer).
      if (backend.name === 'native') expect(deferred).toBeGreaterThan(0);
      const { supervisor } = await Supervisor.open({ stateDir: ctx.stateDir, onEvent: () => {} });
      await supervisor.stop('vm', { graceMs: 2000 });
      await supervisor.close();
    } finally {
      await ctx.dispose();
    }
  }, 60_000);

  it("a deferred instance that is gone by the supervisor's own next look is cleaned and forgotten: its id launches again", async () => {
    // The supervisor runs in a child whose fds are used up but for a few, so
    // that recovery defers 'vm'; then the test ends vm's process (its own,
    // by pid) and the child frees its fds. Nobody calls recover(): the
    // supervisor's retry (1 s on, doubling) cleans it.
    const script = (stateDir: string, free: number) => `
      const { closeSync, openSync } = await import('node:fs');
      const { createInterface } = await import('node:readline');
      const { Supervisor } = await import(${JSON.stringify(DIST)});
      const held = [];
      for (let i = 0; i < 100000; i++) {
        try { held.push(openSync('/dev/null', 'r')); } catch { break; }
      }
      for (let i = 0; i < ${free} && held.length; i++) closeSync(held.pop());
      let sup;
      const cleaned = [];
      const onEvent = (e) => { if (e.type === 'clean') cleaned.push(e.id); };
      try {
        ({ supervisor: sup } = await Supervisor.open({ stateDir: ${JSON.stringify(stateDir)}, onEvent }));
      } catch (e) {
        for (const fd of held) closeSync(fd);
        console.log(JSON.stringify({ error: e.code ?? String(e) }));
        process.exit(0);
      }
      for (const fd of held.splice(0)) closeSync(fd);
      const status = () => sup.list().find((i) => i.id === 'vm')?.status ?? null;
      console.log(JSON.stringify({ status: status() }));
      for await (const line of createInterface({ input: process.stdin })) {
        if (line !== 'go') continue;
        const out = {};
        for (let i = 0; i < 200 && status() !== null; i++) await new Promise((r) => setTimeout(r, 50));
        out.cleaned = cleaned;
        out.status = status();
        // The retry that cleaned it may still be finishing its recover() (ERR_CUSTODY_BUSY until then).
        for (let i = 0; i < 100; i++) {
          try {
            const inst = await sup.launch({ id: 'vm', command: ${JSON.stringify(PERL)}, args: (t) => ['-e', 'sleep 30', '--', t] });
            out.launched = inst.pid > 0;
            break;
          } catch (e) {
            out.launched = e.code;
            if (e.code !== 'ERR_CUSTODY_BUSY') break;
            await new Promise((r) => setTimeout(r, 50));
          }
        }
        if (status() === 'running') await sup.stop('vm', { graceMs: 2000 });
        await sup.close();
        console.log(JSON.stringify(out));
        break;
      }`;
    let sawDeferred = false;
    for (const free of [1, 2, 3, 4, 5, 6]) {
      const ctx = await openSupervisor();
      const child: { c?: NodeChild } = {};
      try {
        const inst = await ctx.supervisor.launch({ id: 'vm', command: PERL, args: (t) => ['-e', 'sleep 30', '--', t] });
        await ctx.supervisor.close();
        child.c = new NodeChild(script(ctx.stateDir, free), backend.name, { shell: 'ulimit -n 96' });
        const first = JSON.parse(await child.c.next()) as { error?: string; status?: string };
        if (first.error !== undefined || first.status !== 'deferred') {
          // Not deferred at this count (too few fds to open at all, or enough to adopt).
          await child.c.end();
          const { supervisor } = await Supervisor.open({ stateDir: ctx.stateDir, onEvent: () => {} });
          await supervisor.stop('vm', { graceMs: 2000 });
          await supervisor.close();
          continue;
        }
        sawDeferred = true;
        process.kill(inst.pid, 'SIGKILL');
        await waitFor(() => procStat(inst.pid) === null, 5000, 'the deferred instance to go');
        const after = JSON.parse(await child.c.ask('go')) as {
          cleaned: string[];
          status: string | null;
          launched: unknown;
        };
        expect(after).toEqual({ cleaned: ['vm'], status: null, launched: true });
        await child.c.end();
      } finally {
        await child.c?.end();
        await ctx.dispose();
      }
    }
    // The js backend holds no fd per instance and defers none here (see above).
    if (backend.name === 'native') expect(sawDeferred).toBe(true);
  }, 120_000);

  it('recovery of many instances with a few free fds: what cannot be pinned is deferred, nothing cleaned or quarantined', async () => {
    // More instances than free fds: every adopted one keeps its pidfd, the
    // native backend pins a batch ahead on the threadpool and reads the
    // manifests in batches there too, so EMFILE lands in the middle of a
    // batch, on reads and on pins alike.
    const COUNT = 40;
    const ctx = await openSupervisor();
    try {
      const ids = ['vm', ...Array.from({ length: COUNT - 1 }, (_, i) => `i${i}`)];
      const insts = await Promise.all(
        ids.map((id) => ctx.supervisor.launch({ id, command: PERL, args: (t) => ['-e', 'sleep 60', '--', t] })),
      );
      await ctx.supervisor.close();
      const outcomes: string[] = [];
      for (const free of [2, 8, 20, 48]) {
        const r = exhausted('recover', free, ctx.stateDir) as {
          error?: string;
          report?: Record<string, Array<{ id: string; reason?: string }>>;
          again?: Record<string, string[]>;
        };
        for (const inst of insts) expect(procStat(inst.pid)?.[0]).toMatch(/^[RS]$/);
        for (const id of ids) expect(existsSync(join(ctx.stateDir, id, 'manifest.json'))).toBe(true);
        if (r.error !== undefined) {
          expect(r.error).toMatch(/EMFILE|ERR_CUSTODY_STATE_IO/);
          outcomes.push(`${free}: ${r.error}`);
          continue;
        }
        const report = r.report!;
        expect(report.cleaned).toEqual([]);
        expect(report.quarantined).toEqual([]);
        for (const d of report.deferred!) expect(d.reason).toBe('EMFILE');
        const seen = [...report.adopted!, ...report.deferred!].map((e) => e.id).sort();
        expect(seen).toEqual([...ids].sort());
        // Once the held fds are freed, a second recover() adopts every deferred one.
        expect(r.again!.cleaned).toEqual([]);
        expect(r.again!.quarantined).toEqual([]);
        expect(r.again!.deferred).toEqual([]);
        outcomes.push(`${free}: ${report.adopted!.length} adopted, ${report.deferred!.length} deferred`);
      }
      // Some count of free fds got as far as a report with some deferred; the
      // js backend holds no fd per adopted instance, so it defers none.
      if (backend.name === 'native') {
        expect(
          outcomes.some((o) => / [1-9]\d* deferred/.test(o)),
          outcomes.join('; '),
        ).toBe(true);
      }
      const { supervisor, report } = await Supervisor.open({ stateDir: ctx.stateDir, onEvent: () => {} });
      expect(report.adopted.map((e) => e.id).sort()).toEqual([...ids].sort());
      await Promise.all(ids.map((id) => supervisor.stop(id, { graceMs: 2000 })));
      await supervisor.close();
    } finally {
      await ctx.dispose();
    }
  }, 90_000);
});

describe(`the parent is read live (${backend.name})`, () => {
  it("list() shows the daemon's parent after its launcher exits, not the one recorded at launch", async () => {
    const ctx = await openSupervisor();
    try {
      const dir = join(ctx.root, 'ppid');
      mkdirSync(dir);
      const pidFile = join(dir, 'd.pid');
      const inst = await ctx.supervisor.launch({
        id: 'd',
        command: '/bin/sh',
        args: (t) => ['-c', `${PERL} -e 'sleep 30' -- "$1" & echo $! > "$2"; sleep 0.3`, 'sh', t, pidFile],
        pid: { file: pidFile },
        launcherExits: false,
        executable: PERL,
      });
      const recordedParent = inst.identity.ppid;
      await waitFor(
        () => procStat(recordedParent) === null || procStat(recordedParent)?.[0] === 'Z',
        5000,
        'the launcher to exit',
      );
      const live = await waitFor(
        () => {
          const p = ctx.supervisor.list()[0]?.ppid;
          return p !== undefined && p !== null && p !== recordedParent ? p : null;
        },
        5000,
        'the re-parenting',
      );
      expect(live).toBe(Number(procStat(inst.pid)![1]));
    } finally {
      await ctx.dispose();
    }
  });
});
