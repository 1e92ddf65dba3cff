// Guarded opens (src/state/files.ts) of paths something else may control:
// whatever is not a regular file is refused before it is opened (opening a
// device or a FIFO can have effects of its own), a symlink is never
// followed, and the fd handed back is of the very file that was looked at.
import { execFileSync } from 'node:child_process';
import {
  closeSync,
  fstatSync,
  constants as fsc,
  lstatSync,
  mkdirSync,
  readFileSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { fileKind, openRegular, refusedOpen, typeOfMode } from '../../src/state/files.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { MARKER, tmpDir } from '../helpers/procs.js';

const cleanups = cleanupAfterEach({ marker: MARKER });

function scratch(): (name: string) => string {
  const dir = tmpDir('custody-files-');
  cleanups.push(dir.cleanup);
  return (name) => join(dir.path, name);
}

/** The fd of a successful open, closed after the test. */
function opened(result: ReturnType<typeof openRegular>) {
  if (!('fd' in result)) throw new Error(`refused: ${result.refused}`);
  cleanups.push(() => closeSync(result.fd));
  return result;
}

describe(`guarded opens (${backend.name})`, () => {
  it('opens a regular file, and creates one only when asked, private by default', () => {
    const p = scratch();
    writeFileSync(p('log'), 'hello');
    const { fd, st } = opened(openRegular(p('log'), fsc.O_RDONLY));
    expect(readFileSync(fd, 'utf8')).toBe('hello');
    expect(st.ino).toBe(lstatSync(p('log')).ino);
    expect(() => openRegular(p('new'), fsc.O_WRONLY)).toThrow(expect.objectContaining({ code: 'ENOENT' }));
    const made = opened(openRegular(p('new'), fsc.O_WRONLY | fsc.O_CREAT));
    expect(fstatSync(made.fd).isFile()).toBe(true);
    expect(lstatSync(p('new')).mode & 0o777).toBe(0o600);
  });

  it('refuses, unopened, a FIFO without a reader, a symlink, a directory and a device', () => {
    const p = scratch();
    execFileSync('mkfifo', [p('fifo')]);
    writeFileSync(p('target'), 'secret');
    symlinkSync(p('target'), p('link'));
    mkdirSync(p('dir'));
    // Refused on the look, not on the open: an open for writing of a FIFO
    // nobody reads fails ENXIO, which would say "a FIFO or a socket".
    expect(openRegular(p('fifo'), fsc.O_WRONLY)).toEqual({ refused: 'is a FIFO' });
    expect(openRegular(p('link'), fsc.O_RDONLY)).toEqual({ refused: 'is a symlink (never followed)' });
    expect(openRegular(p('link'), fsc.O_WRONLY | fsc.O_TRUNC)).toEqual({ refused: 'is a symlink (never followed)' });
    expect(readFileSync(p('target'), 'utf8')).toBe('secret');
    expect(openRegular(p('dir'), fsc.O_RDONLY)).toEqual({ refused: 'is a directory' });
    expect(openRegular('/dev/null', fsc.O_WRONLY)).toEqual({ refused: 'is a character device' });
  });

  it('names every file type from a real stat mode as Stats does, and maps the errnos of a swapped path', () => {
    const p = scratch();
    execFileSync('mkfifo', [p('fifo')]);
    symlinkSync('/nonexistent', p('link'));
    for (const path of [p('fifo'), p('link'), '/dev/null', '/proc', '/proc/self/stat']) {
      const st = lstatSync(path);
      expect(fileKind(typeOfMode(st.mode)), path).toBe(fileKind(st));
    }
    expect(fileKind(lstatSync(p('fifo')))).toBe('a FIFO');
    expect(refusedOpen('ELOOP')).toBe('is a symlink (never followed)');
    expect(refusedOpen('ENXIO')).toBe('is a FIFO or a socket');
    expect(refusedOpen('EISDIR')).toBe('is a directory');
    expect(refusedOpen('EACCES')).toBeNull();
  });
});
