// scan: listing every process with its argv — the process-table scan a
// sweep (and recovery of a `starting` manifest) begins with — while 2 000
// idle processes are alive. ms per full scan of /proc for custody native
// (backend.listProcesses(): the addon's one readdir pass, stat + cmdline +
// status per process), custody js (the same in JavaScript), the ps-list
// package (psList(), as a user calls it: it runs `ps` twice and reads each
// process's exe link) and the C limit (bench/c/scan.c: the addon's syscall
// sequence with no JavaScript), in three variants: "stat+cmdline+owner" is the
// same work as native (the uid hint is the /proc/<pid> directory's owner),
// "stat+cmdline" is that without it, "stat+cmdline+status" reads the real uid
// from status as native once did.
//
//   node bench/scan.js [--quick]            standalone: prints the table
//   import { run, report } from './scan.js'   for bench/run.js
//
// The idle processes are bench/c/idle.c, with a marker in their argv, started
// by a holder process (this file with --holder) so that the harness process
// keeps no children: the holder starts them, says so, and on EOF of its stdin
// (the harness ending it, or dying) kills and reaps every one. idle.c dies
// with its parent (PR_SET_PDEATHSIG), and the harness sweeps the marker after
// the holder as a safety net. Every variant must list every marked process.
//
// Each variant runs in its own process, one at a time (on a 2-CPU machine
// running them together would measure contention):
//   node bench/scan.js --worker <native|js|ps-list> <rounds> <warmup> <idle argv...>
// prints one JSON line in the same shape as the C program's ("marked": how
// many listed processes have exactly the idle argv).
import { spawn as cpSpawn } from 'node:child_process';
import { readFileSync } from 'node:fs';
import os from 'node:os';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { buildC, formatRatio, formatTable, formatTargets, isMain, runJson, runWorker, summarize } from './lib.js';
import { childrenOf, cpuTicks, newMarker, noiseLine, otherCpuShare, sweepMarker } from './procs.js';

export const name = 'scan';

// ps-list / native >= 7: a sweep that scans should not cost what shelling out to ps costs.
const PSLIST_OVER_NATIVE_MIN = 7;
// native / C (same work) <= 1.5: the addon may add JS object creation, not syscalls.
const NATIVE_OVER_C_MAX = 1.5;

// A scan of ~2 100 processes costs ~65 ms natively and ~110 ms through
// ps-list on an idle 2-CPU VM; starting an idle process from node ~1 ms
// (~3 ms when the machine is busy). Quick holds 1 000 idle processes and
// takes ~3 s in all (~6 s busy); full holds 2 000 (~10 s, ~20 s busy).
const PARAMS = {
  quick: { idle: 1000, rounds: 5, warmup: 1 },
  full: { idle: 2000, rounds: 15, warmup: 3 },
};

// idle's arguments before the marker: sleep an hour (it dies with its holder long before).
const IDLE_ARGS = ['3600'];

// Idle processes killed at a time at the end.
const KILL_BATCH = 50;

// Room left for everything else on the machine when checking the limits.
const PROCESS_HEADROOM = 1000;

const VARIANTS = [
  { key: 'c-owner', kind: 'c', mode: 'stat-cmdline-owner', label: 'C: stat+cmdline+owner (same work)' },
  { key: 'c-status', kind: 'c', mode: 'stat-cmdline-status', label: 'C: stat+cmdline+status' },
  { key: 'c', kind: 'c', mode: 'stat-cmdline', label: 'C: stat+cmdline' },
  { key: 'native', kind: 'node', label: 'custody native', env: { CUSTODY_BACKEND: 'native' } },
  { key: 'js', kind: 'node', label: 'custody js', env: { CUSTODY_BACKEND: 'js' } },
  { key: 'ps-list', kind: 'node', label: 'ps-list 9 (psList())', env: {} },
];

