// An agent that loads custody late (in a worker, as a plugin, once its fd
// table is full of sockets) may have only a few fds to spare. The package's
// entry points, as a consumer names them ('custody' through import and
// through require), must load and spawn with ten. Node's ESM loader reads a
// module graph's files in parallel, one fd each, so an entry of many ES
// modules failed with EMFILE there; the import entry is the CommonJS build
// re-exported (dist/custody.mjs), which loads one file at a time.
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backend } from '../src/backend/index.js';
import { expectNoLeaks } from './helpers/leaks.js';

expectNoLeaks();

const ROOT = join(import.meta.dirname, '..');
const FREE = 10;

// Fills the fd table, gives back FREE, then loads the package by its name
// (a self-reference: the script runs inside the package) and spawns.
const agent = (load: string) => `
import { closeSync, openSync } from 'node:fs';
import { createRequire } from 'node:module';
const hoard = [];
try {
  for (;;) hoard.push(openSync('/dev/null', 'r'));
} catch (e) {
  if (e.code !== 'EMFILE') throw e;
}
for (let i = 0; i < ${FREE}; i++) closeSync(hoard.pop());
let result;
try {
  const custody = ${load};
  const h = custody.spawn('/bin/true', [], { stdio: 'ignore' });
  result = { backend: custody.capabilities().backend, code: (await h.exited).code };
} catch (e) {
  result = { error: e.code ?? String(e), message: e.message };
}
for (const fd of hoard) closeSync(fd);
process.stdout.write(JSON.stringify(result));
`;

describe.each([
  ['import', "await import('custody')"],
  ['require', "createRequire(import.meta.url)('custody')"],
])('custody loaded through %s with ten fds to spare', (_how, load) => {
  it('loads, picks the backend asked for, and spawns', () => {
    // A limit of 256 keeps the hoard small; the self-reference resolves from the package root.
    const out = execFileSync(
      '/bin/sh',
      ['-c', 'ulimit -n 256 && exec "$0" --input-type=module -e "$1"', process.execPath, agent(load)],
      {
        cwd: ROOT,
        env: { ...process.env, CUSTODY_BACKEND: backend.name },
        encoding: 'utf8',
        timeout: 30_000,
      },
    );
    expect(JSON.parse(out)).toEqual({ backend: backend.name, code: 0 });
  });
});
