import { spawn } from 'node:child_process';
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import type { NativeBackend } from '../../src/backend/native.js';
import { imageOf } from '../../src/backend/procview.js';
import { parseImage, parseLayout, parseStat, parseStatusUid, splitCmdline } from '../../src/process/proc.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { killOwn, MARKER, tmpDir } from '../helpers/procs.js';
import { PERL, PYTHON } from '../helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });

// The kernel's own layout: 52 fields; starttime is field 22.
function statLine(pid: number, comm: string, state = 'S', ppid = 1, start = 123456): string {
  const tail = [state, ppid, 77, 77, 0, -1, 4194560, 100, 0, 0, 0, 1, 2, 0, 0, 20, 0, 1, 0, start, 1000, 200];
  return `${pid} (${comm}) ${tail.join(' ')} 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n`;
}

const parsers: Array<[string, (t: string) => ReturnType<typeof parseStat>]> = [['ts', parseStat]];
if (backend.name === 'native') parsers.push(['native', (t) => (backend as NativeBackend).addon.parseStat(t)]);

describe.each(parsers)('parseStat (%s)', (_name, parse) => {
  it('reads the fields after the last parenthesis', () => {
    expect(parse(statLine(42, 'sleep', 'S', 7, 9999))).toEqual({
      pid: 42,
      comm: 'sleep',
      state: 'S',
      ppid: 7,
      pgrp: 77,
      session: 77,
      startTicks: 9999,
    });
  });

  it('keeps a comm with spaces and parentheses whole', () => {
    const st = parse(statLine(5, 'a) (b c', 'R', 3, 55));
    expect(st?.comm).toBe('a) (b c');
    expect(st?.state).toBe('R');
    expect(st?.ppid).toBe(3);
    expect(st?.startTicks).toBe(55);
  });

  it('handles a comm that ends in ") " and one that is empty', () => {
    expect(parse(statLine(6, 'x) ', 'S', 2, 66))?.startTicks).toBe(66);
    expect(parse(statLine(7, '', 'S', 2, 77))?.comm).toBe('');
  });

  it('reads a zombie', () => {
    expect(parse(statLine(8, 'defunct', 'Z', 2, 88))?.state).toBe('Z');
  });

  it('rejects text of another shape', () => {
    expect(parse('')).toBeNull();
    expect(parse('12 (x) S 1 2')).toBeNull();
    expect(parse('no parens at all 1 2 3')).toBeNull();
    expect(parse('12 (x) SS 1 2 3 4 5 6 7 8 9 10 11 12 13 14 15 16 17 18 19 20')).toBeNull();
  });

  it('parses the live stat of this process', async () => {
    const { readFileSync } = await import('node:fs');
    const st = parse(readFileSync('/proc/self/stat', 'utf8'));
    expect(st?.pid).toBe(process.pid);
    expect(st?.ppid).toBe(process.ppid);
  });
});

describe('splitCmdline', () => {
  it('splits on NUL and drops the trailing one', () => {
    expect(splitCmdline('sleep\u0000100\u0000')).toEqual(['sleep', '100']);
  });
  it('keeps empty arguments', () => {
    expect(splitCmdline('a\u0000\u0000b\u0000')).toEqual(['a', '', 'b']);
  });
  it('gives [] for a zombie or kernel thread (empty cmdline)', () => {
    expect(splitCmdline('')).toEqual([]);
  });
  it('keeps the last piece when a process rewrote argv without a trailing NUL', () => {
    expect(splitCmdline('nginx: worker process')).toEqual(['nginx: worker process']);
  });
});

describe('parseStatusUid', () => {
  it('reads the real uid', () => {
    expect(parseStatusUid('Name:\tx\nUid:\t1000\t0\t0\t0\nGid:\t0\t0\t0\t0\n')).toBe(1000);
    expect(parseStatusUid('Name:\tx\n')).toBe(-1);
  });
});