/**
 * How many idle processes the machine's limits allow beside what runs now:
 * RLIMIT_NPROC (soft; counts tasks, i.e. threads, of our uid — we count all
 * tasks on the machine, which is at least that), kernel.pid_max and
 * kernel.threads-max, each minus PROCESS_HEADROOM. Limits are read, never raised.
 */
function idleBudget(wanted) {
  const limits = [];
  try {
    const line = readFileSync('/proc/self/limits', 'utf8').split('\n').find((l) => l.startsWith('Max processes'));
    const soft = line?.slice('Max processes'.length).trim().split(/\s+/)[0];
    if (soft && soft !== 'unlimited') limits.push({ what: 'RLIMIT_NPROC', n: Number(soft) });
  } catch {
    /* unknown: no limit to respect */
  }
  for (const [what, file] of [
    ['pid_max', '/proc/sys/kernel/pid_max'],
    ['threads-max', '/proc/sys/kernel/threads-max'],
  ]) {
    try {
      limits.push({ what, n: Number(readFileSync(file, 'utf8').trim()) });
    } catch {
      /* unknown */
    }
  }
  let tasks = 0;
  try {
    tasks = Number(readFileSync('/proc/loadavg', 'utf8').split(' ')[3].split('/')[1]);
  } catch {
    /* unknown */
  }
  let count = wanted;
  let limitedBy = null;
  for (const { what, n } of limits) {
    const room = n - tasks - PROCESS_HEADROOM;
    if (room < count) {
      count = Math.max(0, room);
      limitedBy = `${what} ${n}, ${tasks} tasks running`;
    }
  }
  return { count, limitedBy };
}

/**
 * Starts the holder and its `count` idle processes. Resolves once all have
 * exec'd, with stop(): ends the holder (it kills and reaps them all) and
 * resolves with what it reported.
 */
async function startIdle(idleBin, marker, count) {
  const holder = cpSpawn(process.execPath, [fileURLToPath(import.meta.url), '--holder', idleBin, marker, String(count)], {
    stdio: ['pipe', 'pipe', 'inherit'],
  });
  // 'close', not 'exit': by then every line it printed has been read.
  const exited = new Promise((resolve) => holder.once('close', (code, signal) => resolve({ code, signal })));
  const lines = createInterface({ input: holder.stdout });
  const messages = [];
  let wake = null;
  lines.on('line', (l) => {
    try {
      messages.push(JSON.parse(l));
    } catch {
      messages.push({ error: `holder printed ${JSON.stringify(l.slice(0, 200))}` });
    }
    wake?.();
  });
  const next = async (timeoutMs) => {
    let timer;
    const timeout = new Promise((r) => (timer = setTimeout(() => r({ timeout: true }), timeoutMs)));
    try {
      while (messages.length === 0) {
        const done = await Promise.race([exited.then((s) => ({ exit: s })), new Promise((r) => (wake = r)), timeout]);
        if (messages.length > 0) break;
        if (done?.exit) throw new Error(`idle holder exited ${JSON.stringify(done.exit)} before reporting`);
        if (done?.timeout) throw new Error(`idle holder did not report within ${timeoutMs} ms`);
      }
      return messages.shift();
    } finally {
      clearTimeout(timer);
    }
  };
  const stop = async () => {
    holder.stdin.end();
    const timer = setTimeout(() => holder.kill('SIGKILL'), 60_000);
    try {
      const status = await exited;
      if (status.code !== 0) throw new Error(`idle holder ended ${JSON.stringify(status)}`);
      const report = messages.find((m) => m.stopped !== undefined);
      if (!report) throw new Error('idle holder ended without reporting its idle processes reaped');
      return report;
    } finally {
      clearTimeout(timer);
    }
  };
  let ready;
  try {
    // ~1-3 ms per idle process on a busy 2-CPU VM; generous.
    ready = await next(30_000 + count * 20);
    if (ready.error) throw new Error(`idle holder: ${ready.error}`);
  } catch (err) {
    await stop().catch(() => {});
    throw err;
  }
  return { ...ready, stop };
}

