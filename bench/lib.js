// Shared helpers for the benchmarks: building the C baselines, running
// worker processes that answer with one JSON line, statistics, and plain-text
// tables. No dependencies beyond Node itself.
import { execFileSync, spawn } from 'node:child_process';
import { mkdirSync, renameSync, statSync } from 'node:fs';
import os from 'node:os';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

export const benchDir = dirname(fileURLToPath(import.meta.url));
export const buildDir = join(benchDir, '.build');

const CFLAGS = ['-O2', '-Wall', '-Werror'];

/**
 * Compiles bench/c/<name>.c to bench/.build/<name> unless the binary is
 * already newer than its source, and returns the binary's path.
 */
export function buildC(name) {
  const src = join(benchDir, 'c', `${name}.c`);
  const out = join(buildDir, name);
  const srcTime = statSync(src).mtimeMs;
  let outTime = -Infinity;
  try {
    outTime = statSync(out).mtimeMs;
  } catch {
    /* not built yet */
  }
  if (outTime >= srcTime) return out;
  mkdirSync(buildDir, { recursive: true });
  // Compile to a private name and rename: a concurrent run never executes a
  // half-written binary, and a failed compile never leaves one behind.
  const tmp = `${out}.${process.pid}.tmp`;
  try {
    execFileSync(process.env.CC || 'cc', [...CFLAGS, '-o', tmp, src], { stdio: ['ignore', 'inherit', 'inherit'] });
  } catch (err) {
    throw new Error(`building ${src} failed (${err.message.split('\n')[0]})`);
  }
  renameSync(tmp, out);
  return out;
}

/**
 * Runs a command that prints its result as a JSON line on stdout (the last
 * non-empty line counts, so stray logging above it is harmless). Resolves
 * with the parsed object; rejects with the stderr tail when the command
 * fails, times out or prints no JSON.
 */
export function runJson(command, args = [], { env = process.env, timeoutMs = 120_000 } = {}) {
  return new Promise((resolve, reject) => {
    const child = spawn(command, args, { env, stdio: ['ignore', 'pipe', 'pipe'] });
    let stdout = '';
    let stderr = '';
    child.stdout.setEncoding('utf8').on('data', (d) => (stdout += d));
    child.stderr.setEncoding('utf8').on('data', (d) => (stderr += d));
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    const what = [command, ...args].join(' ');
    child.on('error', (err) => {
      clearTimeout(timer);
      reject(new Error(`${what}: ${err.message}`));
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      // What it said, not where: stack frames would push the error's message out of the last lines.
      const tail = stderr
        .trim()
        .split('\n')
        .filter((l) => !/^\s+at /.test(l))
        .slice(-8)
        .join('\n');
      if (code !== 0) {
        const how = signal
          ? `was killed by ${signal}${signal === 'SIGKILL' ? ` (timeout ${timeoutMs} ms?)` : ''}`
          : `exited ${code}`;
        reject(new Error(`${what} ${how}${tail ? `:\n${tail}` : ''}`));
        return;
      }
      const line = stdout.trim().split('\n').pop() ?? '';
      try {
        resolve(JSON.parse(line));
      } catch {
        reject(
          new Error(
            `${what} printed no JSON result (last line: ${JSON.stringify(line.slice(0, 200))})${tail ? `\n${tail}` : ''}`,
          ),
        );
      }
    });
  });
}

/**
 * Runs a bench module as a worker: `node [execArgv] <file> --worker ...args`,
 * with `env` added to this process's environment. Workers get --expose-gc so
 * they can start every timed round from a collected heap.
 */
export function runWorker(file, args = [], { env = {}, execArgv = ['--expose-gc'], timeoutMs } = {}) {
  return runJson(process.execPath, [...execArgv, file, '--worker', ...args.map(String)], {
    env: { ...process.env, ...env },
    timeoutMs,
  });
}

/** True when the module at `importMetaUrl` is the script node was started with. */
export function isMain(importMetaUrl) {
  return process.argv[1] !== undefined && importMetaUrl === pathToFileURL(process.argv[1]).href;
}

/**
 * Lets a bench module run as a script: `node bench/x.js [--quick]` runs the
 * whole bench and prints its report; `--worker ...` runs one variant and
 * `--holder ...` a process that holds others for the bench (the harness
 * starts both as child processes). `options(argv)` adds the module's own
 * command-line options to what run() gets.
 */
export async function runAsScript(importMetaUrl, { run, report, worker, holder, options = () => ({}) }) {
  if (!isMain(importMetaUrl)) return;
  const argv = process.argv.slice(2);
  if (argv[0] === '--worker') {
    await worker(argv.slice(1));
  } else if (argv[0] === '--holder' && holder) {
    await holder(argv.slice(1));
  } else {
    console.log(report(await run({ quick: argv.includes('--quick'), ...options(argv) })));
  }
}

