#!/usr/bin/env node
// Builds the prebuilt addons that ship in the package:
//   prebuilds/linux-<arch>/custody.<libc>.node   (prebuildify --napi --strip --tag-libc)
// One N-API build (NAPI_VERSION 8, binding.gyp) serves every Node >= 20.
//
//   node scripts/prebuild.mjs                 the host's target
//   node scripts/prebuild.mjs all             every target this machine can build
//   node scripts/prebuild.mjs linux-arm64-glibc linux-x64-glibc ...
//   node scripts/prebuild.mjs all --missing   only those absent or older than native/ (npm pack's prepack)
//
// Targets: linux-{x64,arm64}-{glibc,musl}. A target that is not the host's is
// cross-compiled with Debian's toolchains where one exists:
//   linux-arm64-glibc on x64  g++-aarch64-linux-gnu (CC/CXX/strip aarch64-linux-gnu-*)
//   linux-x64-glibc on arm64  g++-x86-64-linux-gnu
//   *-musl on a glibc host    not possible with Debian's packages (no C++ standard
//                             library built for musl); built natively on Alpine by
//                             .github/workflows/prebuild.yml
// Each build runs in a scratch copy of binding.gyp + native/ so the working
// tree's build/ (the developer's addon) is left alone. Each result is checked
// by scripts/check-prebuilds.mjs (ELF machine, libc, glibc floor).
import { spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdtempSync, readFileSync, rmSync, symlinkSync } from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const TARGETS = ['linux-x64-glibc', 'linux-arm64-glibc', 'linux-x64-musl', 'linux-arm64-musl'];
const GNU = { x64: 'x86_64-linux-gnu', arm64: 'aarch64-linux-gnu' };

function hostLibc() {
  if (process.platform !== 'linux') return null;
  // Same rule as node-gyp-build and prebuildify: Alpine is musl.
  if (existsSync('/etc/alpine-release')) return 'musl';
  const report = process.report?.getReport();
  return report?.header?.glibcVersionRuntime ? 'glibc' : 'musl';
}

const host = `${process.platform}-${process.arch}-${hostLibc()}`;

function onPath(cmd) {
  return spawnSync('sh', ['-c', `command -v ${cmd}`], { stdio: 'ignore' }).status === 0;
}

/** The toolchain for a target on this host, or why there is none. */
function toolchain(target) {
  const [platform, arch, libc] = target.split('-');
  if (platform !== 'linux') return { error: 'only linux targets are prebuilt' };
  if (target === host) {
    const cxx = process.env.CXX?.split(' ')[0] || 'g++';
    const absent = [cxx, 'make'].filter((c) => !onPath(c));
    if (absent.length) return { error: `${absent.join(' and ')} not found (apt-get install g++ make python3)` };
    return { env: {}, strip: 'strip' };
  }
  if (process.platform !== 'linux') return { error: `cannot cross-compile from ${process.platform}` };
  if (libc === 'musl' || hostLibc() === 'musl') {
    return {
      error:
        `${target} cannot be cross-compiled on a ${host} host: Debian packages musl's C library (musl-dev) ` +
        `but no C++ standard library built for it, and the addon is C++ (node-addon-api, exceptions); ` +
        `build it natively on Alpine (see .github/workflows/prebuild.yml)`,
    };
  }
  const triple = GNU[arch];
  if (!triple) return { error: `unknown arch ${arch}` };
  const cxx = `${triple}-g++`;
  if (!onPath(cxx)) return { error: `${cxx} not found (apt-get install g++-${triple.replace(/_/g, '-')})` };
  return {
    env: { CC: `${triple}-gcc`, CXX: cxx, LINK: cxx, AR: `${triple}-ar` },
    strip: `${triple}-strip`,
  };
}

