/**
 * argv is bytes, not text. custody keeps each argument as a JavaScript
 * string that is lossless for any byte string: valid UTF-8 decodes as
 * itself, and every byte of an invalid sequence becomes the lone surrogate
 * U+DC00 + byte (the scheme Python calls surrogateescape). Two different
 * byte strings never give the same string, so comparing strings compares
 * bytes; JSON keeps lone surrogates (as \udcXX escapes), so manifests
 * round-trip. The native addon decodes with the same rule (native/bytes.cc).
 */
import { isUtf8 } from 'node:buffer';

/** Length of the RFC 3629 sequence at i (shortest form, no surrogates, <= U+10FFFF), or 0; its code point in out[0]. */
function utf8Sequence(b: Uint8Array, i: number, out: number[]): number {
  const c = b[i] ?? 0x80; // past the end: no sequence
  if (c < 0x80) {
    out[0] = c;
    return 1;
  }
  let len: number;
  let min: number;
  let cp: number;
  if (c >= 0xc2 && c <= 0xdf) [len, min, cp] = [2, 0x80, c & 0x1f];
  else if (c >= 0xe0 && c <= 0xef) [len, min, cp] = [3, 0x800, c & 0x0f];
  else if (c >= 0xf0 && c <= 0xf4) [len, min, cp] = [4, 0x10000, c & 0x07];
  else return 0;
  if (i + len > b.length) return 0;
  for (let k = 1; k < len; k++) {
    const n = b[i + k] ?? 0;
    if ((n & 0xc0) !== 0x80) return 0;
    cp = (cp << 6) | (n & 0x3f);
  }
  if (cp < min || cp > 0x10ffff || (cp >= 0xd800 && cp <= 0xdfff)) return 0;
  out[0] = cp;
  return len;
}

/** Bytes to custody's lossless string form. */
export function decodeArg(bytes: Uint8Array): string {
  const buf = Buffer.isBuffer(bytes) ? bytes : Buffer.from(bytes.buffer, bytes.byteOffset, bytes.byteLength);
  if (isUtf8(buf)) return buf.toString('utf8');
  let s = '';
  const cp = [0];
  for (let i = 0; i < buf.length; ) {
    const n = utf8Sequence(buf, i, cp);
    if (n === 0) {
      s += String.fromCharCode(0xdc00 + (buf[i] ?? 0));
      i++;
    } else {
      s += String.fromCodePoint(cp[0] ?? 0);
      i += n;
    }
  }
  return s;
}

/** Whether a string is the lossless form of some byte string (its only lone surrogates are escaped bytes 0x80-0xff). */
export function isByteString(s: string): boolean {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0xd800 || c > 0xdfff) continue;
    if (c <= 0xdbff && i + 1 < s.length) {
      const d = s.charCodeAt(i + 1);
      if (d >= 0xdc00 && d <= 0xdfff) {
        i++;
        continue;
      }
    }
    if (c < 0xdc80 || c > 0xdcff) return false;
  }
  return true;
}

/** Whether the string carries escaped (non-UTF-8) bytes. */
export function hasEscapedBytes(s: string): boolean {
  return /(?<![\ud800-\udbff])[\udc80-\udcff]/.test(s);
}

/**
 * A path as node:fs should be given it: the string itself, or its bytes where
 * it holds escaped ones (fs would encode a lone surrogate as U+FFFD and name
 * another file).
 */
export function fsPath(s: string): string | Buffer {
  return hasEscapedBytes(s) ? encodeArg(s) : s;
}

/** custody's string form back to its bytes (the inverse of decodeArg). Throws RangeError for a string that is not one. */
export function encodeArg(s: string): Buffer {
  // Checked first: Buffer.from would quietly turn a stray surrogate into U+FFFD, another byte string.
  if (!isByteString(s))
    throw new RangeError('not the lossless form of a byte string (a lone surrogate outside U+DC80-U+DCFF)');
  if (!hasEscapedBytes(s)) return Buffer.from(s, 'utf8');
  const parts: Buffer[] = [];
  let run = '';
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c >= 0xdc80 && c <= 0xdcff && !(i > 0 && s.charCodeAt(i - 1) >= 0xd800 && s.charCodeAt(i - 1) <= 0xdbff)) {
      if (run) parts.push(Buffer.from(run, 'utf8'));
      run = '';
      parts.push(Buffer.of(c - 0xdc00));
    } else run += s[i];
  }
  if (run) parts.push(Buffer.from(run, 'utf8'));
  return Buffer.concat(parts);
}

/** For people: escaped bytes shown as \xNN, everything else as the UTF-8 it is. */
export function displayArg(s: string): string {
  return s.replace(/(?<![\ud800-\udbff])[\udc80-\udcff]/g, (ch) => `\\x${(ch.charCodeAt(0) - 0xdc00).toString(16)}`);
}

/**
 * A cmdline buffer split on NUL, each piece decoded losslessly. A trailing NUL ends the last argument.
 * Sized before it is filled: grown by push, a four-argument array keeps room
 * for 17 (152 B), and an identity holds its argv for as long as it is tracked.
 */
export function splitCmdlineBytes(raw: Buffer): string[] {
  if (raw.length === 0) return [];
  let count = raw[raw.length - 1] === 0 ? 0 : 1;
  for (let nul = raw.indexOf(0); nul >= 0; nul = raw.indexOf(0, nul + 1)) count++;
  const out = new Array<string>(count);
  let start = 0;
  for (let i = 0; i < count; i++) {
    const nul = raw.indexOf(0, start);
    const end = nul < 0 ? raw.length : nul;
    out[i] = decodeArg(raw.subarray(start, end));
    start = end + 1;
  }
  return out;
}
