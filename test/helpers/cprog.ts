/** Test programs written in C (test/fixtures/c), compiled once per test file into a temp dir. */
import { execFileSync } from 'node:child_process';
import { copyFileSync } from 'node:fs';
import { join } from 'node:path';

export const C_FIXTURES = join(import.meta.dirname, '..', 'fixtures', 'c');

/** Compiles test/fixtures/c/<name>.c into dir; returns the binary's path. */
export function compileC(name: string, dir: string, flags: string[] = []): string {
  const out = join(dir, name);
  execFileSync('cc', ['-O2', '-Wall', '-Werror', '-o', out, join(C_FIXTURES, `${name}.c`), ...flags], {
    stdio: 'inherit',
  });
  return out;
}

/** The same program under another name: another inode, so another executable to /proc/<pid>/exe. */
export function copyAs(binary: string, newPath: string): string {
  copyFileSync(binary, newPath);
  execFileSync('chmod', ['755', newPath]);
  return newPath;
}
