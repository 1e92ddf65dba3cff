import { spawn as cpSpawn } from 'node:child_process';
import { chmodSync, readdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { AbortError, capabilities, inspect, open, spawn, terminate, type ProcessHandle } from '../../src/index.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import {
  isRoot,
  killAndWait,
  untilReady,
  loggedSignals,
  procStat,
  signalLoggerArgs,
  sleeper,
  tmpDir,
  unusedPid,
  waitFor,
} from '../helpers/procs.js';

expectNoLeaks();

async function readAll(stream: NodeJS.ReadableStream | null): Promise<string> {
  let out = '';
  for await (const chunk of stream!) out += String(chunk);
  return out;
}

describe(`spawn (${backend.name})`, () => {
  it('reports exit codes and signals', async () => {
    expect(await spawn('true').exited).toEqual({ code: 0, signal: null });
    expect(await spawn('sh', ['-c', 'exit 3']).exited).toEqual({ code: 3, signal: null });
    expect(await spawn('sh', ['-c', 'kill -USR1 $$']).exited).toEqual({ code: null, signal: 'SIGUSR1' });
  });

  it('answers exited and gone asked only after the exit was seen, with the same status', async () => {
    const h = spawn('sh', ['-c', 'exit 7']);
    // Nothing asked while it runs: the pin still sees the exit (and reaps its child).
    await waitFor(() => h.hasExited && h.exitStatus !== undefined, 10_000, 'the exit to be seen');
    await h.gone;
    expect(await h.exited).toEqual({ code: 7, signal: null });
    expect(h.exited).toBe(h.exited);
    expect(h.signal('SIGTERM')).toBe(false);
    h.close();
  });

  it('fails synchronously with ENOENT or EACCES and leaves no process', () => {
    expect(() => spawn('/nonexistent/custody-x')).toThrow(expect.objectContaining({ code: 'ENOENT' }));
    // With every slot piped: neither end of any pipe outlives the failure.
    const fdsBefore = readdirSync('/proc/self/fd').length;
    expect(() => spawn('/nonexistent/custody-x', [], { stdio: 'pipe' })).toThrow(
      expect.objectContaining({ code: 'ENOENT' }),
    );
    expect(readdirSync('/proc/self/fd')).toHaveLength(fdsBefore);
    // A PATH of searchable dirs only: one we may not search makes it EACCES (below).
    const searchable = { PATH: '/usr/local/bin:/usr/bin:/bin' };
    expect(() => spawn('custody-no-such-command-anywhere', [], { env: searchable })).toThrow(
      expect.objectContaining({ code: 'ENOENT' }),
    );
    const dir = tmpDir();
    try {
      const file = join(dir.path, 'not-executable');
      writeFileSync(file, '#!/bin/sh\n');
      chmodSync(file, 0o644);
      expect(() => spawn(file)).toThrow(expect.objectContaining({ code: 'EACCES' }));
      expect(() => spawn(dir.path)).toThrow(expect.objectContaining({ code: 'EACCES' }));
    } finally {
      dir.cleanup();
    }
  });

  it('says EACCES, as execvp does, for a command not found when a PATH dir could not be searched', async (ctx) => {
    ctx.skip(isRoot(), 'root searches every directory: run unprivileged (.ci/run does)');
    const dir = tmpDir();
    try {
      chmodSync(dir.path, 0o000);
      const env = { PATH: `${dir.path}:/usr/bin:/bin` };
      expect(() => spawn('custody-no-such-command-anywhere', [], { env })).toThrow(
        expect.objectContaining({ code: 'EACCES' }),
      );
      expect(await spawn('true', [], { env }).exited).toEqual({ code: 0, signal: null });
    } finally {
      chmodSync(dir.path, 0o700);
      dir.cleanup();
    }
  });

  it('pipes stdout and stderr, passes env, cwd and argv0', async () => {
    const dir = tmpDir();
    try {
      const h = spawn('sh', ['-c', 'echo "$FOO $(pwd) $0"; echo err >&2'], {
        stdio: ['ignore', 'pipe', 'pipe'],
        env: { FOO: 'bar', PATH: process.env.PATH },
        cwd: dir.path,
        argv0: 'custom-zero',
      });
      const [out, err] = await Promise.all([readAll(h.stdout), readAll(h.stderr)]);
      expect(out.trim()).toBe(`bar ${dir.path} custom-zero`);
      expect(err.trim()).toBe('err');
      expect(await h.exited).toEqual({ code: 0, signal: null });
    } finally {
      dir.cleanup();
    }
  });

  it('appends to a file', async () => {
    const dir = tmpDir();
    try {
      const log = join(dir.path, 'out.log');
      writeFileSync(log, 'first\n');
      await spawn('sh', ['-c', 'echo second; echo third >&2'], { stdio: ['ignore', { file: log }, { file: log }] })
        .exited;
      expect(readFileSync(log, 'utf8')).toBe('first\nsecond\nthird\n');
    } finally {
      dir.cleanup();
    }
  });

  it('starts the child with default signal dispositions, an empty mask and only stdio', async () => {
    // The programs read their own status: a shell in between would show its
    // own mask (dash blocks every signal around its fork of a command).
    const g = spawn('grep', ['-E', '^Sig(Ign|Blk)', '/proc/self/status'], { stdio: ['ignore', 'pipe', 'ignore'] });
    const status = await readAll(g.stdout);
    await g.exited;
    expect(status).toMatch(/SigBlk:\s+0+\n/);
    // Node ignores SIGPIPE; a VM monitor must not inherit that.
    expect(status).toMatch(/SigIgn:\s+0+\n/);
    const h = spawn('ls', ['/proc/self/fd'], { stdio: ['ignore', 'pipe', 'ignore'] });
    const out = await readAll(h.stdout);
    await h.exited;
    const fds = out
      .split('\n')
      .filter((l) => /^\d+$/.test(l))
      .map(Number);
    // 0, 1, 2, plus the fd ls uses to read the directory. The native spawn
    // closes every other fd (close_range); the js backend can only put
    // /dev/null in place of an fd this process inherited without
    // close-on-exec (test/backend/spawn-fds.test.ts), so a number may remain.
    if (backend.name === 'native') expect(fds.filter((fd) => fd > 3)).toEqual([]);
  });

  it('puts the child in a new process group when asked, and can hand it our stdio', async () => {
    const g = spawn('sleep', ['30'], { processGroup: true, stdio: 'inherit' });
    try {
      await waitFor(() => procStat(g.pid)?.[0] === 'S', 5000, 'sleep');
      const st = procStat(g.pid)!;
      expect(Number(st[2])).toBe(g.pid); // its own process group
      // Still our session on native; child_process can only setsid.
      if (backend.name === 'native') expect(Number(st[3])).not.toBe(g.pid);
      const { readlinkSync } = await import('node:fs');
      expect(readlinkSync(`/proc/${g.pid}/fd/1`)).toBe(readlinkSync('/proc/self/fd/1'));
    } finally {
      g.signal('SIGKILL');
      await g.exited;
    }
  });

  it("never reaps a child that Node's child_process owns, even with a handle open on it", async () => {
    const child = cpSpawn('sh', ['-c', 'exit 7'], { stdio: 'ignore' });
    const h = open(child.pid!);
    const [code] = await Promise.all([new Promise((r) => child.once('exit', (c) => r(c))), h.gone]);
    // libuv still got the status: nobody else reaped its child.
    expect(code).toBe(7);
    h.close();
  });

  it('detaches into a new session when asked', async () => {
    const h = spawn('sleep', ['30'], { detached: true });
    try {
      await waitFor(() => procStat(h.pid)?.[0] === 'S', 5000, 'sleep');
      const st = procStat(h.pid)!;
      expect(Number(st[3])).toBe(h.pid); // session id
      expect(Number(st[2])).toBe(h.pid); // process group
    } finally {
      h.signal('SIGKILL');
      await h.exited;
    }
  });

  it("keeps what a child wrote for a reader that comes after its exit, 'end' included", async () => {
    const h = spawn('/bin/sh', ['-c', 'echo the-last-words'], { stdio: ['ignore', 'pipe', 'ignore'] });
    expect(await h.exited).toEqual({ code: 0, signal: null });
    // Past the exit, and past the tick on which child_process resumes (and drains) unread pipes.
    await new Promise((r) => setTimeout(r, 100));
    let out = '';
    h.stdout.on('data', (d: Buffer) => (out += d));
    await new Promise<void>((resolve) => h.stdout.once('end', resolve));
    expect(out).toBe('the-last-words\n');
    h.close();
  });

  it('refuses bad arguments', () => {
    const bad = (fn: () => unknown) => expect(fn).toThrow(expect.objectContaining({ code: 'ERR_CUSTODY_INVALID_ARG' }));
    bad(() => spawn(''));
    bad(() => spawn('true', ['a\0b']));
    bad(() => spawn('true', 'x' as never));
    bad(() => spawn('true', [], { env: { 'A=B': 'x' } }));
    bad(() => spawn('true', [], { stdio: 'bogus' as never }));
    // Refused before anything is spawned, never a TypeError from deeper down, never quietly coerced.
    bad(() => spawn('true', [], { env: null as never }));
    bad(() => spawn('true', [], { env: 'A=1' as never }));
    bad(() => spawn('true', [], { env: ['A=1'] as never }));
    bad(() => spawn('true', [], { env: { A: Symbol('x') } as never }));
    bad(() => spawn('true', [], { env: { A: 1 } as never }));
    bad(() => spawn('true', [], { argv0: 5 as never }));
    bad(() => spawn('true', [], { argv0: 'a\0b' }));
    bad(() => spawn('true', [], { cwd: '' }));
    bad(() => spawn('true', [], { detached: 'no' as never }));
  });
});

