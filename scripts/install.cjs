'use strict';
// The install step is never mandatory: keep a prebuild that loads, else build
// from source where a compiler exists, else leave the pure-JS backend to run
// and let capabilities() say why. CUSTODY_REQUIRE_NATIVE=1 turns a failed
// build into a failed install (this repository's own CI sets it).
const { spawnSync } = require('node:child_process');
const path = require('node:path');

const root = path.join(__dirname, '..');

function unavailable(why) {
  if (process.env.CUSTODY_REQUIRE_NATIVE === '1') {
    console.error(`custody: native addon failed to build (${why})`);
    process.exit(1);
  }
  console.warn(`custody: native addon unavailable (${why}); the pure-JS backend will be used`);
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
  unavailable(result.error ? result.error.message : `node-gyp rebuild exited with ${result.status ?? result.signal}`);
}
