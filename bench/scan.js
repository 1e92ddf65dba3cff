// scan: the process-table scans a sweep and a recovery begin with, while
// 2 000 idle processes are alive, in ms per scan of /proc:
//   - custody's sweep, as a caller runs it: sweep({ argv, dryRun: true })
//     with an argv no process has (what a periodic sweep usually finds: the
//     scan is all of its cost), on native and js. The same sweep with the
//     idle processes' argv must match every one of them (timed too, as
//     context: each match is pinned and re-read under its pidfd);
//   - backend.listProcesses(), the full scan (stat + cmdline + the
//     directory's owner per process) a `starting` manifest's recovery and
//     abandon use, on native and js;
//   - the field: the ps-list package (psList(), as a user calls it: it runs
//     `ps` twice and reads each process's exe link) and `pgrep -f -x`
//     (procps), spawned as a user would;
//   - C (bench/c/scan.c, no JavaScript): "cmdline" reads only
//     /proc/<pid>/cmdline, the floor for a scan by argv; "stat+cmdline+owner"
//     is the same work as native listProcesses (the uid hint is the
//     /proc/<pid> directory's owner), "stat+cmdline" that without it,
//     "stat+cmdline+status" reads the real uid from status as native once
//     did.
//
//   node bench/scan.js [--quick]            standalone: prints the table
//   import { run, report } from './scan.js'   for bench/run.js
//
// The idle processes are bench/c/idle.c, with a marker in their argv, started
// by a holder process (this file with --holder) so that the harness process
// keeps no children: the holder starts them, says so, and on EOF of its stdin
// (the harness ending it, or dying) kills and reaps every one. idle.c dies
// with its parent (PR_SET_PDEATHSIG), and the harness sweeps the marker after
// the holder as a safety net. Every variant must find every marked process.
//
// Each variant runs in its own process, one at a time (on a 2-CPU machine
// running them together would measure contention):
//   node bench/scan.js --worker <native|js|native-sweep|js-sweep|ps-list|pgrep> <rounds> <warmup> <idle argv...>
// prints one JSON line in the same shape as the C program's ("marked": how
// many processes have exactly the idle argv; "listed": the size of the
// table each round scanned).
import { spawn as cpSpawn, spawnSync } from 'node:child_process';
import { readdirSync } from 'node:fs';
import os from 'node:os';
import { fileURLToPath } from 'node:url';
import { buildC, formatRatio, formatTable, formatTargets, runAsScript, runJson, runWorker, summarize } from './lib.js';
import {
  childrenOf,
  cpuTicks,
  newMarker,
  noiseLine,
  otherCpuShare,
  processBudget,
  startHolder,
  sweepMarker,
} from './procs.js';

export const name = 'scan';

// ps-list / native sweep >= 7: a sweep should not cost what shelling out to ps costs.
const PSLIST_OVER_SWEEP_MIN = 7;
// native sweep / C cmdline-only loop <= 1.5: a sweep needs argv first, and
// everything else only for the few processes that match.
const SWEEP_OVER_C_CMDLINE_MAX = 1.5;
// native listProcesses / C (same work) <= 1.5: the addon may add JS object
// creation, not syscalls.
const NATIVE_OVER_C_MAX = 1.5;

// A scan of ~2 100 processes costs ~65 ms natively and ~110 ms through
// ps-list on an idle 2-CPU VM; starting an idle process from node ~1 ms
// (~3 ms when the machine is busy). Quick holds 1 000 idle processes and
// takes ~5 s in all (~10 s busy); full holds 2 000 (~15 s, ~30 s busy).
const PARAMS = {
  quick: { idle: 1000, rounds: 5, warmup: 1 },
  full: { idle: 2000, rounds: 15, warmup: 3 },
};

// idle's arguments before the marker: sleep an hour (it dies with its holder long before).
const IDLE_ARGS = ['3600'];

// Idle processes killed at a time at the end.
const KILL_BATCH = 50;

