'use strict';
// The install step is never mandatory: keep a prebuild that loads, else build
// from source where a compiler exists, else leave the pure-JS backend to run
// and let capabilities() say why. CUSTODY_REQUIRE_NATIVE=1 turns a failed
// build into a failed install (this repository's own CI sets it).
const { spawnSync } = require('node:child_process');
const fs = require('node:fs');
const path = require('node:path');

const root = path.join(__dirname, '..');
// Read by src/backend/addon.ts: capabilities().reason then says the source build
// was tried, and why it failed. Inside build/, so the next `node-gyp rebuild` clears it.
const errorFile = path.join(root, 'build', 'custody-install-error.txt');
fs.rmSync(errorFile, { force: true });

function unavailable(why, fix = '') {
  if (process.env.CUSTODY_REQUIRE_NATIVE === '1') {
    console.error(`custody: native addon failed to build (${why})`);
    process.exit(1);
  }
  console.warn(`custody: native addon unavailable (${why}); the pure-JS backend will be used${fix}`);
}

function onPath(cmd) {
  if (cmd.includes('/')) return fs.existsSync(cmd);
  return (process.env.PATH || '').split(path.delimiter).some((dir) => {
    try {
      fs.accessSync(path.join(dir || '.', cmd), fs.constants.X_OK);
      return true;
    } catch {
      return false;
    }
  });
}

/** What node-gyp needs and is not there: its Python, make, the compiler make calls (CXX, else g++). */
function missingTools() {
  const python = process.env.npm_config_python || process.env.PYTHON;
  const missing = [];
  if (!(python ? onPath(python) : onPath('python3') || onPath('python'))) missing.push(python || 'python3');
  if (!onPath('make')) missing.push('make');
  const cxx = (process.env.CXX || 'g++').split(' ')[0];
  if (!onPath(cxx)) missing.push(cxx);
  return missing;
}

// The addon is Linux-only (pidfds, /proc); elsewhere the js backend is chosen
// without loading it, so there is nothing to build and no compiler to need.
if (process.platform !== 'linux') {
  unavailable(`${process.platform} is not Linux`);
  process.exit(0);
}

// Does the addon node-gyp-build would pick (build/Release, else
// prebuilds/linux-<arch>/custody.<glibc|musl>.node) load here? Asked in a
// child, so a prebuild for another libc or arch cannot take this process down.
const load =
  "try { require('node-gyp-build')(process.argv[1]) } " +
  "catch (e) { process.stderr.write(String(e && e.message).split('\\n')[0]); process.exit(1) }";
const probe = spawnSync(process.execPath, ['-e', load, root], { cwd: root, encoding: 'utf8' });
if (probe.status === 0) process.exit(0);
const why = probe.stderr.trim() || `the load test ended with ${probe.status ?? probe.signal}`;
console.warn(`custody: no prebuilt addon loads here (${why}); building from source`);

// node-gyp-build's installer, told to build: `node-gyp rebuild`.
const bin = require.resolve('node-gyp-build/bin.js');
const result = spawnSync(process.execPath, [bin], {
  cwd: root,
  stdio: 'inherit',
  env: { ...process.env, npm_config_build_from_source: 'true' },
});
if (result.status !== 0) {
  const missing = missingTools();
  const why =
    (result.error ? result.error.message : `node-gyp rebuild exited with ${result.status ?? result.signal}`) +
    (missing.length ? `; not found on PATH: ${missing.join(', ')}` : '');
  try {
    fs.mkdirSync(path.dirname(errorFile), { recursive: true });
    fs.writeFileSync(errorFile, `${why}\n`);
  } catch {
    // A read-only package folder: the reason then only says no build was made.
  }
  unavailable(why, '. To build it: install g++, make and python3, then run `npm rebuild custody`');
}
