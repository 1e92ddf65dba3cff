#!/usr/bin/env node
// Builds the CommonJS entry (dist/cjs) from the same TypeScript sources as the
// ESM build, so `require('custody')` gets the real, synchronous API (Node 20
// cannot require() an ES module).
//
// The sources are ESM and one of them (src/backend/addon.ts) finds the package
// root and its require() through `import.meta.url`, which CommonJS does not
// have. This script copies src/ to a staging folder and, in each file that uses
// it, replaces `import.meta.url` (and .filename, .dirname) with those of that
// file's ESM twin (dist/cjs/backend/addon.js -> dist/backend/addon.js), so every
// path computed from them is the same in both builds. Nothing else is changed. tsc then
// compiles the copy with module "node16" under {"type": "commonjs"}, which
// types and emits it exactly as Node will run it.
import { spawnSync } from 'node:child_process';
import { cpSync, existsSync, mkdirSync, readFileSync, readdirSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const stage = path.join(root, 'node_modules', '.cache', 'custody-cjs');
const out = path.join(root, 'dist', 'cjs');

rmSync(stage, { recursive: true, force: true });
rmSync(out, { recursive: true, force: true });
mkdirSync(stage, { recursive: true });
cpSync(path.join(root, 'src'), path.join(stage, 'src'), { recursive: true });

function* walk(dir) {
  for (const name of readdirSync(dir)) {
    const file = path.join(dir, name);
    if (statSync(file).isDirectory()) yield* walk(file);
    else if (name.endsWith('.ts') && !name.endsWith('.d.ts')) yield file;
  }
}

const SHIM = '__custodyImportMetaUrl';
let shimmed = 0;
for (const file of walk(path.join(stage, 'src'))) {
  const text = readFileSync(file, 'utf8');
  if (!text.includes('import.meta')) continue;
  // The ESM twin of dist/cjs/<rel>.js is dist/<rel>.js: one level up from the cjs root.
  const rel = path.relative(path.join(stage, 'src'), file).replace(/\.ts$/, '.js');
  const depth = rel.split(path.sep).length - 1; // folders between dist/cjs and the file
  const twin = [...Array(depth + 1).fill('..'), ...rel.split(path.sep)].join('/');
  const body = text
    .replace(/\bimport\.meta\.url\b/g, SHIM)
    .replace(/\bimport\.meta\.filename\b/g, `${SHIM}_file`)
    .replace(/\bimport\.meta\.dirname\b/g, `__custodyDirname(${SHIM}_file)`);
  if (body.includes('import.meta')) {
    throw new Error(`${rel}: uses import.meta beyond url, filename and dirname; teach scripts/build-cjs.mjs about it`);
  }
  const header =
    `import { pathToFileURL as __custodyPathToFileURL } from 'node:url';\n` +
    `import { dirname as __custodyDirname, resolve as __custodyResolve } from 'node:path';\n` +
    `// CommonJS build: the path and URL this file has in the ESM build (scripts/build-cjs.mjs).\n` +
    `const ${SHIM}_file = __custodyResolve(__dirname, ${JSON.stringify(twin)});\n` +
    `const ${SHIM} = __custodyPathToFileURL(${SHIM}_file).href;\n`;
  // A shebang must stay the first line.
  const shebang = body.startsWith('#!') ? body.slice(0, body.indexOf('\n') + 1) : '';
  writeFileSync(file, shebang + header + body.slice(shebang.length));
  shimmed++;
}

writeFileSync(path.join(stage, 'package.json'), `${JSON.stringify({ type: 'commonjs' })}\n`);
writeFileSync(
  path.join(stage, 'tsconfig.json'),
  JSON.stringify(
    {
      extends: path.join(root, 'tsconfig.json'),
      compilerOptions: {
        module: 'Node16',
        moduleResolution: 'Node16',
        rootDir: 'src',
        outDir: out,
        declaration: true,
        declarationMap: false,
        stripInternal: true,
        sourceMap: false,
        typeRoots: [path.join(root, 'node_modules', '@types')],
      },
      include: ['src'],
    },
    null,
    2,
  ),
);

const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
const result = spawnSync(process.execPath, [tsc, '-p', path.join(stage, 'tsconfig.json')], { stdio: 'inherit' });
if (result.status !== 0) process.exit(result.status ?? 1);

writeFileSync(path.join(out, 'package.json'), `${JSON.stringify({ type: 'commonjs' })}\n`);
if (!existsSync(path.join(out, 'index.js')) || !existsSync(path.join(out, 'index.d.ts'))) {
  console.error('build-cjs: dist/cjs/index.js or index.d.ts missing after tsc');
  process.exit(1);
}
rmSync(stage, { recursive: true, force: true });
console.log(`build-cjs: dist/cjs built (${shimmed} file(s) shimmed for import.meta.url)`);

// The package's ES module entry is this CommonJS build, re-exported by name
// (dist/custody.mjs). Node's ESM loader reads a module graph's files in
// parallel, one fd each: the ~40 modules of dist/ failed to import with
// EMFILE in a process with 16 fds to spare, where require() reads one file at
// a time. It also makes `import` and `require` one instance: one addon
// dispatcher, one set of classes (instanceof holds across them). The names
// come from the built module itself, on the js backend so that no addon has
// to load at build time.
const names = spawnSync(
  process.execPath,
  ['-e', `process.stdout.write(JSON.stringify(Object.keys(require(${JSON.stringify(path.join(out, 'index.js'))}))))`],
  { encoding: 'utf8', env: { ...process.env, CUSTODY_BACKEND: 'js' } },
);
if (names.status !== 0) {
  console.error(`build-cjs: could not list the CommonJS build's exports:\n${names.stderr}`);
  process.exit(1);
}
const exported = JSON.parse(names.stdout).filter((n) => n !== '__esModule' && n !== 'default');
const bad = exported.filter((n) => !/^[A-Za-z_$][\w$]*$/.test(n));
if (bad.length > 0) {
  console.error(`build-cjs: exports that are not identifiers: ${bad.join(', ')}`);
  process.exit(1);
}
writeFileSync(
  path.join(root, 'dist', 'custody.mjs'),
  '// The ES module entry of custody: its CommonJS build, re-exported by name\n' +
    '// (generated by scripts/build-cjs.mjs; see there why).\n' +
    "import { createRequire } from 'node:module';\n\n" +
    "const custody = createRequire(import.meta.url)('./cjs/index.js');\n\n" +
    `export const {\n${exported.map((n) => `  ${n},\n`).join('')}} = custody;\n`,
);
console.log(`build-cjs: dist/custody.mjs re-exports ${exported.length} names`);
