/**
 * src/errors.ts errnoError(): errors the JS side raises look like Node's own
 * system errors. The package exports every error class, and none of the
 * helpers that make them.
 */
import { constants } from 'node:os';
import { describe, expect, it } from 'vitest';
import * as errors from '../src/errors.js';
import { errnoError, isErrnoCode } from '../src/errors.js';
import * as custody from '../src/index.js';

describe('errnoError', () => {
  it.each([
    ['ESRCH', 'read', undefined, 'pid 7', 'read ESRCH (no such process): pid 7'],
    ['ENOENT', 'spawn', '/no/such', undefined, 'spawn /no/such ENOENT (no such file or directory)'],
    ['EPROTO', 'read', '/proc/1/stat', 'unparseable', 'read /proc/1/stat EPROTO (protocol error): unparseable'],
  ] as const)('%s from %s', (code, syscall, path, detail, message) => {
    const err = errnoError(code, syscall, path, detail);
    expect(err).toBeInstanceOf(Error);
    expect(err.message).toBe(message);
    expect(err).toMatchObject({ code, syscall, errno: -constants.errno[code] });
    expect('path' in err).toBe(path !== undefined);
    if (path !== undefined) expect(err.path).toBe(path);
  });

  it('isErrnoCode knows the platform errno names only', () => {
    expect(isErrnoCode('EAGAIN')).toBe(true);
    expect(isErrnoCode('ERR_CUSTODY_BUSY')).toBe(false);
    expect(isErrnoCode('toString')).toBe(false);
    expect(isErrnoCode(undefined)).toBe(false);
  });
});

describe('the package exports', () => {
  it('every error class, and not errnoError or isErrnoCode', () => {
    const classes = Object.entries(errors).filter(([, v]) => typeof v === 'function' && v.prototype instanceof Error);
    expect(classes.length).toBeGreaterThan(20);
    for (const [name, cls] of classes) expect(custody, name).toHaveProperty(name, cls);
    expect(Object.keys(custody)).not.toContain('errnoError');
    expect(Object.keys(custody)).not.toContain('isErrnoCode');
  });
});
