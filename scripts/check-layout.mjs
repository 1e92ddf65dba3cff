#!/usr/bin/env node
// Keeps the folder layout honest: no import cycle among src/**/*.ts, and no
// source file over MAX_LINES lines. A cycle means two modules each own part of
// one decision (the layout says one decision lives in one module); a file past
// the bound has grown a second concern.
//
// Type-only imports count: a cycle through types still ties the two modules'
// meanings together, and each type-only edge can be removed by moving the type
// to the module that owns it.
//
// Imports are read with TypeScript's own pre-processor, so imports in comments
// or strings are not counted and multi-line, re-export and dynamic imports are.
// Exit status: 0 when clean, 1 with every offender printed.
import { readdirSync, readFileSync, statSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

const MAX_LINES = 600;
const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const src = path.join(root, 'src');

function* sourceFiles(dir) {
  for (const name of readdirSync(dir).sort()) {
    const full = path.join(dir, name);
    if (statSync(full).isDirectory()) yield* sourceFiles(full);
    else if (name.endsWith('.ts') && !name.endsWith('.d.ts')) yield full;
  }
}

/** The src file a relative specifier names (`./x.js` → `x.ts`), or null for a package or a non-source file. */
function resolveImport(from, specifier) {
  if (!specifier.startsWith('.')) return null;
  const target = path.resolve(path.dirname(from), specifier);
  for (const candidate of [target.replace(/\.js$/, '.ts'), `${target}.ts`, path.join(target, 'index.ts')]) {
    try {
      if (statSync(candidate).isFile()) return candidate;
    } catch {
      // not this form
    }
  }
  return null;
}

const files = [...sourceFiles(src)];
const rel = (file) => path.relative(root, file);
const edges = new Map();
const tooLong = [];
for (const file of files) {
  const text = readFileSync(file, 'utf8');
  const lines = text.split('\n').length - (text.endsWith('\n') ? 1 : 0);
  if (lines > MAX_LINES) tooLong.push([rel(file), lines]);
  const imported = ts.preProcessFile(text, true, true).importedFiles;
  edges.set(file, [...new Set(imported.map((i) => resolveImport(file, i.fileName)).filter(Boolean))].sort());
}

// Tarjan's strongly connected components: every component of more than one
// file (or a file importing itself) holds at least one cycle.
const index = new Map();
const low = new Map();
const onStack = new Set();
const stack = [];
const components = [];
let counter = 0;
function connect(file) {
  index.set(file, counter);
  low.set(file, counter);
  counter++;
  stack.push(file);
  onStack.add(file);
  for (const next of edges.get(file)) {
    if (!index.has(next)) {
      connect(next);
      low.set(file, Math.min(low.get(file), low.get(next)));
    } else if (onStack.has(next)) {
      low.set(file, Math.min(low.get(file), index.get(next)));
    }
  }
  if (low.get(file) === index.get(file)) {
    const component = [];
    let member;
    do {
      member = stack.pop();
      onStack.delete(member);
      component.push(member);
    } while (member !== file);
    if (component.length > 1 || edges.get(file).includes(file)) components.push(component);
  }
}
for (const file of files) if (!index.has(file)) connect(file);

/** One concrete cycle inside a component, from its first file back to it (breadth-first, so the shortest). */
function cycleThrough(component) {
  const members = new Set(component);
  const start = [...component].sort()[0];
  const cameFrom = new Map([[start, null]]);
  const queue = [start];
  while (queue.length) {
    const file = queue.shift();
    for (const next of edges.get(file)) {
      if (!members.has(next)) continue;
      if (next === start) {
        const path = [start];
        for (let at = file; at !== start; at = cameFrom.get(at)) path.splice(1, 0, at);
        return [...path, start];
      }
      if (!cameFrom.has(next)) {
        cameFrom.set(next, file);
        queue.push(next);
      }
    }
  }
  return [start, start];
}

for (const component of components) {
  console.log(`import cycle among ${component.length} files: ${component.map(rel).sort().join(', ')}`);
  console.log(`  e.g. ${cycleThrough(component).map(rel).join(' -> ')}`);
}
for (const [file, lines] of tooLong.sort((a, b) => b[1] - a[1])) {
  console.log(`${file}: ${lines} lines (over ${MAX_LINES})`);
}
if (components.length || tooLong.length) {
  console.log(`check-layout: ${components.length} import cycle(s), ${tooLong.length} file(s) over ${MAX_LINES} lines`);
  process.exit(1);
}
console.log(`check-layout: ${files.length} files, no import cycle, none over ${MAX_LINES} lines`);
