// Pidfiles as untrusted input: bounded, strict, never followed, never blocking.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { parsePidfile, readPidfile, PIDFILE_MAX_BYTES } from '../../src/lifecycle/pidfile.js';
import { pidMax } from '../../src/validate.js';
import { expectNoLeaks, processesWithMarker } from '../helpers/leaks.js';
import { isGone, MARKER, tmpDir, waitFor } from '../helpers/procs.js';
import { openSupervisor, PERL } from '../helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });

const dir = tmpDir('custody-pidfile-');
const path = (name: string) => join(dir.path, name);
let ctx: Awaited<ReturnType<typeof openSupervisor>> | undefined;
afterEach(async () => {
  await ctx?.dispose();
  ctx = undefined;
  for (const name of readdirSync(dir.path)) rmSync(join(dir.path, name), { recursive: true, force: true });
});
afterAll(() => dir.cleanup());

describe('parsePidfile', () => {
  it('takes decimal digits with at most one trailing newline', () => {
    expect(parsePidfile('1234\n', 'p')).toBe(1234);
    expect(parsePidfile('1234', 'p')).toBe(1234);
    expect(parsePidfile(`${pidMax()}`, 'p')).toBe(pidMax());
    expect(parsePidfile('', 'p')).toBeNull();
  });

  it.each([' 12', '12 ', '12\n\n', '12\r\n', '-5', '+5', '0x10', '1e3', '12abc', '\n', 'NaN', '١٢'])(
    'refuses %j',
    (text) => {
      expect(() => parsePidfile(text, 'p')).toThrow(
        expect.objectContaining({ code: 'ERR_CUSTODY_BAD_PIDFILE', path: 'p' }),
      );
    },
  );

  it('refuses pids out of range instead of wrapping them: 2^32 + X never becomes X', () => {
    for (const n of [
      '0',
      '1',
      String(pidMax() + 1),
      String(2 ** 32 + process.pid),
      String(2 ** 64 + 5),
      '9'.repeat(40),
    ]) {
      expect(() => parsePidfile(`${n}\n`, 'p'), n).toThrow(
        expect.objectContaining({ code: 'ERR_CUSTODY_BAD_PIDFILE', message: expect.stringMatching(/out of range/) }),
      );
    }
  });
});

describe('readPidfile', () => {
  it('reads a pid, and null while the file is absent or empty', () => {
    writeFileSync(path('ok.pid'), '4321\n');
    expect(readPidfile(path('ok.pid'))).toBe(4321);
    expect(readPidfile(path('absent.pid'))).toBeNull();
    writeFileSync(path('empty.pid'), '');
    expect(readPidfile(path('empty.pid'))).toBeNull();
  });

  it('refuses a FIFO without blocking, even with no writer', () => {
    execFileSync('mkfifo', [path('fifo.pid')]);
    expect(() => readPidfile(path('fifo.pid'))).toThrow(
      expect.objectContaining({ code: 'ERR_CUSTODY_BAD_PIDFILE', message: expect.stringMatching(/FIFO/) }),
    );
  });

  it('refuses a symlink, even one to /dev/zero or to a good pidfile', () => {
    symlinkSync('/dev/zero', path('zero.pid'));
    writeFileSync(path('real.pid'), '77\n');
    symlinkSync(path('real.pid'), path('link.pid'));
    for (const p of [path('zero.pid'), path('link.pid')]) {
      expect(() => readPidfile(p)).toThrow(
        expect.objectContaining({ code: 'ERR_CUSTODY_BAD_PIDFILE', message: expect.stringMatching(/symlink/) }),
      );
    }
  });

  it('refuses a device node, a directory and a socket', async () => {
    mkdirSync(path('dir.pid'));
    const server = createServer();
    await new Promise<void>((r) => server.listen(path('sock.pid'), r));
    try {
      const cases: Array<[string, RegExp]> = [
        [path('dir.pid'), /directory/],
        [path('sock.pid'), /socket/],
      ];
      if (process.getuid?.() === 0) {
        execFileSync('mknod', [path('null.pid'), 'c', '1', '3']);
        cases.push([path('null.pid'), /character device/]);
      }
      for (const [p, why] of cases)
        expect(() => readPidfile(p)).toThrow(
          expect.objectContaining({ code: 'ERR_CUSTODY_BAD_PIDFILE', message: expect.stringMatching(why) }),
        );
    } finally {
      await new Promise((r) => server.close(r));
    }
  });

  it('refuses a file larger than a pid can be, without reading it', () => {
    writeFileSync(path('big.pid'), '1'.repeat(PIDFILE_MAX_BYTES + 1));
    writeFileSync(path('huge.pid'), Buffer.alloc(64 << 20, 0x31));
    for (const p of [path('big.pid'), path('huge.pid')]) {
      expect(() => readPidfile(p)).toThrow(
        expect.objectContaining({ code: 'ERR_CUSTODY_BAD_PIDFILE', message: expect.stringMatching(/at most 64/) }),
      );
    }
  });
});

