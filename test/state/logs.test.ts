// Instance logs: by default, per instance, private, capped, kept after stop.
import { execFileSync } from 'node:child_process';
import {
  appendFileSync,
  closeSync,
  existsSync,
  lstatSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  renameSync,
  statSync,
  symlinkSync,
  truncateSync,
  utimesSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { spawn, Supervisor, type WarningEvent } from '../../src/index.js';
import { capLog, followLog, InstanceLogs, logPaths, openAppend, pruneLogs, readLogTail } from '../../src/state/logs.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { processesWithMarker } from '../helpers/leaks.js';
import { endOwn, goneSince, isGone, isRoot, MARKER, tmpDir, waitFor } from '../helpers/procs.js';
import { openSupervisor, PERL, PYTHON, vmArgs } from '../helpers/supervisor.js';

const cleanups = cleanupAfterEach({ marker: MARKER });

let ctx: Awaited<ReturnType<typeof openSupervisor>> | undefined;
afterEach(async () => {
  await ctx?.dispose();
  ctx = undefined;
});

/**
 * A tmpfs of `sizeKiB` on `dir` (root only): a real ENOSPC. Unmounted at
 * cleanup without -l, so a file still open on it fails the test; then it is
 * checked to be gone from the mount table.
 */
function mountTinyFs(dir: string, sizeKiB: number): void {
  execFileSync('mount', ['-t', 'tmpfs', '-o', `size=${sizeKiB}k,mode=0700`, 'custody-test', dir]);
  cleanups.push(() => {
    try {
      execFileSync('umount', [dir], { stdio: 'pipe' });
    } catch (err) {
      execFileSync('umount', ['-l', dir]);
      throw err;
    }
    expect(readFileSync('/proc/self/mountinfo', 'utf8')).not.toContain(` ${dir} `);
  });
}

function scratch(): string {
  const d = tmpDir('custody-logs-');
  cleanups.push(d.cleanup);
  return d.path;
}

/** Prints `out` on stdout and `err` on stderr, then serves like the fake VM (python -c). */
const CHATTY = `
import sys, os
sys.stdout.write(sys.argv[1] + "\\n"); sys.stdout.flush()
sys.stderr.write(sys.argv[2] + "\\n"); sys.stderr.flush()
os.execv(sys.executable, [sys.executable] + sys.argv[3:])
`;

const mode = (p: string) => statSync(p).mode & 0o777;
/** A readiness that never comes: the launch can only end by the process's exit. */
const never = () => () => new Promise<void>(() => {});

describe(`logs by default (${backend.name})`, () => {
  it('stdout and stderr go to <stateDir>/.logs/<id>/, private, and stay after stop', async () => {
    ctx = await openSupervisor();
    const socket = join(ctx.root, 'vm.sock');
    await ctx.supervisor.launch({
      id: 'vm',
      command: PYTHON,
      args: (t) => ['-c', CHATTY, 'hello out', 'hello err', ...vmArgs(socket, t)],
      ready: { socket },
    });
    const files = logPaths(ctx.stateDir, 'vm');
    expect(files.dir).toBe(join(ctx.stateDir, '.logs', 'vm'));
    await waitFor(
      () => existsSync(files.stderr) && readFileSync(files.stderr, 'utf8').includes('hello err'),
      5000,
      'stderr log',
    );
    expect(readFileSync(files.stdout, 'utf8')).toBe('hello out\n');
    expect([mode(join(ctx.stateDir, '.logs')), mode(files.dir), mode(files.stdout), mode(files.stderr)]).toEqual([
      0o700, 0o700, 0o600, 0o600,
    ]);
    await ctx.supervisor.stop('vm', { graceMs: 5000 });
    // Post-mortem: the instance's state is gone, its logs are not.
    expect(existsSync(join(ctx.stateDir, 'vm'))).toBe(false);
    expect(readLogTail(files.stderr)).toBe('hello err\n');
  });

  it('every LAUNCH_EXITED carries the stderr tail, read from the log; a relaunch starts fresh files and keeps the last run as .1', async () => {
    ctx = await openSupervisor();
    const socket = join(ctx.root, 'f.sock');
    const files = logPaths(ctx.stateDir, 'f');
    await expect(
      ctx.supervisor.launch({
        id: 'f',
        command: PYTHON,
        args: (t) => vmArgs(socket, t, ['--fail-before-socket', '3']),
        ready: { socket },
      }),
    ).rejects.toMatchObject({
      code: 'ERR_CUSTODY_LAUNCH_EXITED',
      exitCode: 3,
      stderrTail: 'fake-vm: cannot open disk image\n',
    });
    const inst = await ctx.supervisor.launch({
      id: 'f',
      command: PYTHON,
      args: (t) => ['-c', CHATTY, 'second out', 'second err', ...vmArgs(socket, t)],
      ready: { socket },
    });
    await waitFor(() => readFileSync(files.stderr, 'utf8').includes('second err'), 5000, 'second run');
    expect(readFileSync(files.stderr, 'utf8')).toBe('second err\n');
    expect(readFileSync(`${files.stderr}.1`, 'utf8')).toBe('fake-vm: cannot open disk image\n');
    await ctx.supervisor.stop('f', { graceMs: 5000 });
    expect(isGone(inst.pid)).toBe(true);
    // keep: 0 keeps no generation; keep: 2 keeps two.
    for (let i = 0; i < 3; i++) {
      await expect(
        ctx.supervisor.launch({
          id: 'f',
          command: 'sh',
          args: (t) => ['-c', `echo run ${i} >&2; exit 1`, t],
          logs: { keep: 2 },
          ready: never(),
        }),
      ).rejects.toMatchObject({ stderrTail: `run ${i}\n` });
    }
    expect([readFileSync(`${files.stderr}.1`, 'utf8'), readFileSync(`${files.stderr}.2`, 'utf8')]).toEqual([
      'run 1\n',
      'run 0\n',
    ]);
    await expect(
      ctx.supervisor.launch({
        id: 'f',
        command: 'sh',
        args: (t) => ['-c', 'exit 1', t],
        logs: { keep: 0 },
        ready: never(),
      }),
    ).rejects.toMatchObject({ stderrTail: undefined });
    // Generations past keep go too.
    expect(readdirSync(files.dir).sort()).toEqual(['stderr.log', 'stdout.log']);
  });

  it("logs: false writes nothing; stdio given keeps its meaning; 'pipe' still keeps a tail", async () => {
    ctx = await openSupervisor();
    // Exits after a pause, so that even a pipe's tail has arrived.
    const fail = (t: string) => ['-c', 'echo from the shell >&2; sleep 0.2; exit 2', t];
    const ready = never();
    await expect(
      ctx.supervisor.launch({ id: 'quiet', command: 'sh', args: fail, logs: false, ready }),
    ).rejects.toMatchObject({ exitCode: 2, stderrTail: undefined });
    expect(existsSync(logPaths(ctx.stateDir, 'quiet').dir)).toBe(false);
    await expect(
      ctx.supervisor.launch({ id: 'piped', command: 'sh', args: fail, stderr: 'pipe', ready }),
    ).rejects.toMatchObject({ stderrTail: 'from the shell\n' });
    const own = join(ctx.root, 'own.log');
    await expect(
      ctx.supervisor.launch({ id: 'own', command: 'sh', args: fail, stderr: { file: own }, ready }),
    ).rejects.toMatchObject({ stderrTail: 'from the shell\n' });
    // stdout given, stderr not: only stderr goes to the instance log.
    await expect(
      ctx.supervisor.launch({
        id: 'half',
        command: 'sh',
        args: (t) => ['-c', 'echo out; echo err >&2; exit 2', t],
        stdout: 'ignore',
        ready,
      }),
    ).rejects.toMatchObject({ stderrTail: 'err\n' });
    expect(readdirSync(logPaths(ctx.stateDir, 'half').dir)).toEqual(['stderr.log']);
    await expect(
      ctx.supervisor.launch({ id: 'bad', command: 'sh', args: fail, logs: { maxBytes: 0 } }),
    ).rejects.toMatchObject({ code: 'ERR_CUSTODY_INVALID_ARG' });
    await expect(
      ctx.supervisor.launch({ id: 'bad', command: 'sh', args: fail, logs: { keep: 10 } }),
    ).rejects.toMatchObject({ code: 'ERR_CUSTODY_INVALID_ARG' });
  });

  it('a daemon keeps writing to its log after the supervisor is gone (no pipe, no EPIPE), and is adopted later', async () => {
    const root = scratch();
    const stateDir = join(root, 'state');
    const writer =
      'import sys, time\nwhile True:\n    sys.stderr.write("tick\\n"); sys.stderr.flush(); time.sleep(0.02)';
    const first = await Supervisor.open({ stateDir, onEvent: () => {} });
    const inst = await first.supervisor.launch({ id: 'd', command: PYTHON, args: (t) => ['-c', writer, t, MARKER] });
    await first.supervisor.close();
    const { stderr } = logPaths(stateDir, 'd');
    const size = statSync(stderr).size;
    await waitFor(() => statSync(stderr).size > size + 100, 5000, 'the log to grow with no supervisor');
    expect(isGone(inst.pid)).toBe(false);
    const second = await Supervisor.open({ stateDir, onEvent: () => {} });
    expect(second.report.adopted.map((a) => a.id)).toEqual(['d']);
    await second.supervisor.stop('d', { graceMs: 5000 });
    await second.supervisor.close();
    expect(isGone(inst.pid)).toBe(true);
  });
});

describe(`log paths that are not regular files (${backend.name})`, () => {
  it('a FIFO or a symlink as a { file } stdio target is ERR_CUSTODY_BAD_LOG, never a hang', async () => {
    const d = scratch();
    execFileSync('mkfifo', [join(d, 'fifo')]);
    symlinkSync('/dev/null', join(d, 'link'));
    for (const name of ['fifo', 'link']) {
      expect(() => spawn('true', [], { stdio: ['ignore', { file: join(d, name) }, 'ignore'] })).toThrow(
        expect.objectContaining({ code: 'ERR_CUSTODY_BAD_LOG' }),
      );
      expect(() => openAppend(join(d, name))).toThrow(expect.objectContaining({ code: 'ERR_CUSTODY_BAD_LOG' }));
      expect(() => readLogTail(join(d, name))).toThrow(expect.objectContaining({ code: 'ERR_CUSTODY_BAD_LOG' }));
    }
    ctx = await openSupervisor();
    await expect(
      ctx.supervisor.launch({
        id: 'ff',
        command: 'sh',
        args: (t) => ['-c', 'sleep 300', t, MARKER],
        stderr: { file: join(d, 'fifo') },
      }),
    ).rejects.toMatchObject({
      code: 'ERR_CUSTODY_BAD_LOG',
    });
    expect(processesWithMarker(MARKER)).toEqual([]);
    expect(readdirSync(ctx.stateDir).filter((n) => !n.startsWith('.'))).toEqual([]);
  });

  it('an instance log dir that is a symlink is refused before anything is written or spawned', async () => {
    ctx = await openSupervisor();
    const elsewhere = join(ctx.root, 'elsewhere');
    mkdirSync(elsewhere);
    mkdirSync(join(ctx.stateDir, '.logs'), { mode: 0o700 });
    symlinkSync(elsewhere, join(ctx.stateDir, '.logs', 'x'));
    await expect(
      ctx.supervisor.launch({ id: 'x', command: 'sh', args: (t) => ['-c', 'sleep 300', t, MARKER] }),
    ).rejects.toMatchObject({ code: 'ERR_CUSTODY_BAD_LOG' });
    expect(readdirSync(elsewhere)).toEqual([]);
    expect(existsSync(join(ctx.stateDir, 'x'))).toBe(false);
    expect(processesWithMarker(MARKER)).toEqual([]);
  });
});

describe('readLogTail and followLog', () => {
  it('reads the last lines within a byte bound, dropping a line the bound cut', () => {
    const f = join(scratch(), 'a.log');
    writeFileSync(f, 'one\ntwo\nthree\n');
    expect(readLogTail(f, { lines: 2 })).toBe('two\nthree\n');
    expect(readLogTail(f, { lines: 10 })).toBe('one\ntwo\nthree\n');
    expect(readLogTail(f, { lines: 0 })).toBe('');
    expect(readLogTail(f, { lines: 10, maxBytes: 9 })).toBe('three\n');
    appendFileSync(f, 'no newline yet');
    expect(readLogTail(f, { lines: 1 })).toBe('no newline yet');
    writeFileSync(f, 'x'.repeat(5000));
    expect(readLogTail(f, { maxBytes: 100 })).toBe('x'.repeat(100));
    expect(() => readLogTail(join(scratch(), 'absent'))).toThrow(expect.objectContaining({ code: 'ENOENT' }));
  });

  it('follows appends, a truncation and a rotation, and ends on abort', async () => {
    const f = join(scratch(), 'b.log');
    writeFileSync(f, 'old 1\nold 2\nold 3\n');
    const ac = new AbortController();
    let text = '';
    const following = (async () => {
      for await (const chunk of followLog(f, { lines: 1, signal: ac.signal, pollMs: 10 })) text += chunk;
    })();
    const until = (s: string) => waitFor(() => text.endsWith(s), 5000, JSON.stringify(s));
    await until('old 3\n');
    appendFileSync(f, 'new 1\n');
    await until('new 1\n');
    truncateSync(f, 0);
    await new Promise((r) => setTimeout(r, 50));
    appendFileSync(f, 'after truncate\n');
    await until('after truncate\n');
    renameSync(f, `${f}.1`);
    writeFileSync(f, 'next run\n');
    await until('next run\n');
    ac.abort();
    await following;
    expect(text).toBe('old 3\nnew 1\nafter truncate\nnext run\n');
  });
});

describe(`the cap (${backend.name})`, () => {
  it('copy and truncate in place: the last maxBytes go to .1, and an O_APPEND writer goes on at the new end', async () => {
    const f = join(scratch(), 'c.log');
    const fd = openAppend(f);
    const h = spawn(
      PYTHON,
      [
        '-c',
        'import sys, time\nfor i in range(100000):\n    print("line %06d" % i, flush=True); time.sleep(0.001)',
        MARKER,
      ],
      { stdio: ['ignore', { fd }, 'ignore'] },
    );
    closeSync(fd);
    cleanups.push(async () => (h.signal('SIGKILL'), await h.exited));
    await waitFor(() => statSync(f).size > 2000, 5000, 'output');
    expect(await capLog(f, 1000, 1)).toEqual({ done: 'rotated' });
    const rotated = readFileSync(`${f}.1`, 'utf8');
    expect(rotated.length).toBe(1000);
    await waitFor(() => statSync(f).size > 100, 5000, 'writes after the truncation');
    const after = readFileSync(f, 'utf8');
    // No hole of NULs where the old content was: the writer appends at the new end.
    expect(after.includes('\0')).toBe(false);
    // Each write is a whole line, before or after the truncation, never torn by it. The read races the
    // writer, so its last line may be one still being appended (a line across a page boundary is
    // visible a page at a time): only the lines it saw end are judged.
    const lines = after
      .slice(0, after.lastIndexOf('\n') + 1)
      .split('\n')
      .slice(0, -1);
    expect(lines.length).toBeGreaterThan(0);
    expect(lines.filter((l) => !/^line \d{6}$/.test(l))).toEqual([]);
    expect(await capLog(f, 1 << 20, 1)).toEqual({ done: 'nothing' });
    expect(await capLog(join(scratch(), 'absent'), 10, 1)).toEqual({ done: 'nothing' });
  });

  it("a running instance's log is held under its cap by the periodic check", async () => {
    const stateDir = scratch();
    const events: string[] = [];
    const logs = new InstanceLogs(stateDir, {
      report: (type, f) => events.push(`${type}: ${f.message}`),
      live: () => [],
      checkMs: 20,
    });
    cleanups.push(() => logs.close());
    const files = logs.prepare('chatty', { maxBytes: 4096, keep: 1 })!;
    const fd = openAppend(files.stderr);
    const h = spawn(
      PYTHON,
      [
        '-c',
        'import sys, time\nwhile True:\n    sys.stderr.write("x" * 99 + "\\n"); sys.stderr.flush(); time.sleep(0.0005)',
        MARKER,
      ],
      { stdio: ['ignore', 'ignore', { fd }] },
    );
    closeSync(fd);
    cleanups.push(async () => (h.signal('SIGKILL'), await h.exited));
    void logs.watch('chatty');
    await waitFor(() => existsSync(`${files.stderr}.1`), 5000, 'a rotation');
    // Bounded: what one check interval lets the writer add, never the whole output.
    const sizes: number[] = [];
    for (let i = 0; i < 20; i++) {
      sizes.push(statSync(files.stderr).size);
      await new Promise((r) => setTimeout(r, 10));
    }
    expect(Math.min(...sizes)).toBeLessThan(64 * 1024);
    // The rotated generation is replaced at every check: read it between two.
    await waitFor(
      () => {
        try {
          return statSync(`${files.stderr}.1`).size === 4096;
        } catch {
          return false;
        }
      },
      5000,
      'a whole rotated generation',
    );
    expect(events).toEqual([]);
  });

  it('a check of hundreds of instances caps the one over its cap, and neither opens a FIFO nor follows a symlink', async () => {
    const stateDir = scratch();
    const outside = join(scratch(), 'not-a-log');
    writeFileSync(outside, 'y'.repeat(4096));
    // Hourly: only the first check (the one adopted instances get) runs here.
    const logs = new InstanceLogs(stateDir, { report: () => {}, live: () => [], checkMs: 3_600_000 });
    cleanups.push(() => logs.close());
    const ids = Array.from({ length: 400 }, (_, i) => `quiet-${i}`);
    const limits = { maxBytes: 16, keep: 1 };
    for (const id of ids) writeFileSync(logs.prepare(id, limits)!.stderr, 'small\n');
    // The one over its cap is watched last, past whatever slice the check yields after.
    const big = logs.prepare('big', limits)!;
    writeFileSync(big.stderr, 'x'.repeat(4096));
    execFileSync('mkfifo', [logs.prepare('fifo', limits)!.stderr]);
    symlinkSync(outside, logs.prepare('link', limits)!.stderr);
    await Promise.all([...ids, 'fifo', 'link', 'big'].map((id) => logs.watch(id)));
    expect(statSync(big.stderr).size).toBe(0);
    expect(statSync(`${big.stderr}.1`).size).toBe(16);
    for (const id of ids) expect(statSync(logPaths(stateDir, id).stderr).size).toBe(6);
    expect(lstatSync(logPaths(stateDir, 'fifo').stderr).isFIFO()).toBe(true);
    expect(readFileSync(outside, 'utf8')).toBe('y'.repeat(4096));
    expect(existsSync(`${logPaths(stateDir, 'link').stderr}.1`)).toBe(false);
  });

  it('an unwatched log is no longer checked; its file stays', async () => {
    const stateDir = scratch();
    const logs = new InstanceLogs(stateDir, { report: () => {}, live: () => [], checkMs: 20 });
    cleanups.push(() => logs.close());
    const files = logs.prepare('quiet', { maxBytes: 16, keep: 1 });
    expect(files).not.toBeNull();
    const stderr = files?.stderr ?? '';
    await logs.watch('quiet');
    logs.unwatch('quiet');
    writeFileSync(stderr, 'x'.repeat(4096));
    const loud = logs.prepare('loud', { maxBytes: 16, keep: 1 });
    await logs.watch('loud');
    writeFileSync(loud?.stderr ?? '', 'x'.repeat(4096));
    // A periodic check covers every watched log: once the watched one is rotated, one ran after both writes.
    await waitFor(() => existsSync(`${loud?.stderr}.1`), 5000, 'the watched log to be rotated');
    expect(statSync(stderr).size).toBe(4096);
    expect(existsSync(`${stderr}.1`)).toBe(false);
  });

  it('a log that grew past the cap while no supervisor ran is capped when the instance is adopted', async () => {
    const root = scratch();
    const stateDir = join(root, 'state');
    const first = await Supervisor.open({ stateDir, onEvent: () => {} });
    const inst = await first.supervisor.launch({
      id: 'big',
      command: PYTHON,
      args: (t) => ['-c', 'import time; time.sleep(300)', t, MARKER],
    });
    await first.supervisor.close();
    const { stderr } = logPaths(stateDir, 'big');
    appendFileSync(stderr, Buffer.alloc(9 << 20, 0x61));
    const second = await Supervisor.open({ stateDir, onEvent: () => {} });
    try {
      expect(second.report.adopted.map((a) => a.id)).toEqual(['big']);
      await waitFor(() => existsSync(`${stderr}.1`) && statSync(stderr).size === 0, 10_000, 'the cap on adoption');
      expect(statSync(`${stderr}.1`).size).toBe(8 << 20);
      await second.supervisor.stop('big', { graceMs: 5000 });
    } finally {
      await second.supervisor.close();
    }
    expect(isGone(inst.pid)).toBe(true);
  });

  it("an adopted instance's log is held under the caps its launch recorded, never custody's defaults", async () => {
    const root = scratch();
    const stateDir = join(root, 'state');
    const caps = { maxBytes: 200_000, keep: 3 };
    const first = await Supervisor.open({ stateDir, onEvent: () => {} });
    let inst: Awaited<ReturnType<typeof first.supervisor.launch>> | undefined;
    const { stderr } = logPaths(stateDir, 'capped');
    try {
      // Four runs, each rotating the last to .1 (as its launch does): the current file, .1, .2 and .3.
      for (let run = 1; run <= 4; run++) {
        if (inst) await first.supervisor.stop('capped', { graceMs: 5000 });
        inst = await first.supervisor.launch({
          id: 'capped',
          command: PERL,
          args: (t) => ['-e', 'print STDERR "run $ARGV[0]\\n"; sleep 300', String(run), t, MARKER],
          logs: caps,
        });
        await waitFor(() => existsSync(stderr) && readFileSync(stderr, 'utf8') === `run ${run}\n`, 5000, `run ${run}`);
      }
    } finally {
      await first.supervisor.close();
    }
    expect(['.1', '.2', '.3'].map((g) => readFileSync(`${stderr}${g}`, 'utf8'))).toEqual([
      'run 3\n',
      'run 2\n',
      'run 1\n',
    ]);
    // While no supervisor runs, the daemon writes past its cap (under custody's default of 8 MiB).
    appendFileSync(stderr, Buffer.alloc(300_000, 0x61));
    const second = await Supervisor.open({ stateDir, onEvent: () => {} });
    try {
      expect(second.report.adopted.map((a) => a.id)).toEqual(['capped']);
      // The adoption's first check: the last maxBytes to .1, the older generations shifted, three kept.
      await waitFor(() => statSync(stderr).size === 0, 10_000, 'the recorded cap on adoption');
      expect(statSync(`${stderr}.1`).size).toBe(caps.maxBytes);
      expect(['.2', '.3'].map((g) => readFileSync(`${stderr}${g}`, 'utf8'))).toEqual(['run 3\n', 'run 2\n']);
      expect(existsSync(`${stderr}.4`)).toBe(false);
      await second.supervisor.stop('capped', { graceMs: 5000 });
    } finally {
      await second.supervisor.close();
    }
    expect(isGone(inst!.pid)).toBe(true);
  });

  it('on a full disk the cap keeps the last maxBytes in place, reports the bytes dropped, and leaves no temp file', async (t) => {
    t.skip(!isRoot(), 'needs root: mounts a tiny tmpfs');
    const root = scratch();
    const stateDir = join(root, 'state');
    const caps = { maxBytes: 32 * 1024, keep: 1 };
    const full = join(root, 'disk-full');
    const first = await Supervisor.open({ stateDir, onEvent: () => {} });
    cleanups.push(() => first.supervisor.close());
    // The logs alone on a 256 KiB tmpfs: the daemon's output fills it.
    const logsDir = join(stateDir, '.logs');
    mkdirSync(logsDir, { mode: 0o700 });
    mountTinyFs(logsDir, 256);
    // Writes 100-byte lines as fast as it can until the disk is full, says so outside it, then waits.
    const writer = `
import os, sys, time
deadline, i = time.time() + 60, 0
while time.time() < deadline:
    try:
        os.write(1, b'line %07d %s\\n' % (i, b'x' * 86))
    except OSError:
        open(sys.argv[1], 'w').close()
        break
    i += 1
time.sleep(300)
`;
    const inst = await first.supervisor.launch({
      id: 'fast',
      command: PYTHON,
      args: (tok) => ['-c', writer, full, tok, MARKER],
      logs: caps,
    });
    cleanups.push(() => endOwn([{ pid: inst.pid, start: String(inst.identity.startTicks) }]));
    await waitFor(() => existsSync(full), 20_000, 'the disk to fill');
    await first.supervisor.close();
    const { dir, stdout } = logPaths(stateDir, 'fast');
    const before = readFileSync(stdout);
    expect(before.length).toBeGreaterThan(200 * 1024);
    // The adoption's first check finds the log over its cap with no room for its copy.
    const temps: string[][] = [];
    const warnings: WarningEvent[] = [];
    const second = await Supervisor.open({
      stateDir,
      onEvent: (e) => {
        if (e.type !== 'warning') return;
        warnings.push(e);
        temps.push(readdirSync(dir).filter((n) => n.endsWith('.tmp')));
      },
    });
    cleanups.push(() => second.supervisor.close());
    expect(second.report.adopted.map((a) => a.id)).toEqual(['fast']);
    await waitFor(() => warnings.length > 0, 10_000, 'the warning of the cut');
    const dropped = before.length - caps.maxBytes;
    expect(warnings).toEqual([
      expect.objectContaining({
        id: 'fast',
        path: stdout,
        message: expect.stringMatching(
          new RegExp(`ENOSPC.*kept its last ${caps.maxBytes} bytes in place, dropped ${dropped} bytes$`),
        ),
      }),
    ]);
    expect(temps).toEqual([[]]);
    expect(readdirSync(dir).sort()).toEqual(['stderr.log', 'stdout.log']);
    // The newest output survives, and the cap holds.
    expect(readFileSync(stdout).equals(before.subarray(dropped))).toBe(true);
    await second.supervisor.stop('fast', { graceMs: 5000 });
    expect(goneSince(inst.pid, inst.identity.startTicks)).toBe(true);
  });

  it('logs of ids with no state left go once untouched for the retention period', () => {
    const stateDir = scratch();
    const old = Date.now() / 1000 - 8 * 86400;
    for (const id of ['gone-old', 'live-old', 'gone-recent']) {
      const { dir, stderr } = logPaths(stateDir, id);
      mkdirSync(dir, { recursive: true });
      writeFileSync(stderr, 'x\n');
      if (id.endsWith('old')) utimesSync(stderr, old, old), utimesSync(dir, old, old);
    }
    symlinkSync('/etc', join(stateDir, '.logs', 'linked'));
    expect(pruneLogs(stateDir, new Set(['live-old']))).toEqual(['gone-old']);
    expect(readdirSync(join(stateDir, '.logs')).sort()).toEqual(['gone-recent', 'linked', 'live-old']);
    expect(existsSync('/etc/passwd')).toBe(true);
  });
});