let targets = process.argv.slice(2);
const missingOnly = targets.includes('--missing');
targets = targets.filter((t) => t !== '--missing');
const all = targets.includes('all');
if (targets.length === 0) targets = [host];
if (all) targets = TARGETS;
for (const t of targets) {
  if (!TARGETS.includes(t)) {
    console.error(`prebuild: unknown target ${t} (one of ${TARGETS.join(', ')}, or all)`);
    process.exit(2);
  }
}

// node-gyp needs Node's headers. Where they sit beside this node (<prefix>/include/node,
// as in Node's own tarballs and Debian's package) use them rather than download them;
// npm passes its own nodedir setting the same way (npm_config_nodedir).
const env = { ...process.env };
const prefix = path.resolve(path.dirname(process.execPath), '..');
if (!env.npm_config_nodedir && existsSync(path.join(prefix, 'include', 'node', 'node_api.h'))) {
  env.npm_config_nodedir = prefix;
}

/** Targets whose prebuild is present and newer than the addon's sources (scripts/check-prebuilds.mjs decides). */
function upToDate() {
  const r = spawnSync(process.execPath, [path.join(root, 'scripts', 'check-prebuilds.mjs'), '--json'], {
    cwd: root,
    encoding: 'utf8',
  });
  if (r.error || r.stdout === '') throw new Error(`check-prebuilds failed: ${r.error?.message ?? r.stderr}`);
  return new Set(
    JSON.parse(r.stdout)
      .prebuilds.filter((p) => !p.stale)
      .map((p) => p.target),
  );
}

const built = [];
const skipped = [];
const kept = missingOnly ? targets.filter((t) => upToDate().has(t)) : [];
targets = targets.filter((t) => !kept.includes(t));
for (const target of targets) {
  const [, arch, libc] = target.split('-');
  const tc = toolchain(target);
  if ('error' in tc) {
    if (!all) {
      console.error(`prebuild: ${tc.error}`);
      process.exit(1);
    }
    skipped.push(`${target}: ${tc.error}`);
    continue;
  }
  const scratch = mkdtempSync(path.join(os.tmpdir(), `custody-prebuild-${target}-`));
  try {
    for (const f of ['package.json', 'binding.gyp', 'native']) {
      cpSync(path.join(root, f), path.join(scratch, f), { recursive: true });
    }
    symlinkSync(path.join(root, 'node_modules'), path.join(scratch, 'node_modules'));
    const prebuildify = path.join(root, 'node_modules', 'prebuildify', 'bin.js');
    const args = [
      prebuildify,
      '--napi',
      '--strip',
      '--tag-libc',
      `--target=node@${process.versions.node}`,
      `--arch=${arch}`,
      `--strip-bin=${tc.strip}`,
      `--out=${root}`,
    ];
    console.log(`prebuild: ${target}${Object.keys(tc.env).length ? ` with ${tc.env.CXX}` : ''}`);
    const r = spawnSync(process.execPath, args, {
      cwd: scratch,
      stdio: 'inherit',
      env: { ...env, ...tc.env, PREBUILD_LIBC: libc },
    });
    if (r.status !== 0) {
      console.error(`prebuild: ${target} failed`);
      process.exit(1);
    }
    built.push(target);
  } finally {
    rmSync(scratch, { recursive: true, force: true });
  }
}

if (built.length) {
  const check = spawnSync(
    process.execPath,
    [path.join(root, 'scripts', 'check-prebuilds.mjs'), ...built.map((t) => `--require=${t}`)],
    {
      cwd: root,
      stdio: 'inherit',
    },
  );
  if (check.status !== 0) process.exit(check.status ?? 1);
}
for (const s of skipped) console.warn(`prebuild: skipped ${s}`);
if (kept.length) console.log(`prebuild: kept ${kept.join(', ')} (present and newer than native/)`);
const name = JSON.parse(readFileSync(path.join(root, 'package.json'), 'utf8')).name;
console.log(`prebuild: built ${built.length ? built.join(', ') : 'nothing'} (prebuilds/linux-*/${name}.*.node)`);