describe('parseLayout: the image and the kernel-thread flag', () => {
  // A 52-field line: fields 9 (flags), 26 (startcode), 28 (startstack) and 47 (start_brk) as given.
  const withLayout = (comm: string, code: string, stack: string, brk: string, flags = 4194560) => {
    const rest = Array.from({ length: 50 }, () => '0');
    rest[0] = 'S';
    rest[6] = String(flags);
    rest[23] = code;
    rest[25] = stack;
    rest[44] = brk;
    return `9 (${comm}) ${rest.join(' ')}\n`;
  };

  it('reads startcode:start_brk:startstack after the last parenthesis', () => {
    expect(parseImage(withLayout('a) (b', '4194304', '140735000000000', '35000000'))).toBe(
      '4194304:35000000:140735000000000',
    );
  });

  it('is null where the kernel shows no layout: zeros (no memory, or hidden from the reader), a short line', () => {
    expect(parseImage(withLayout('x', '0', '0', '0'))).toBeNull();
    expect(parseImage(withLayout('x', '4194304', '0', '35000000'))).toBeNull();
    expect(parseImage('9 (x) S 1 2 3 0 -1')).toBeNull();
  });

  it('tells a kernel thread by PF_KTHREAD in field 9', () => {
    expect(parseLayout(withLayout('kworker/0:1', '0', '0', '0', 0x00208040)).kernelThread).toBe(true);
    expect(parseLayout(withLayout('sleep', '1', '2', '3', 4194560)).kernelThread).toBe(false);
  });
});

describe(`a fork's layout on the ${backend.name} backend`, () => {
  it("a fork shows its parent's layout until it execs, then its own; a scan asked for it finds both", async () => {
    // The parent forks a child that waits before it execs perl, as a launch's child does before its exec: until
    // the test opens the gate (at most 20 s), so the checks of the fork see it as one however loaded the machine.
    const gate = tmpDir('custody-gate-');
    const parent = spawn(
      PYTHON,
      [
        '-c',
        'import os, sys, time\npid = os.fork()\nif pid == 0:\n    for _ in range(1000):\n        if os.path.exists(sys.argv[3]): break\n        time.sleep(0.02)\n    os.execv(sys.argv[1], [sys.argv[1], "-e", "sleep 30", sys.argv[2]])\nprint(pid, flush=True)\ntime.sleep(30)',
        PERL,
        MARKER,
        join(gate.path, 'go'),
      ],
      { stdio: ['ignore', 'pipe', 'ignore'] },
    );
    let child = 0;
    try {
      child = Number(await new Promise<string>((r) => parent.stdout!.once('data', (d) => r(String(d)))));
      const image = imageOf(parent.pid!);
      expect(image).toMatch(/^\d+:\d+:\d+$/);
      expect(imageOf(child)).toBe(image);
      expect(backend.execStage(child, image!)).toBe('fork');
      const rows = await backend.listProcesses(undefined, [image!]);
      expect(
        rows
          .filter((r) => r.image === image)
          .map((r) => r.pid)
          .sort(),
      ).toEqual([parent.pid, child].sort());
      // Kernel threads are marked when asked (kthreadd is pid 2 where this is the host's pid namespace); a scan not asked marks nothing.
      const kthreads = rows.filter((r) => r.kernelThread);
      expect(kthreads.filter((r) => r.argv.length > 0)).toEqual([]);
      const kthreadd = existsSync('/proc/2/stat') ? readFileSync('/proc/2/stat', 'latin1') : '';
      if (parseLayout(kthreadd).kernelThread) expect(kthreads.map((r) => r.pid)).toContain(2);
      expect((await backend.listProcesses()).some((r) => r.image !== undefined || r.kernelThread !== undefined)).toBe(
        false,
      );
      writeFileSync(join(gate.path, 'go'), '');
      for (let i = 0; i < 1000 && backend.execStage(child, image!) !== 'done'; i++)
        await new Promise((r) => setTimeout(r, 10));
      expect(backend.execStage(child, image!)).toBe('done');
      expect(imageOf(child)).not.toBe(image);
      expect(imageOf(child)).toMatch(/^\d+:\d+:\d+$/);
      process.kill(child, 'SIGKILL');
      for (let i = 0; i < 300 && backend.execStage(child, image!) !== 'gone'; i++)
        await new Promise((r) => setTimeout(r, 10));
      expect(backend.execStage(child, image!)).toBe('gone');
    } finally {
      if (child > 0) killOwn(child);
      parent.kill('SIGKILL');
      await new Promise((r) =>
        parent.exitCode !== null || parent.signalCode !== null ? r(null) : parent.once('exit', r),
      );
      gate.cleanup();
    }
  });
});