describe(`open (${backend.name})`, () => {
  it('signals the proven process through its pin and sees it exit', async () => {
    const dir = tmpDir();
    const log = join(dir.path, 'log');
    const child = cpSpawn('python3', signalLoggerArgs(log, true), { stdio: ['ignore', 'pipe', 'ignore'] });
    try {
      await untilReady(child.stdout!);
      const h = open(child.pid!, inspect(child.pid!));
      expect(h.identity?.pid).toBe(child.pid);
      expect(h.signal('SIGUSR1')).toBe(true);
      await waitFor(() => loggedSignals(log).includes('SIGUSR1'), 5000, 'SIGUSR1 logged');
      const exited = h.exited;
      child.kill('SIGKILL');
      const status = await exited;
      // Not our child: its status comes from PIDFD_INFO_EXIT where the kernel has it.
      if (capabilities().exitInfoOfNonChildren) expect(status).toEqual({ code: null, signal: 'SIGKILL' });
      else expect(status).toEqual({ code: null, signal: null });
      expect(h.signal('SIGTERM')).toBe(false);
      h.close();
    } finally {
      await killAndWait(child);
      dir.cleanup();
    }
  });

  it('refuses an identity that does not verify', async () => {
    const child = sleeper(30);
    try {
      await waitFor(() => procStat(child.pid!)?.[0] === 'S', 5000, 'sleep');
      const id = inspect(child.pid!);
      expect(() => open(child.pid!, { ...id, startTicks: id.startTicks + 1 })).toThrow(
        expect.objectContaining({ code: 'ERR_CUSTODY_IDENTITY_MISMATCH', verdict: 'reused' }),
      );
      expect(() => open(child.pid!, { ...id, argv: ['other'] })).toThrow(
        expect.objectContaining({ code: 'ERR_CUSTODY_IDENTITY_MISMATCH', verdict: 'mismatch', field: 'argv' }),
      );
      const { startTicks: _s, ...noTicks } = id;
      expect(() => open(child.pid!, noTicks)).toThrow(
        expect.objectContaining({ code: 'ERR_CUSTODY_IDENTITY_UNRECORDED', field: 'startTicks' }),
      );
    } finally {
      await killAndWait(child);
    }
  });

  it('throws ESRCH for no process and INVALID_ARG for a bad pid', () => {
    expect(() => open(unusedPid())).toThrow(expect.objectContaining({ code: 'ESRCH' }));
    for (const bad of [0, -3, 2.5, Number.NaN, 1e12]) {
      expect(() => open(bad)).toThrow(expect.objectContaining({ code: 'ERR_CUSTODY_INVALID_ARG' }));
    }
  });
});

