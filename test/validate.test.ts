// Argument validation (src/validate.ts): every public entry point checks its
// input here before any syscall, and bad input is ERR_CUSTODY_INVALID_ARG
// with a message naming the argument. The pid bound is the running kernel's.
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { backend } from '../src/backend/index.js';
import { encodeArg } from '../src/bytes.js';
import {
  argvOf,
  assertCwd,
  assertDuration,
  assertEnv,
  assertPid,
  assertSignallable,
  assertString,
  assertStringArray,
  describe as describeValue,
  pidMax,
} from '../src/validate.js';
import { expectNoLeaks } from './helpers/leaks.js';

expectNoLeaks();

const invalid = (message: RegExp) =>
  expect.objectContaining({ code: 'ERR_CUSTODY_INVALID_ARG', message: expect.stringMatching(message) });

describe(`validate (${backend.name})`, () => {
  it('bounds a pid by this kernel’s pid_max, and refuses init and this process as a signal target', () => {
    const max = Number(readFileSync('/proc/sys/kernel/pid_max', 'utf8'));
    expect(pidMax()).toBe(max);
    expect(() => assertPid(max)).not.toThrow();
    expect(() => assertPid(1)).not.toThrow();
    for (const bad of [0, -1, 1.5, max + 1, 2 ** 32 + 1, Number.NaN, '12', 12n, null, undefined]) {
      expect(() => assertPid(bad, 'target'), String(bad)).toThrow(invalid(/^target must be an integer from 1 to /));
    }
    expect(() => assertPid(max + 1)).toThrow(invalid(new RegExp(`from 1 to ${max}, got ${max + 1}$`)));
    expect(() => assertSignallable(1)).toThrow(invalid(/init/));
    expect(() => assertSignallable(process.pid)).toThrow(invalid(/this process itself/));
    expect(() => assertSignallable(process.ppid)).not.toThrow();
  });

  it('argv: strings or bytes, the bytes kept exactly; NUL and lone surrogates that stand for no byte refused', () => {
    const bytes = Buffer.from([0x61, 0xff, 0xc3, 0x28, 0x62]);
    const [asString] = argvOf([bytes], 'args');
    expect(encodeArg(asString!)).toEqual(bytes);
    expect(argvOf(['plain', '\udcff'], 'args')).toEqual(['plain', '\udcff']);
    expect(() => argvOf('x', 'args')).toThrow(invalid(/^args must be an array/));
    expect(() => assertStringArray(['a\0b'], 'args')).toThrow(invalid(/NUL/));
    expect(() => assertStringArray(['\ud800'], 'args')).toThrow(invalid(/lone surrogate/));
    expect(() => assertStringArray(['\udc7f'], 'args')).toThrow(invalid(/lone surrogate/));
    expect(() => assertStringArray([1], 'args')).toThrow(invalid(/array of strings/));
    expect(() => assertString('', 'command')).toThrow(invalid(/non-empty/));
  });

  it('env, cwd and durations: what the kernel or a timer cannot take is refused with the argument named', () => {
    expect(() => assertEnv({ A: '1', B: undefined })).not.toThrow();
    expect(() => assertEnv({ 'A=B': '1' })).toThrow(invalid(/"A=B" is not a valid variable/));
    expect(() => assertEnv({ '': '1' })).toThrow(invalid(/not a valid variable/));
    expect(() => assertEnv({ A: 'x\0y' })).toThrow(invalid(/not a valid variable/));
    expect(() => assertEnv({ A: 1 })).toThrow(invalid(/env\.A must be a string, not number/));
    expect(() => assertEnv(['A=1'])).toThrow(invalid(/object of variable names/));
    expect(() => assertCwd('')).toThrow(invalid(/cwd/));
    expect(() => assertCwd('/tmp\0x')).toThrow(invalid(/cwd/));
    expect(() => assertCwd(undefined)).not.toThrow();
    expect(() => assertDuration(0, 'graceMs')).not.toThrow();
    for (const bad of [-1, Number.POSITIVE_INFINITY, Number.NaN, '5'])
      expect(() => assertDuration(bad, 'graceMs')).toThrow(
        invalid(/^graceMs must be an integer number of milliseconds from 0 to 2147483647, got /),
      );
    // What a message shows of a value: bounded, and never the value's own toString.
    expect(describeValue('x'.repeat(100))).toBe(JSON.stringify(`${'x'.repeat(64)}…`));
    expect(describeValue({ toString: () => 'forged' })).toBe('object');
  });
});
