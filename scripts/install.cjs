'use strict';
// The install step is never mandatory: load a prebuild, else build from
// source where a compiler exists, else leave the pure-JS backend to run and
// let capabilities() say why. CUSTODY_REQUIRE_NATIVE=1 turns a failed build
// into a failed install (this repository's own CI sets it).
const { spawnSync } = require('node:child_process');
const path = require('node:path');

const bin = require.resolve('node-gyp-build/bin.js');
const result = spawnSync(process.execPath, [bin], {
  cwd: path.join(__dirname, '..'),
  stdio: 'inherit',
});
if (result.status !== 0) {
  const why = result.error ? result.error.message : `node-gyp-build exited with ${result.status ?? result.signal}`;
  if (process.env.CUSTODY_REQUIRE_NATIVE === '1') {
    console.error(`custody: native addon failed to build (${why})`);
    process.exit(1);
  }
  console.warn(`custody: native addon unavailable (${why}); the pure-JS backend will be used`);
}
