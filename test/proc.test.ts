import { describe, expect, it } from 'vitest';
import { backend } from '../src/backend/index.js';
import type { NativeBackend } from '../src/backend/native.js';
import { parseStat, parseStatusUid, splitCmdline } from '../src/proc.js';

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