describe(`terminate (${backend.name})`, () => {
  it('ends a process with SIGTERM', async () => {
    const h = spawn('sleep', ['30']);
    expect(await terminate(h, { graceMs: 5000 })).toEqual({
      outcome: 'exited',
      escalated: false,
      code: null,
      signal: 'SIGTERM',
    });
  });

  it('escalates to SIGKILL within the bound when SIGTERM is ignored', async () => {
    const dir = tmpDir();
    try {
      const log = join(dir.path, 'log');
      const h = spawn('python3', signalLoggerArgs(log, true), { stdio: ['ignore', 'pipe', 'ignore'] });
      await untilReady(h.stdout!);
      const escalations: number[] = [];
      const started = Date.now();
      // Long enough for python to log the SIGTERM it ignores on a loaded machine.
      const r = await terminate(h, { graceMs: 1000, onEscalate: ({ pid }) => escalations.push(pid) });
      expect(r).toEqual({ outcome: 'exited', escalated: true, code: null, signal: 'SIGKILL' });
      expect(escalations).toEqual([h.pid]);
      expect(loggedSignals(log)).toEqual(['SIGTERM']);
      // Bounded: the grace, not some default far beyond it (generous for slow machines).
      expect(Date.now() - started).toBeLessThan(5000);
    } finally {
      dir.cleanup();
    }
  });

  it('treats a process that is already gone as success', async () => {
    const h = spawn('true');
    await h.exited;
    expect(await terminate(h)).toEqual({ outcome: 'already-gone', escalated: false, code: 0, signal: null });
  });

  it("honours the caller's AbortSignal", async () => {
    const dir = tmpDir();
    const h = spawn('python3', signalLoggerArgs(join(dir.path, 'log'), true), { stdio: ['ignore', 'pipe', 'ignore'] });
    await untilReady(h.stdout!);
    try {
      const ac = new AbortController();
      setTimeout(() => ac.abort(new Error('caller gave up')), 100);
      await expect(terminate(h, { graceMs: 10_000, signal: ac.signal })).rejects.toBeInstanceOf(AbortError);
      const pre = new AbortController();
      pre.abort();
      await expect(terminate(h, { signal: pre.signal })).rejects.toMatchObject({ code: 'ABORT_ERR' });
    } finally {
      h.signal('SIGKILL');
      await h.exited;
      dir.cleanup();
    }
  });

  it('refuses pid 1, this process, and things that are not handles', async () => {
    const init = open(1);
    const self = open(process.pid);
    try {
      await expect(terminate(init)).rejects.toMatchObject({ code: 'ERR_CUSTODY_INVALID_ARG' });
      await expect(terminate(self)).rejects.toMatchObject({ code: 'ERR_CUSTODY_INVALID_ARG' });
      await expect(terminate({ pid: 5 } as ProcessHandle)).rejects.toMatchObject({ code: 'ERR_CUSTODY_INVALID_ARG' });
      const h = spawn('sleep', ['5']);
      await expect(terminate(h, { graceMs: -1 })).rejects.toMatchObject({ code: 'ERR_CUSTODY_INVALID_ARG' });
      await expect(terminate(h, { termSignal: 'SIGNOPE' as never })).rejects.toMatchObject({
        code: 'ERR_CUSTODY_INVALID_ARG',
      });
      h.signal('SIGKILL');
      await h.exited;
    } finally {
      init.close();
      self.close();
    }
  });
});
