/** src/bytes.ts on fixtures: the lossless form of byte strings, its inverse, and its display. */
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { decodeArg, displayArg, encodeArg, hasEscapedBytes, isByteString, splitCmdlineBytes } from '../src/bytes.js';

describe('bytes', () => {
  it('decodes valid UTF-8 as itself and every byte of an invalid sequence as U+DC00 + byte', () => {
    expect(decodeArg(Buffer.from('vm-café', 'utf8'))).toBe('vm-café');
    expect(decodeArg(Buffer.from([0x76, 0xff]))).toBe('v\udcff');
    // An overlong '/' and an encoded surrogate are not UTF-8: each byte is escaped.
    expect(decodeArg(Buffer.from([0xc0, 0xaf]))).toBe('\udcc0\udcaf');
    expect(decodeArg(Buffer.from([0xed, 0xa0, 0x80]))).toBe('\udced\udca0\udc80');
    // A truncated sequence before valid text.
    expect(decodeArg(Buffer.from([0xe2, 0x82, 0x41]))).toBe('\udce2\udc82A');
    expect(decodeArg(Buffer.from('😀', 'utf8'))).toBe('😀');
  });

  it('round-trips every byte string, and no two byte strings share a form', () => {
    fc.assert(
      fc.property(fc.uint8Array({ maxLength: 24 }), fc.uint8Array({ maxLength: 24 }), (a, b) => {
        const [sa, sb] = [decodeArg(a), decodeArg(b)];
        expect(encodeArg(sa)).toEqual(Buffer.from(a));
        expect(isByteString(sa)).toBe(true);
        expect(sa === sb).toBe(Buffer.from(a).equals(Buffer.from(b)));
      }),
      { numRuns: 500 },
    );
  });

  it('refuses a string with a lone surrogate that stands for no byte; displays escapes as \\xNN', () => {
    expect(isByteString('a\ud800')).toBe(false);
    expect(isByteString('a\udc10')).toBe(false);
    expect(() => encodeArg('\ud800')).toThrow(RangeError);
    expect(hasEscapedBytes('plain')).toBe(false);
    expect(hasEscapedBytes('\ud83d\ude00')).toBe(false);
    expect(displayArg('vm\udcff-\udc80')).toBe('vm\\xff-\\x80');
  });

  it('splits a cmdline on NUL, keeping a last piece without one and empty arguments', () => {
    expect(splitCmdlineBytes(Buffer.alloc(0))).toEqual([]);
    expect(splitCmdlineBytes(Buffer.from('a\0\0b\0'))).toEqual(['a', '', 'b']);
    expect(splitCmdlineBytes(Buffer.from('rewritten title'))).toEqual(['rewritten title']);
    expect(splitCmdlineBytes(Buffer.from([0x61, 0, 0xff, 0]))).toEqual(['a', '\udcff']);
  });
});