/** Measures every variant with the idle processes alive and returns the results. */
export async function run({ quick = false } = {}) {
  const params = PARAMS[quick ? 'quick' : 'full'];
  const { rounds, warmup } = params;
  const cBin = buildC('scan');
  const idleBin = buildC('idle');
  const budget = idleBudget(params.idle);
  if (budget.count < 1) throw new Error(`scan: no room for idle processes (${budget.limitedBy})`);
  const marker = newMarker('scan');
  // What every idle process's argv is; each variant counts the entries with
  // exactly this argv (the holder and the workers carry the marker too).
  const idleArgv = [idleBin, ...IDLE_ARGS, marker];
  const loadBefore = os.loadavg();
  const cpuBefore = cpuTicks();

  const raw = {};
  let idle;
  let loadAfter;
  let holderReport = null;
  let escaped = 0;
  try {
    idle = await startIdle(idleBin, marker, budget.count);
    for (const v of VARIANTS) {
      raw[v.key] =
        v.kind === 'c'
          ? await runJson(cBin, [v.mode, rounds, warmup, ...idleArgv].map(String))
          : await runWorker(fileURLToPath(import.meta.url), [v.key, rounds, warmup, ...idleArgv], { env: v.env });
    }
    loadAfter = os.loadavg();
  } finally {
    try {
      if (idle) holderReport = await idle.stop();
    } finally {
      // Anything still carrying the marker escaped the holder: killed here.
      escaped = sweepMarker(marker);
    }
  }
  const leftover = childrenOf(process.pid).length + escaped;
  const cpuAfter = cpuTicks();

  // Every variant must have listed every idle process, argv included.
  for (const v of VARIANTS) {
    if (raw[v.key].marked !== budget.count) {
      throw new Error(`scan: ${v.label} listed ${raw[v.key].marked} of the ${budget.count} idle processes with their argv`);
    }
  }
  if (holderReport.reaped !== budget.count || holderReport.odd !== 0 || holderReport.leftover !== 0) {
    throw new Error(`scan: the holder reaped ${holderReport.reaped} of ${budget.count} idle processes: ${JSON.stringify(holderReport)}`);
  }

  const variants = {};
  for (const v of VARIANTS) {
    const { rounds_ms: roundsMs, listed_rounds: listedRounds } = raw[v.key];
    variants[v.key] = {
      label: v.label,
      ...summarize(roundsMs),
      listed: summarize(listedRounds),
      usPerProcess: summarize(roundsMs.map((x, i) => (x * 1000) / listedRounds[i])),
    };
  }
  // Ratios compare the cost per listed process (median over rounds): the
  // table is the whole machine's, and other work may start or end processes
  // between and during variants. With a steady table this is the ratio of
  // ms per scan.
  const ms = (key) => variants[key].usPerProcess.median;
  const psListOverNative = ms('ps-list') / ms('native');
  const nativeOverC = ms('native') / ms('c-owner');
  const round2 = (xs) => xs.map((x) => Math.round(x * 100) / 100);
  return {
    name,
    quick,
    params: {
      ...params,
      idle: budget.count,
      idleWanted: params.idle,
      idleLimitedBy: budget.limitedBy,
      idleProgram: 'bench/c/idle.c',
      idleStartMs: idle.startMs,
      idleStopMs: holderReport.stopMs,
      unit: 'ms per full scan of /proc (every process, argv included), median of rounds',
    },
    variants,
    ratios: {
      psListOverNative,
      nativeOverC,
      nativeOverCNoStatus: ms('native') / ms('c'),
      jsOverNative: ms('js') / ms('native'),
      statusShareOfC: 1 - ms('c') / ms('c-status'),
    },
    targets: [
      {
        id: 'psListOverNative',
        description: `native at least ${PSLIST_OVER_NATIVE_MIN}x faster than ps-list`,
        value: psListOverNative,
        op: '>=',
        limit: PSLIST_OVER_NATIVE_MIN,
        met: psListOverNative >= PSLIST_OVER_NATIVE_MIN,
      },
      {
        id: 'nativeOverC',
        description: `native within ${NATIVE_OVER_C_MAX}x of C: stat+cmdline+owner`,
        value: nativeOverC,
        op: '<=',
        limit: NATIVE_OVER_C_MAX,
        met: nativeOverC <= NATIVE_OVER_C_MAX,
      },
    ],
    leftoverProcesses: leftover,
    loadavg: { before: round2(loadBefore), after: round2(loadAfter) },
    otherCpu: otherCpuShare(cpuBefore, cpuAfter, os.cpus().length),
  };
}

