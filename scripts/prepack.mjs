#!/usr/bin/env node
// npm pack and npm publish run this first (prepack; `prepare` then builds dist/ and
// dist/cjs/ from src/), so the tarball ships what loads:
//   1. every prebuild this machine can build (scripts/prebuild.mjs all --missing:
//      the host's, and linux-arm64-glibc beside it with Debian's cross compiler),
//      keeping any already present and newer than native/ (the release workflow
//      puts all four in prebuilds/ before it publishes);
//   2. a refusal to pack without a prebuild for this machine's own target: such a
//      tarball, installed on a machine like this one without a compiler, would
//      quietly run the js backend.
// Targets this machine cannot build are named, with where they come from.
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const ALL = ['linux-x64-glibc', 'linux-arm64-glibc', 'linux-x64-musl', 'linux-arm64-musl'];

function run(what, args, options = {}) {
  const r = spawnSync(process.execPath, args, { cwd: root, stdio: 'inherit', ...options });
  if (r.status !== 0) {
    console.error(`prepack: ${what} failed; not packing`);
    process.exit(r.status ?? 1);
  }
  return r;
}

run('the prebuilds', [path.join(root, 'scripts', 'prebuild.mjs'), 'all', '--missing']);

const libc = existsSync('/etc/alpine-release') ? 'musl' : 'glibc';
const host = `${process.platform}-${process.arch}-${libc}`;
const check = spawnSync(process.execPath, [path.join(root, 'scripts', 'check-prebuilds.mjs'), '--json', '--fresh'], {
  cwd: root,
  encoding: 'utf8',
});
const { prebuilds, problems } = JSON.parse(check.stdout);
const present = new Set(prebuilds.filter((p) => !p.stale).map((p) => p.target));
const refuse = [...problems];
if (process.platform === 'linux' && !present.has(host)) {
  refuse.push(
    `no prebuild for this machine's target ${host} (install g++ and make, or put the release prebuilds in prebuilds/)`,
  );
}
if (present.size === 0) refuse.push('prebuilds/ holds no prebuild at all');
if (refuse.length) {
  for (const p of refuse) console.error(`prepack: ${p}`);
  console.error('prepack: refusing to pack a tarball without the prebuilds it should ship');
  process.exit(1);
}
const absent = ALL.filter((t) => !present.has(t));
if (absent.length) {
  console.warn(
    `prepack: this tarball carries no prebuild for ${absent.join(', ')}: there the install builds from source, ` +
      'or falls back to the js backend without a compiler. The release workflow builds all four ' +
      '(.github/workflows/prebuild.yml) and `npm publish` requires them.',
  );
}
console.log(`prepack: shipping prebuilds for ${[...present].join(', ')}`);