describe(`launch with a hostile pidfile (${backend.name})`, () => {
  // A launcher that forks a target carrying the token, then leaves `what` at the pidfile path and exits 0.
  const launchWith = (id: string, what: string) => {
    const pidfile = path(`${id}.pid`);
    return ctx!.supervisor.launch({
      id,
      command: 'sh',
      args: (t) => ['-c', `( exec "$0" -e 'sleep 300' "$1" "$2" ) & ${what}; exit 0`, PERL, t, MARKER, pidfile],
      pid: { file: pidfile },
      executable: PERL,
      confirmTimeoutMs: 5000,
    });
  };
  const refused = { code: 'ERR_CUSTODY_BAD_PIDFILE' };

  it('a FIFO at the pidfile path fails the launch at once, and leaves nothing', async () => {
    ctx = await openSupervisor();
    await expect(launchWith('fifo', 'mkfifo "$3"')).rejects.toMatchObject(refused);
    expect(processesWithMarker(MARKER)).toEqual([]);
    expect(readdirSync(ctx.stateDir).filter((n) => !n.startsWith('.'))).toEqual([]);
    // A declared path is removed only when it is a socket or a regular file: the FIFO stays, and a warning says so.
    expect(existsSync(path('fifo.pid'))).toBe(true);
    expect(ctx.events).toContainEqual(expect.objectContaining({ type: 'warning', path: path('fifo.pid') }));
  });

  it('a symlink to /dev/zero, a huge file or garbage fail the launch with a code, never a crash', async () => {
    ctx = await openSupervisor();
    await expect(launchWith('zero', 'ln -s /dev/zero "$3"')).rejects.toMatchObject(refused);
    await expect(launchWith('huge', 'head -c 1000000 /dev/zero | tr "\\0" 7 > "$3"')).rejects.toMatchObject(refused);
    await expect(launchWith('junk', 'echo "pid=$!" > "$3"')).rejects.toMatchObject(refused);
    expect(processesWithMarker(MARKER)).toEqual([]);
  });

  it("an abandon ends the launcher's fork that has not exec'd yet, after the launcher itself exited", async () => {
    ctx = await openSupervisor();
    // The fork is still the launcher's shell (a launcher is never taken for its target), its parent
    // gone: only the session the attempt made says it is the attempt's.
    const pidfile = path('late.pid');
    await expect(
      ctx.supervisor.launch({
        id: 'late',
        command: 'sh',
        args: (t) => [
          '-c',
          `( sleep 0.5; exec "$0" -e 'sleep 300' "$1" "$2" ) & echo junk > "$3"; exit 0`,
          PERL,
          t,
          MARKER,
          pidfile,
        ],
        pid: { file: pidfile },
        executable: PERL,
        confirmTimeoutMs: 5000,
      }),
    ).rejects.toMatchObject(refused);
    // The backgrounded subshell carries the marker in its argv from its fork on, before and after its exec:
    // gone from the table means ended, and an ended process does not come back.
    await waitFor(() => processesWithMarker(MARKER).length === 0, 5000, "the attempt's subshell to end");
  });

  it('2^32 + the pid of a live process never pins that process', async () => {
    ctx = await openSupervisor();
    const bystander = ctx.supervisor.launch({
      id: 'bystander',
      command: PERL,
      args: (t) => ['-e', 'sleep 300', t, MARKER],
    });
    const { pid } = await bystander;
    await expect(launchWith('wrap', `echo ${2 ** 32 + pid} > "$3"`)).rejects.toMatchObject({
      ...refused,
      message: expect.stringMatching(/out of range/),
    });
    expect(isGone(pid)).toBe(false);
    expect(ctx.supervisor.list()).toEqual([{ id: 'bystander', status: 'running', pid, ppid: expect.any(Number) }]);
  });

  it('a pid function that returns a pid out of range is ERR_CUSTODY_INVALID_ARG, and the attempt is undone', async () => {
    ctx = await openSupervisor();
    for (const bad of [2 ** 32 + process.pid, 0, 1, 1.5, Number.NaN, '123', pidMax() + 1]) {
      await expect(
        ctx.supervisor.launch({
          id: 'fn',
          command: PERL,
          args: (t) => ['-e', 'sleep 300', t, MARKER],
          pid: () => bad as number,
        }),
      ).rejects.toMatchObject({ code: 'ERR_CUSTODY_INVALID_ARG' });
    }
    expect(processesWithMarker(MARKER)).toEqual([]);
    expect(ctx.supervisor.list()).toEqual([]);
  });
});
