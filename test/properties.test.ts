// Property-based tests of the pure parsers and the manifest decoder: they
// read kernel text and files an attacker may have written, so they must
// never throw on any input, and never accept what is not well formed.
import fc from 'fast-check';
import { describe, expect, it } from 'vitest';
import { backend } from '../src/backend/index.js';
import type { NativeBackend } from '../src/backend/native.js';
import { BadManifestError } from '../src/errors.js';
import { parseStat, parseStatusUid, splitCmdline, type StatFields } from '../src/process/proc.js';
import { decodeManifest, MANIFEST_VERSION } from '../src/state/manifest.js';

const comm = fc.string({ maxLength: 16 }).filter((s) => !s.includes('\n') && !s.includes('\0'));
const statLine = fc.record({
  pid: fc.integer({ min: 1, max: 4194304 }),
  comm,
  state: fc.constantFrom('R', 'S', 'D', 'Z', 'T', 't', 'X', 'I'),
  ppid: fc.integer({ min: 0, max: 4194304 }),
  pgrp: fc.integer({ min: 0, max: 4194304 }),
  session: fc.integer({ min: 0, max: 4194304 }),
  startTicks: fc.integer({ min: 0, max: Number.MAX_SAFE_INTEGER }),
});
const render = (s: StatFields) =>
  `${s.pid} (${s.comm}) ${s.state} ${s.ppid} ${s.pgrp} ${s.session} 0 -1 4194560 1 0 0 0 1 2 0 0 20 0 1 0 ${s.startTicks} 100 20 18446744073709551615 0 0 0 0 0 0 0 0 0 0 0 0 17 1 0 0 0 0 0\n`;

const parsers: Array<[string, (t: string) => ReturnType<typeof parseStat>]> = [['ts', parseStat]];
if (backend.name === 'native') parsers.push(['native', (t) => (backend as NativeBackend).addon.parseStat(t)]);

describe.each(parsers)('parseStat properties (%s)', (_name, parse) => {
  it('round-trips every well-formed line, whatever the comm holds', () => {
    fc.assert(
      fc.property(statLine, (s) => {
        expect(parse(render(s))).toEqual(s);
      }),
      { numRuns: 500 },
    );
  });

  it('never throws on arbitrary text', () => {
    fc.assert(
      fc.property(fc.string({ maxLength: 300 }), (t) => {
        const r = parse(t);
        if (r !== null) {
          expect(Number.isSafeInteger(r.startTicks)).toBe(true);
          expect(r.state).toHaveLength(1);
        }
      }),
      { numRuns: 1000 },
    );
  });
});

describe('splitCmdline and parseStatusUid properties', () => {
  it("split inverts the kernel's join of argv (NUL-terminated, no NUL inside)", () => {
    const arg = fc.string({ maxLength: 20 }).filter((s) => !s.includes('\0'));
    fc.assert(
      fc.property(fc.array(arg, { minLength: 1, maxLength: 8 }), (argv) => {
        expect(splitCmdline(argv.map((a) => `${a}\0`).join(''))).toEqual(argv);
      }),
    );
  });

  it('reads the real uid from any status text with a Uid line, and -1 without', () => {
    fc.assert(
      fc.property(
        fc.integer({ min: 0, max: 2 ** 31 - 1 }),
        fc.string({ maxLength: 40 }).filter((s) => !s.includes('Uid:')),
        (uid, noise) => {
          expect(parseStatusUid(`Name:\tx\n${noise.replace(/\n/g, ' ')}\nUid:\t${uid}\t1\t2\t3\n`)).toBe(uid);
          expect(parseStatusUid(noise)).toBe(-1);
        },
      ),
    );
  });
});

describe('decodeManifest properties', () => {
  const valid = {
    version: MANIFEST_VERSION,
    id: 'vm-1',
    token: '0123456789abcdef0123456789abcdef',
    state: 'running',
    identity: {
      pid: 42,
      bootId: 'b',
      startTicks: 7,
      exe: { dev: 1, ino: 2 },
      pidfsId: '99',
      argv: ['x'],
      uid: 0,
      ppid: 1,
      state: 'S',
    },
    command: 'x',
    args: ['0123456789abcdef0123456789abcdef'],
    expect: [],
    paths: [],
    executable: null,
    pidSource: 'child',
    pidFile: null,
    createdAt: 'now',
    updatedAt: 'now',
    supervisorPid: 1,
    quarantine: null,
  };

  it('accepts the valid document', () => {
    expect(decodeManifest(JSON.stringify(valid), 'm', 'vm-1').id).toBe('vm-1');
  });

  it('never throws anything but BadManifestError on arbitrary text or JSON', () => {
    fc.assert(
      fc.property(fc.oneof(fc.string({ maxLength: 200 }), fc.json({ maxDepth: 3 })), (text) => {
        try {
          decodeManifest(text, 'm');
        } catch (err) {
          expect(err).toBeInstanceOf(BadManifestError);
        }
      }),
      { numRuns: 1000 },
    );
  });

  it('rejects any single field replaced by a value of another kind', () => {
    const keys = Object.keys(valid).filter((k) => k !== 'createdAt' && k !== 'updatedAt');
    const junk = fc.oneof(
      fc.constant(null),
      fc.integer(),
      fc.double(),
      fc.string({ maxLength: 5 }),
      fc.constant([]),
      fc.constant({}),
      fc.constant(true),
    );
    fc.assert(
      fc.property(fc.constantFrom(...keys), junk, (key, value) => {
        const original = (valid as Record<string, unknown>)[key];
        fc.pre(JSON.stringify(value) !== JSON.stringify(original));
        // Any other non-empty string is a legitimate command or executable.
        fc.pre(!((key === 'command' || key === 'executable') && typeof value === 'string' && value !== ''));
        fc.pre(!(key === 'pidFile' && typeof value === 'string' && value.startsWith('/')));
        // Both schema versions are read (1: custody 0.1's).
        fc.pre(!(key === 'version' && (value === 1 || value === 2)));
        // Any other pid is a legitimate writer.
        fc.pre(!(key === 'supervisorPid' && Number.isSafeInteger(value) && (value as number) >= 1));
        // Empty lists are legitimate for these.
        fc.pre(!((key === 'expect' || key === 'paths') && Array.isArray(value) && value.length === 0));
        // null is a legitimate value for these three.
        fc.pre(!(value === null && (key === 'executable' || key === 'pidFile' || key === 'quarantine')));
        fc.pre(!(key === 'identity' && value === null && valid.state !== 'running'));
        expect(() => decodeManifest(JSON.stringify({ ...valid, [key]: value }), 'm', 'vm-1')).toThrow(BadManifestError);
      }),
      { numRuns: 500 },
    );
  });

  it('rejects identities with numbers that are not pids or ticks', () => {
    const bad = fc.oneof(
      fc.double({ noInteger: true }),
      fc.integer({ max: 0 }),
      fc.constant(2 ** 60),
      fc.constant(Number.MAX_VALUE),
    );
    fc.assert(
      fc.property(bad, (n) => {
        expect(() =>
          decodeManifest(JSON.stringify({ ...valid, identity: { ...valid.identity, pid: n } }), 'm'),
        ).toThrow(BadManifestError);
      }),
    );
  });
});