const VARIANTS = [
  { key: 'c-cmdline', kind: 'c', mode: 'cmdline', label: 'C: cmdline only (argv-first floor)' },
  { key: 'c-owner', kind: 'c', mode: 'stat-cmdline-owner', label: 'C: stat+cmdline+owner (listProcesses work)' },
  { key: 'c-status', kind: 'c', mode: 'stat-cmdline-status', label: 'C: stat+cmdline+status' },
  { key: 'c', kind: 'c', mode: 'stat-cmdline', label: 'C: stat+cmdline' },
  {
    key: 'native-sweep',
    kind: 'node',
    label: 'custody native sweep (dry run, no match)',
    env: { CUSTODY_BACKEND: 'native' },
  },
  { key: 'js-sweep', kind: 'node', label: 'custody js sweep (dry run, no match)', env: { CUSTODY_BACKEND: 'js' } },
  {
    key: 'native',
    kind: 'node',
    label: 'custody native listProcesses (full scan)',
    env: { CUSTODY_BACKEND: 'native' },
  },
  { key: 'js', kind: 'node', label: 'custody js listProcesses (full scan)', env: { CUSTODY_BACKEND: 'js' } },
  { key: 'ps-list', kind: 'node', label: 'ps-list 9 (psList())', env: {} },
  { key: 'pgrep', kind: 'node', label: 'pgrep -f -x (procps), spawned', env: {} },
];

/**
 * Starts the holder and its `count` idle processes. Resolves once all have
 * exec'd, with stop(): ends the holder (it kills and reaps them all) and
 * resolves with what it reported.
 */
