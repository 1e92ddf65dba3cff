// The README's code, checked as a newcomer meets it: every ```js and ```ts
// block is type-checked (strict; js with checkJs) against the built package's
// types, in an empty project whose node_modules/custody is this package, and
// the quick start block must be examples/quickstart.js verbatim (which the
// test suite runs). Needs dist/ built (npm run build:ts && npm run build:cjs).
//
//   node scripts/check-readme.mjs [FILE.md]   (default README.md)
import { execFileSync } from 'node:child_process';
import { mkdirSync, mkdtempSync, readFileSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

const root = resolve(import.meta.dirname, '..');
const file = process.argv[2] ?? 'README.md';
const text = readFileSync(resolve(root, file), 'utf8');
const blocks = [...text.matchAll(/^```(js|ts)\n([\s\S]*?)^```$/gm)].map((m) => ({ lang: m[1], code: m[2] }));
const fail = (why) => {
  console.error(`check-readme: ${file}: ${why}`);
  process.exit(1);
};
if (blocks.length === 0) fail('no ```js or ```ts block');
if (file === 'README.md') {
  const quick = readFileSync(join(root, 'examples', 'quickstart.js'), 'utf8');
  if (!blocks.some((b) => b.code === quick)) fail('the quick start block is not examples/quickstart.js verbatim');
}
const work = mkdtempSync(join(tmpdir(), 'custody-readme-'));
try {
  writeFileSync(join(work, 'package.json'), '{ "private": true, "type": "module" }\n');
  mkdirSync(join(work, 'node_modules'));
  symlinkSync(root, join(work, 'node_modules', 'custody'));
  const names = blocks.map((b, i) => {
    const name = `block${i + 1}.${b.lang}`;
    // Each block is a module of its own: its names do not meet another block's.
    writeFileSync(join(work, name), /^(import|export) /m.test(b.code) ? b.code : `${b.code}\nexport {};\n`);
    return name;
  });
  const compilerOptions = {
    target: 'ES2022',
    module: 'NodeNext',
    moduleResolution: 'NodeNext',
    lib: ['ES2022'],
    strict: true,
    allowJs: true,
    checkJs: true,
    noEmit: true,
    skipLibCheck: false,
    types: ['node'],
    typeRoots: [join(root, 'node_modules', '@types')],
  };
  writeFileSync(join(work, 'tsconfig.json'), JSON.stringify({ compilerOptions, files: names }, null, 2));
  try {
    execFileSync(process.execPath, [join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', work], {
      encoding: 'utf8',
      stdio: 'pipe',
    });
  } catch (err) {
    fail(`a code block does not type-check (blockN is the Nth block):\n${err.stdout}${err.stderr}`);
  }
  console.log(`check-readme: ${file}: ${blocks.length} code block(s) type-check against the built types`);
} finally {
  rmSync(work, { recursive: true, force: true });
}