/** --sizes=a,b,...: only these N (a standalone run, to look at a few sizes). */
export function sizesOption(argv) {
  const arg = argv.find((a) => a.startsWith('--sizes='));
  if (!arg) return {};
  const sizes = arg.slice('--sizes='.length).split(',').map(Number);
  if (!sizes.every((x) => Number.isSafeInteger(x) && x >= 10))
    throw new Error('--sizes takes integers >= 10, comma-separated');
  return { sizes: sizes.sort((a, b) => a - b) };
}

/**
 * The targets table every bench ends with. A target is { description, value,
 * op, limit, met } (ratios by default; `shown`/`shownLimit` override the
 * text). `reason` says why a target was missed (a timeout, say); `skipped`
 * says why it could not be measured at all (neither met nor missed).
 * Reported, never enforced: in quick mode the result says so, with
 * `quickNote` to add why.
 */
export function formatTargets(targets, { quick, quickNote = '' } = {}) {
  const result = (t) => {
    if (t.skipped) return `skipped: ${t.skipped}`;
    const notes = [quick ? 'not enforced' : '', quick ? quickNote : '', t.reason ?? ''].filter((x) => x !== '');
    const verdict = t.met ? 'met' : quick ? 'missed' : 'MISSED';
    return notes.length ? `${verdict} (${notes.join('; ')})` : verdict;
  };
  return formatTable(
    ['target', 'measured', 'limit', 'result'],
    targets.map((t) => [
      t.description,
      t.skipped && t.shown === undefined ? 'n/a' : (t.shown ?? formatMeasuredRatio(t)),
      t.shownLimit ?? `${t.op} ${formatRatio(t.limit)}`,
      result(t),
    ]),
    { align: 'lrrl' },
  );
}

/**
 * Starts a long-lived, idle `sleep` to be the target of per-process work.
 * stop() kills it and resolves once it is reaped.
 */
export function startSleeper(seconds = 3600) {
  const child = spawn('sleep', [String(seconds)], { stdio: 'ignore' });
  const exited = new Promise((resolve) => child.once('exit', resolve));
  return {
    pid: child.pid,
    // Resolves once sleep has exec'd: until then /proc shows node's argv.
    ready: new Promise((resolve, reject) => {
      child.once('spawn', resolve);
      child.once('error', reject);
    }),
    async stop() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await exited;
    },
  };
}

// ---- statistics ----

export function median(xs) {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  const mid = s.length >> 1;
  return s.length % 2 ? s[mid] : (s[mid - 1] + s[mid]) / 2;
}

/** Median, min and max of per-round samples. */
export function summarize(rounds) {
  return { median: median(rounds), min: Math.min(...rounds), max: Math.max(...rounds), rounds };
}

// ---- formatting ----

/** 29228.5 -> "29,229" */
export function formatNs(ns) {
  return Number.isFinite(ns) ? Math.round(ns).toLocaleString('en-US') : 'n/a';
}

/** 1.234 -> "1.23x" */
export function formatRatio(x) {
  return Number.isFinite(x) ? `${x.toFixed(2)}x` : 'n/a';
}

/** A target's ratio, with a third decimal where two would print it equal to its limit ("1.50x <= 1.50x MISSED"). */
function formatMeasuredRatio(t) {
  const shown = formatRatio(t.value);
  return Number.isFinite(t.value) && shown === formatRatio(t.limit) && t.value !== t.limit
    ? `${t.value.toFixed(3)}x`
    : shown;
}

/**
 * A plain-text table with aligned columns. `align` is one letter per column,
 * 'l' or 'r'; by default the first column is left-aligned and the rest, which
 * are usually numbers, right-aligned.
 */
export function formatTable(header, rows, { align, indent = '  ' } = {}) {
  const all = [header, ...rows].map((r) => r.map((c) => String(c ?? '')));
  const widths = header.map((_, i) => Math.max(...all.map((r) => (r[i] ?? '').length)));
  const alignOf = (i) => align?.[i] ?? (i === 0 ? 'l' : 'r');
  const line = (r) =>
    indent +
    r
      .map((c, i) => (alignOf(i) === 'r' ? c.padStart(widths[i]) : c.padEnd(widths[i])))
      .join('  ')
      .trimEnd();
  const rule = indent + widths.map((w) => '-'.repeat(w)).join('  ');
  return [line(all[0]), rule, ...all.slice(1).map(line)].join('\n');
}

/** What the numbers were measured on. */
export function machineInfo() {
  const cpus = os.cpus();
  return {
    cpu: cpus[0]?.model ?? 'unknown',
    // availableParallelism honours CPU affinity, as nproc(1) does.
    nproc: typeof os.availableParallelism === 'function' ? os.availableParallelism() : cpus.length,
    kernel: os.release(),
    platform: process.platform,
    arch: process.arch,
    node: process.version,
    loadavg: os.loadavg().map((x) => Math.round(x * 100) / 100),
    date: new Date().toISOString(),
  };
}
