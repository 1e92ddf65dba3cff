// removeDeclaredPaths (src/state/paths.ts): a manifest names these paths, so
// they are hostile. What it is handed that is not a socket or a regular file
// (a device node, a symlink to a socket it would remove) stays, and every
// path it could not even look at is a warning, never silence.
import { execFileSync } from 'node:child_process';
import { existsSync, lstatSync, symlinkSync, writeFileSync } from 'node:fs';
import { createServer } from 'node:net';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { type CustodyEvent, emitter } from '../../src/events.js';
import { removeDeclaredPaths } from '../../src/state/paths.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { isRoot, MARKER, tmpDir } from '../helpers/procs.js';

const cleanups = cleanupAfterEach({ marker: MARKER });

function scratch() {
  const dir = tmpDir('custody-paths-');
  cleanups.push(dir.cleanup);
  const events: CustodyEvent[] = [];
  return { p: (name: string) => join(dir.path, name), events, emit: emitter((e) => events.push(e)) };
}

describe(`declared paths (${backend.name})`, () => {
  it('removes a socket and a regular file, and nothing a symlink points at', async () => {
    const { p, events, emit } = scratch();
    const server = createServer();
    await new Promise<void>((r) => server.listen(p('live.sock'), r));
    cleanups.push(() => new Promise<void>((r) => server.close(() => r())));
    symlinkSync(p('live.sock'), p('alias.sock'));
    writeFileSync(p('vm.pid'), '1');
    expect(removeDeclaredPaths([p('alias.sock'), p('vm.pid')], emit)).toEqual([p('vm.pid')]);
    // The symlink is reported and left; the socket it names is untouched.
    expect(lstatSync(p('live.sock')).isSocket()).toBe(true);
    expect(lstatSync(p('alias.sock')).isSymbolicLink()).toBe(true);
    expect(existsSync(p('vm.pid'))).toBe(false);
    expect(events).toEqual([expect.objectContaining({ type: 'warning', id: undefined, path: p('alias.sock') })]);
    expect(removeDeclaredPaths([p('live.sock')], emit)).toEqual([p('live.sock')]);
    expect(existsSync(p('live.sock'))).toBe(false);
  });

  it('leaves a device node a manifest names, and says what it is', async (ctx) => {
    ctx.skip(!isRoot(), 'needs root: mknod of a character device');
    const { p, events, emit } = scratch();
    // The same device as /dev/null, made here so that a broken removal costs nothing.
    execFileSync('mknod', [p('null'), 'c', '1', '3']);
    expect(removeDeclaredPaths([p('null')], emit, 'vm')).toEqual([]);
    expect(lstatSync(p('null')).isCharacterDevice()).toBe(true);
    expect(events.map((e) => [e.id, e.message])).toEqual([
      ['vm', `declared path ${p('null')} is a character device, not a socket or regular file: left alone`],
    ]);
  });

  it('a path it cannot look at is a warning; an absent one is nothing to do', () => {
    const { p, events, emit } = scratch();
    writeFileSync(p('file'), 'x');
    expect(removeDeclaredPaths([p('file/under'), p('absent')], emit, 'vm')).toEqual([]);
    expect(events).toEqual([
      expect.objectContaining({
        type: 'warning',
        id: 'vm',
        path: p('file/under'),
        message: expect.stringMatching(/could not be inspected: .*ENOTDIR/),
      }),
    ]);
    expect(existsSync(p('file'))).toBe(true);
  });
});
