#!/usr/bin/env node
// Checks every prebuilt addon in prebuilds/ and prints what each one needs:
//   - the ELF machine matches the folder's arch (linux-x64 = x86-64, linux-arm64 = AArch64)
//   - the libc tag matches what it links (glibc: libc.so.6; musl: libc.musl-*.so.1 / libc.so)
//   - its glibc floor: the highest GLIBC_x.y symbol version it imports (objdump -T),
//     and the same for libstdc++ (GLIBCXX_) and its ABI (CXXABI_)
//
//   node scripts/check-prebuilds.mjs [--require=linux-x64-glibc ...] [--all] [--max-glibc=2.31] [--fresh] [--json]
//
// --all requires linux-{x64,arm64}-{glibc,musl}; a missing one fails the check.
// --max-glibc fails any glibc prebuild whose floor is above the given version.
// --fresh fails any prebuild older than binding.gyp or a file in native/ (a
//   stale addon does not match the JavaScript it would ship with).
import { spawnSync } from 'node:child_process';
import { existsSync, openSync, readSync, closeSync, readdirSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const dir = path.join(root, 'prebuilds');
const ALL = ['linux-x64-glibc', 'linux-arm64-glibc', 'linux-x64-musl', 'linux-arm64-musl'];
const MACHINES = { 62: 'x64', 183: 'arm64' };

const args = process.argv.slice(2);
const required = new Set(args.filter((a) => a.startsWith('--require=')).map((a) => a.slice('--require='.length)));
if (args.includes('--all')) for (const t of ALL) required.add(t);
const maxGlibc = args.find((a) => a.startsWith('--max-glibc='))?.slice('--max-glibc='.length) ?? null;
const json = args.includes('--json');
const fresh = args.includes('--fresh');
const sources = [
  path.join(root, 'binding.gyp'),
  ...readdirSync(path.join(root, 'native')).map((f) => path.join(root, 'native', f)),
];
const newestSource = sources.reduce((a, f) => (statSync(f).mtimeMs > statSync(a).mtimeMs ? f : a));

function cmpVersion(a, b) {
  const pa = a.split('.').map(Number);
  const pb = b.split('.').map(Number);
  for (let i = 0; i < Math.max(pa.length, pb.length); i++) {
    const d = (pa[i] ?? 0) - (pb[i] ?? 0);
    if (d) return d;
  }
  return 0;
}

function elfMachine(file) {
  const fd = openSync(file, 'r');
  try {
    const b = Buffer.alloc(20);
    readSync(fd, b, 0, 20, 0);
    if (b.readUInt32BE(0) !== 0x7f454c46) return null;
    return MACHINES[b.readUInt16LE(18)] ?? `e_machine ${b.readUInt16LE(18)}`;
  } finally {
    closeSync(fd);
  }
}

function objdump(flag, file) {
  const r = spawnSync('objdump', [flag, file], { encoding: 'utf8' });
  if (r.error || r.status !== 0) throw new Error(`objdump ${flag} ${file} failed: ${r.error?.message ?? r.stderr}`);
  return r.stdout;
}

/** Highest version per prefix among the symbol versions the file imports (objdump -T). */
function floors(file) {
  const out = { GLIBC: null, GLIBCXX: null, CXXABI: null };
  for (const m of objdump('-T', file).matchAll(/\b(GLIBC|GLIBCXX|CXXABI)_([0-9][0-9.]*)\b/g)) {
    const [, prefix, version] = m;
    if (!out[prefix] || cmpVersion(version, out[prefix]) > 0) out[prefix] = version;
  }
  return out;
}

function needed(file) {
  return [...objdump('-p', file).matchAll(/^\s*NEEDED\s+(\S+)/gm)].map((m) => m[1]);
}

const rows = [];
const problems = [];
if (existsSync(dir)) {
  for (const tuple of readdirSync(dir).sort()) {
    const [platform, arch] = tuple.split('-');
    if (!statSync(path.join(dir, tuple)).isDirectory()) continue;
    for (const name of readdirSync(path.join(dir, tuple)).sort()) {
      if (!name.endsWith('.node')) continue;
      const file = path.join(dir, tuple, name);
      const tags = name.split('.').slice(1, -1);
      const libc = tags.find((t) => t === 'glibc' || t === 'musl') ?? null;
      const target = `${platform}-${arch}-${libc}`;
      const row = { target, file: path.relative(root, file), bytes: statSync(file).size };
      rows.push(row);
      row.stale = statSync(file).mtimeMs < statSync(newestSource).mtimeMs;
      if (fresh && row.stale) {
        problems.push(`${row.file}: older than ${path.relative(root, newestSource)} (rebuild: npm run prebuilds)`);
      }
      if (platform !== 'linux') continue;
      row.machine = elfMachine(file);
      if (row.machine !== arch) problems.push(`${row.file}: built for ${row.machine}, folder says ${arch}`);
      row.needed = needed(file);
      const linksGlibc = row.needed.includes('libc.so.6');
      const linksMusl = row.needed.some((n) => /^libc\.musl-.*\.so\.1$/.test(n) || n === 'libc.so');
      if (!libc) problems.push(`${row.file}: no libc tag (build with prebuildify --tag-libc)`);
      else if (libc === 'glibc' && !linksGlibc)
        problems.push(`${row.file}: tagged glibc but links ${row.needed.join(', ')}`);
      else if (libc === 'musl' && !linksMusl)
        problems.push(`${row.file}: tagged musl but links ${row.needed.join(', ')}`);
      Object.assign(row, floors(file));
      if (libc === 'glibc' && maxGlibc && row.GLIBC && cmpVersion(row.GLIBC, maxGlibc) > 0) {
        problems.push(`${row.file}: needs glibc ${row.GLIBC}, above the allowed floor ${maxGlibc}`);
      }
    }
  }
}
for (const t of required) {
  if (!rows.some((r) => r.target === t)) problems.push(`missing prebuild for ${t}`);
}

if (json) {
  console.log(JSON.stringify({ prebuilds: rows, problems }, null, 2));
} else {
  for (const r of rows) {
    const floor = r.GLIBC ? `glibc >= ${r.GLIBC}` : 'no glibc';
    const cxx = r.GLIBCXX ? `, libstdc++ GLIBCXX_${r.GLIBCXX} CXXABI_${r.CXXABI}` : '';
    console.log(`${r.target.padEnd(18)} ${r.file}  ${r.bytes} bytes  ${floor}${cxx}  [${(r.needed ?? []).join(' ')}]`);
  }
  if (rows.length === 0) console.log('no prebuilds in prebuilds/');
  for (const p of problems) console.error(`check-prebuilds: ${p}`);
}
process.exit(problems.length ? 1 : 0);