function fmtMs(x) {
  return Number.isFinite(x) ? (x >= 100 ? x.toFixed(0) : x.toFixed(1)) : 'n/a';
}

/** The results as a printable table. */
export function report(results) {
  const { params, variants, ratios, targets, quick, leftoverProcesses, loadavg, otherCpu } = results;
  const n = (x) => x.toLocaleString('en-US');
  const cs = variants['c-owner'].usPerProcess.median;
  const lines = [
    `scan: list every process with its argv, ${n(params.idle)} idle processes alive (${params.idleProgram});` +
      ` ${params.rounds} rounds after ${params.warmup} warm-up; ms per full scan${quick ? ' (quick)' : ''}`,
    quick ? `  quick holds ${n(params.idle)} idle processes, not the full run's ${n(PARAMS.full.idle)}` : null,
    params.idleLimitedBy ? `  idle processes limited to ${n(params.idle)} of ${n(params.idleWanted)} by ${params.idleLimitedBy}` : null,
    `  "listed": processes per scan, median (the machine's whole table, not only the idle ones);` +
      ` ratios compare us per listed process, median of rounds`,
    formatTable(
      ['variant', 'median', 'min', 'max', 'listed', 'us/process', 'vs C same work'],
      VARIANTS.map(({ key }) => {
        const v = variants[key];
        const listed = v.listed.min === v.listed.max ? n(v.listed.median) : `${n(v.listed.median)} (${n(v.listed.min)}-${n(v.listed.max)})`;
        return [v.label, fmtMs(v.median), fmtMs(v.min), fmtMs(v.max), listed, v.usPerProcess.median.toFixed(1), formatRatio(v.usPerProcess.median / cs)];
      }),
    ),
    '',
    `  ps-list / native: ${formatRatio(ratios.psListOverNative)}; js / native: ${formatRatio(ratios.jsOverNative)};` +
      ` native / C stat+cmdline+owner: ${formatRatio(ratios.nativeOverC)}; native / C stat+cmdline: ${formatRatio(ratios.nativeOverCNoStatus)}`,
    `  status read share of the C scan: ${(ratios.statusShareOfC * 100).toFixed(0)}%;` +
      ` idle processes started in ${n(Math.round(params.idleStartMs))} ms, killed and reaped in ${n(Math.round(params.idleStopMs))} ms`,
    '',
    formatTargets(targets, { quick, quickNote: 'quick' }),
    '',
    `  leftover processes after the run: ${leftoverProcesses}`,
    noiseLine(otherCpu, loadavg),
  ];
  return lines.filter((l) => l !== null).join('\n');
}

// ---- worker side ----