async function startIdle(idleBin, marker, count) {
  const holder = startHolder(
    process.execPath,
    [fileURLToPath(import.meta.url), '--holder', idleBin, marker, String(count)],
    { what: 'idle holder' },
  );
  const stop = async () => {
    const { status, messages } = await holder.stop();
    if (status.code !== 0) throw new Error(`idle holder ended ${JSON.stringify(status)}`);
    const report = messages.find((m) => m.stopped !== undefined);
    if (!report) throw new Error('idle holder ended without reporting its idle processes reaped');
    return report;
  };
  let ready;
  try {
    // ~1-3 ms per idle process on a busy 2-CPU VM; generous.
    ready = await holder.next(30_000 + count * 20);
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
  const budget = processBudget(params.idle);
  if (budget.count < 1) throw new Error(`scan: no room for idle processes (${budget.limitedBy})`);
  const marker = newMarker('scan');
  // What every idle process's argv is; each variant counts the entries with
  // exactly this argv (the holder and the workers carry the marker too).
  const idleArgv = [idleBin, ...IDLE_ARGS, marker];
  const loadBefore = os.loadavg();
  const cpuBefore = cpuTicks();

  const raw = {};
  const skipped = {};
  let idle;
  let loadAfter;
  let holderReport = null;
  let escaped = 0;
  try {
    idle = await startIdle(idleBin, marker, budget.count);
    for (const v of VARIANTS) {
      const skip = v.key === 'pgrep' ? pgrepMissing() : null;
      if (skip) {
        skipped[v.key] = skip;
        continue;
      }
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

  // Every variant must have found every idle process by its exact argv.
  for (const v of VARIANTS) {
    if (raw[v.key] && raw[v.key].marked !== budget.count) {
      throw new Error(
        `scan: ${v.label} found ${raw[v.key].marked} of the ${budget.count} idle processes by their argv`,
      );
    }
  }
  if (holderReport.reaped !== budget.count || holderReport.odd !== 0 || holderReport.leftover !== 0) {
    throw new Error(
      `scan: the holder reaped ${holderReport.reaped} of ${budget.count} idle processes: ${JSON.stringify(holderReport)}`,
    );
  }

  const variants = {};
  for (const v of VARIANTS) {
    if (!raw[v.key]) {
      variants[v.key] = { label: v.label, skipped: skipped[v.key] };
      continue;
    }
    const { rounds_ms: roundsMs, listed_rounds: listedRounds, match_all_ms: matchAllMs } = raw[v.key];
    variants[v.key] = {
      label: v.label,
      ...summarize(roundsMs),
      listed: summarize(listedRounds),
      usPerProcess: summarize(roundsMs.map((x, i) => (x * 1000) / listedRounds[i])),
      ...(matchAllMs ? { matchAllMs: summarize(matchAllMs) } : {}),
    };
  }
  // Ratios compare the cost per listed process (median over rounds): the
  // table is the whole machine's, and other work may start or end processes
  // between and during variants. With a steady table this is the ratio of
  // ms per scan.
  const ms = (key) => variants[key].usPerProcess?.median ?? NaN;
  const psListOverSweep = ms('ps-list') / ms('native-sweep');
  const sweepOverCCmdline = ms('native-sweep') / ms('c-cmdline');
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
      unit: 'ms per scan of /proc (every process), median of rounds',
    },
    variants,
    ratios: {
      psListOverSweep,
      sweepOverCCmdline,
      pgrepOverSweep: ms('pgrep') / ms('native-sweep'),
      jsSweepOverSweep: ms('js-sweep') / ms('native-sweep'),
      sweepOverListProcesses: ms('native-sweep') / ms('native'),
      psListOverNative: ms('ps-list') / ms('native'),
      nativeOverC,
      nativeOverCNoStatus: ms('native') / ms('c'),
      jsOverNative: ms('js') / ms('native'),
      statusShareOfC: 1 - ms('c') / ms('c-status'),
      cmdlineShareOfC: ms('c-cmdline') / ms('c-owner'),
    },
    targets: [
      {
        id: 'psListOverSweep',
        description: `native sweep at least ${PSLIST_OVER_SWEEP_MIN}x faster than ps-list`,
        value: psListOverSweep,
        op: '>=',
        limit: PSLIST_OVER_SWEEP_MIN,
        met: psListOverSweep >= PSLIST_OVER_SWEEP_MIN,
      },
      {
        id: 'sweepOverCCmdline',
        description: `native sweep within ${SWEEP_OVER_C_CMDLINE_MAX}x of C: cmdline only`,
        value: sweepOverCCmdline,
        op: '<=',
        limit: SWEEP_OVER_C_CMDLINE_MAX,
        met: sweepOverCCmdline <= SWEEP_OVER_C_CMDLINE_MAX,
      },
      {
        id: 'nativeOverC',
        description: `native listProcesses within ${NATIVE_OVER_C_MAX}x of C: stat+cmdline+owner`,
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

/** Why pgrep cannot be measured here, or null. */
function pgrepMissing() {
  const r = spawnSync('pgrep', ['-V'], { encoding: 'utf8' });
  if (r.error) return `pgrep not found (${r.error.code}; Debian package procps)`;
  return r.status === 0 ? null : `pgrep -V exited ${r.status}`;
}

function fmtMs(x) {
  return Number.isFinite(x) ? (x >= 100 ? x.toFixed(0) : x.toFixed(1)) : 'n/a';
}

/** The results as a printable table. */
export function report(results) {
  const { params, variants, ratios, targets, quick, leftoverProcesses, loadavg, otherCpu } = results;
  const n = (x) => x.toLocaleString('en-US');
  const cs = variants['c-cmdline'].usPerProcess.median;
  const rows = [];
  const notes = [];
  for (const { key } of VARIANTS) {
    const v = variants[key];
    if (v.skipped) {
      rows.push([v.label, 'skipped', '', '', '', '', '']);
      notes.push(`  ${v.label}: skipped, ${v.skipped}`);
      continue;
    }
    const listed =
      v.listed.min === v.listed.max
        ? n(v.listed.median)
        : `${n(v.listed.median)} (${n(v.listed.min)}-${n(v.listed.max)})`;
    rows.push([
      v.label,
      fmtMs(v.median),
      fmtMs(v.min),
      fmtMs(v.max),
      listed,
      v.usPerProcess.median.toFixed(1),
      formatRatio(v.usPerProcess.median / cs),
    ]);
  }
  const matchAll = ['native-sweep', 'js-sweep']
    .filter((k) => variants[k].matchAllMs)
    .map((k) => `${k.replace('-sweep', '')} ${fmtMs(variants[k].matchAllMs.median)} ms`);
  const lines = [
    `scan: the process-table scans of a sweep and of a recovery, ${n(params.idle)} idle processes alive (${params.idleProgram});` +
      ` ${params.rounds} rounds after ${params.warmup} warm-up; ms per scan${quick ? ' (quick)' : ''}`,
    quick ? `  quick holds ${n(params.idle)} idle processes, not the full run's ${n(PARAMS.full.idle)}` : null,
    params.idleLimitedBy
      ? `  idle processes limited to ${n(params.idle)} of ${n(params.idleWanted)} by ${params.idleLimitedBy}`
      : null,
    `  "listed": processes per scan, median (the machine's whole table, not only the idle ones);` +
      ` ratios compare us per listed process, median of rounds`,
    formatTable(['variant', 'median', 'min', 'max', 'listed', 'us/process', 'vs C cmdline'], rows),
    ...notes,
    '',
    `  sweep: ps-list / native ${formatRatio(ratios.psListOverSweep)}, pgrep / native ${formatRatio(ratios.pgrepOverSweep)},` +
      ` js / native ${formatRatio(ratios.jsSweepOverSweep)}, native sweep / native listProcesses ${formatRatio(ratios.sweepOverListProcesses)}`,
    `  the same sweep with the idle argv (dry run; every one of the ${n(params.idle)} matched, pinned and re-read): ${matchAll.join(', ')}`,
    `  listProcesses: ps-list / native ${formatRatio(ratios.psListOverNative)}; js / native ${formatRatio(ratios.jsOverNative)};` +
      ` native / C stat+cmdline+owner ${formatRatio(ratios.nativeOverC)}; native / C stat+cmdline ${formatRatio(ratios.nativeOverCNoStatus)}`,
    `  C: cmdline only / stat+cmdline+owner ${formatRatio(ratios.cmdlineShareOfC)}; status read share of stat+cmdline+status ${(ratios.statusShareOfC * 100).toFixed(0)}%;` +
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

/** pgrep's pattern for an exact argv: -f matches the command line joined by spaces, -x the whole of it. */
function pgrepPattern(argv) {
  return argv.join(' ').replace(/[.*+?^${}()|[\]\\]/g, '\\$&');
}

/**
 * The variant's timed scan and its check. scan() resolves with the number of
 * processes it listed, or null when it does not list them (a sweep, pgrep:
 * the caller counts /proc instead). marked() counts the processes with
 * exactly the idle argv, with `ms` where that is a timed call of its own.
 */
async function makeScan(variant, idleArgv) {
  // Same program and length as the idle argv, carried by no process.
  const noMatch = [...idleArgv.slice(0, -1), `${idleArgv.at(-1)}-none`];
  if (variant === 'native' || variant === 'js') {
    // Imported only here, after the parent set CUSTODY_BACKEND: the backend
    // module recovery uses, and its listProcesses() as recovery calls it.
    const { backend, capabilities } = await import('../dist/backend/index.js');
    const caps = capabilities();
    if (caps.backend !== variant)
      throw new Error(`asked for the ${variant} backend, custody loaded ${caps.backend}: ${caps.reason}`);
    let list = [];
    return {
      scan: async () => (list = await backend.listProcesses()).length,
      marked: async () => ({
        count: list.filter((p) => p.argv.length === idleArgv.length && p.argv.every((a, i) => a === idleArgv[i]))
          .length,
      }),
    };
  }
  if (variant === 'native-sweep' || variant === 'js-sweep') {
    const backendName = variant.slice(0, -'-sweep'.length);
    const { capabilities, sweep } = await import('../dist/index.js');
    const caps = capabilities();
    if (caps.backend !== backendName)
      throw new Error(`asked for the ${backendName} backend, custody loaded ${caps.backend}: ${caps.reason}`);
    return {
      scan: async () => {
        const r = await sweep({ argv: noMatch, dryRun: true });
        if (r.matched.length !== 0)
          throw new Error(`a sweep for ${JSON.stringify(noMatch)} matched ${r.matched.length} processes`);
        return null;
      },
      marked: async () => {
        const t0 = performance.now();
        const r = await sweep({ argv: idleArgv, dryRun: true });
        return { count: r.matched.length, ms: performance.now() - t0 };
      },
    };
  }
  if (variant === 'ps-list') {
    const { default: psList } = await import('ps-list');
    let list = [];
    return {
      scan: async () => (list = await psList()).length,
      // ps-list gives the command line as one string, elements joined by spaces.
      marked: async () => ({ count: list.filter((p) => p.cmd === idleArgv.join(' ')).length }),
    };
  }
  if (variant === 'pgrep') {
    // One pid per line; exit 1 means nothing matched.
    const pgrep = (argv) => {
      const r = spawnSync('pgrep', ['-f', '-x', pgrepPattern(argv)], { encoding: 'utf8', maxBuffer: 16 << 20 });
      if (r.error || (r.status !== 0 && r.status !== 1))
        throw new Error(`pgrep failed: ${r.error?.message ?? `exit ${r.status}: ${r.stderr}`}`);
      return r.stdout.split('\n').filter((l) => l !== '').length;
    };
    return {
      scan: async () => {
        const found = pgrep(noMatch);
        if (found !== 0) throw new Error(`pgrep for ${JSON.stringify(noMatch)} matched ${found} processes`);
        return null;
      },
      marked: async () => {
        const t0 = performance.now();
        const count = pgrep(idleArgv);
        return { count, ms: performance.now() - t0 };
      },
    };
  }
  throw new Error(`unknown variant ${variant}`);
}

/** How many processes /proc lists now. */
function procCount() {
  return readdirSync('/proc').filter((e) => e.charCodeAt(0) >= 49 && e.charCodeAt(0) <= 57).length;
}

async function worker([variant, roundsArg, warmupArg, ...idleArgv]) {
  const [rounds, warmup] = [roundsArg, warmupArg].map(Number);
  const { scan, marked } = await makeScan(variant, idleArgv);
  for (let i = 0; i < warmup; i++) await scan();
  const roundsMs = [];
  const listedRounds = [];
  for (let r = 0; r < rounds; r++) {
    // Each round from a collected heap, so no round pays for another's garbage.
    globalThis.gc?.();
    const before = procCount();
    const t0 = performance.now();
    const listed = await scan();
    roundsMs.push(performance.now() - t0);
    // Not listed by the variant: the table's size around the scan.
    listedRounds.push(listed ?? Math.round((before + procCount()) / 2));
  }
  // The check, after the timed rounds; where it is a call of its own
  // (a sweep that matches, pgrep) it is timed too, a few times.
  const matchAllMs = [];
  let found;
  for (let r = 0; r < Math.min(rounds, 3); r++) {
    globalThis.gc?.();
    found = await marked();
    if (found.ms === undefined) break;
    matchAllMs.push(found.ms);
  }
  process.stdout.write(
    `${JSON.stringify({
      variant,
      ms_per_scan: summarize(roundsMs).median,
      rounds_ms: roundsMs,
      listed_rounds: listedRounds,
      listed: listedRounds.at(-1),
      marked: found.count,
      ...(matchAllMs.length ? { match_all_ms: matchAllMs } : {}),
    })}\n`,
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
    for (const c of children.slice(i, i + KILL_BATCH))
      if (c.exitCode === null && c.signalCode === null) c.kill('SIGKILL');
    st.push(...(await Promise.all(ended.slice(i, i + KILL_BATCH))));
  }
  const stopMs = performance.now() - t1;
  const odd = st.filter((s) => s.signal !== 'SIGKILL').length;
  process.stdout.write(
    `${JSON.stringify({ stopped: children.length, reaped: st.length, odd, stopMs, leftover: childrenOf(process.pid).length })}\n`,
  );
  process.exit(0);
}

await runAsScript(import.meta.url, { run, report, worker, holder });