/** A scan function for the variant, and how to count marked entries in its result. */
async function makeScan(variant) {
  if (variant === 'native' || variant === 'js') {
    // Imported only here, after the parent set CUSTODY_BACKEND: the backend
    // module the sweep uses, and its listProcesses() as the sweep calls it.
    const { backend, capabilities } = await import('../dist/backend/index.js');
    const caps = capabilities();
    if (caps.backend !== variant) throw new Error(`asked for the ${variant} backend, custody loaded ${caps.backend}: ${caps.reason}`);
    return {
      scan: async () => backend.listProcesses(),
      marked: (list, want) => list.filter((p) => p.argv.length === want.length && p.argv.every((a, i) => a === want[i])).length,
    };
  }
  if (variant === 'ps-list') {
    const { default: psList } = await import('ps-list');
    return {
      scan: () => psList(),
      // ps-list gives the command line as one string, elements joined by spaces.
      marked: (list, want) => list.filter((p) => p.cmd === want.join(' ')).length,
    };
  }
  throw new Error(`unknown variant ${variant}`);
}

async function worker([variant, roundsArg, warmupArg, ...idleArgv]) {
  const [rounds, warmup] = [roundsArg, warmupArg].map(Number);
  const { scan, marked } = await makeScan(variant);
  let list;
  for (let i = 0; i < warmup; i++) list = await scan();
  const roundsMs = [];
  const listedRounds = [];
  for (let r = 0; r < rounds; r++) {
    // Each round from a collected heap, so no round pays for another's garbage.
    globalThis.gc?.();
    const t0 = performance.now();
    list = await scan();
    roundsMs.push(performance.now() - t0);
    listedRounds.push(list.length);
  }
  process.stdout.write(
    `${JSON.stringify({ variant, ms_per_scan: summarize(roundsMs).median, rounds_ms: roundsMs, listed_rounds: listedRounds, listed: list.length, marked: marked(list, idleArgv) })}\n`,
  );
}

/**
 * Holder side: start `count` idle processes, report once all have exec'd,
 * then on EOF of stdin kill them all (SIGKILL) and report once all are reaped.
 */
async function holder([idleBin, marker, countArg]) {
  const count = Number(countArg);
  const t0 = performance.now();
  const children = [];
  const ended = [];
  try {
    for (let i = 0; i < count; i++) {
      const c = cpSpawn(idleBin, [...IDLE_ARGS, marker], { stdio: 'ignore' });
      children.push(c);
      ended.push(new Promise((resolve) => c.once('exit', (code, signal) => resolve({ code, signal }))));
      // uv_spawn returns once the child has exec'd (or failed to): an error
      // event here means it never ran.
      await new Promise((resolve, reject) => {
        c.once('spawn', resolve);
        c.once('error', reject);
      });
    }
    process.stdout.write(`${JSON.stringify({ started: children.length, startMs: performance.now() - t0 })}\n`);
  } catch (err) {
    process.stdout.write(`${JSON.stringify({ error: `started ${children.length} of ${count}: ${err.message}` })}\n`);
  }
  // EOF on stdin: the harness is done (or gone).
  process.stdin.resume();
  await new Promise((resolve) => process.stdin.once('end', resolve).once('error', resolve));
  const t1 = performance.now();
  // In batches: 2 000 tasks made runnable at once by SIGKILL would show in
  // the load average for a minute, as if the machine had been busy.
  const st = [];
  for (let i = 0; i < children.length; i += KILL_BATCH) {
    for (const c of children.slice(i, i + KILL_BATCH)) if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
    st.push(...(await Promise.all(ended.slice(i, i + KILL_BATCH))));
  }
  const stopMs = performance.now() - t1;
  const odd = st.filter((s) => s.signal !== 'SIGKILL').length;
  process.stdout.write(`${JSON.stringify({ stopped: children.length, reaped: st.length, odd, stopMs, leftover: childrenOf(process.pid).length })}\n`);
  process.exit(0);
}

if (isMain(import.meta.url)) {
  const argv = process.argv.slice(2);
  if (argv[0] === '--worker') {
    await worker(argv.slice(1));
  } else if (argv[0] === '--holder') {
    await holder(argv.slice(1));
  } else {
    const results = await run({ quick: argv.includes('--quick') });
    console.log(report(results));
  }
}
