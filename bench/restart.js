// restart: what LaunchSpec.restart costs. Two measures, side by side, on
// custody native and js:
//
//   1. Restart latency: the time from an instance's exit to its replacement
//      confirmed and running, against delayMs plus a fresh launch() of the
//      same program (target: within 1.25x of that sum). The instance is
//      bench/c/idle.c with restart { when: 'always', delayMs: D, limit:
//      { count: 1000, withinMs: 60000 } }; each round SIGKILLs its current
//      pid (the Instance launch() returned is a live view: inst.pid follows
//      the current run) and waits for the replacement's `running` event.
//      Every event is stamped as it reaches the onEvent sink (events are
//      emitted synchronously: performance.now(), finer than the event's
//      millisecond `time`), so the restart splits into phases:
//        exit -> restart     every process proven gone, paths removed, the
//                            backoff manifest written and fsync'd
//        restart -> launch   the delay D, then the starting manifest written
//        launch -> running   spawn, confirm, the running manifest written
//      Interleaved with the restarts, a fresh launch() of the same spec
//      under another id (call to resolved), stopped after: the baseline.
//   2. The agent's CPU while a program crash-loops until the limit:
//      `/bin/sh -c 'sleep 0.1; exit 3' <token>` (it crashes once running:
//      the restart path; one that dies before custody confirms it is
//      abandoned instead, and an abandon without a cgroup scans the host's
//      process table for its token, which does grow with every process on
//      the host) with restart { when: 'on-failure',
//      delayMs: 20, limit: { count: 20, withinMs: 60000 } }, from launch()
//      to the `gave-up` event, process.cpuUsage() (user + sys of the worker,
//      its children not counted) over the loop, per restart; measured while
//      holding H healthy idle instances (none, then many), which must not
//      make each restart cost more. Beside it, the CPU the held instances
//      cost with nothing crashing (the same worker, idle for a while), so a
//      per-instance cost of their own is told apart from one of restarting.
//
//   node bench/restart.js [--quick]          standalone: prints the tables
//   import { run, report } from './restart.js'   for bench/run.js
//
// Each backend runs in its own worker (custody picks its backend when it
// loads) under a raised fd limit, its state dir on a disk (every manifest is
// fsync'd), the idle processes marked so a sweep finds any that escaped:
//   node bench/restart.js --worker <native|js> <state base> <idle bin> <marker> <params json>
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { buildC, formatRatio, formatTable, formatTargets, median, runAsScript } from './lib.js';
import {
  childrenOf,
  cpuTicks,
  diskBase,
  fsType,
  newMarker,
  noiseLine,
  otherCpuShare,
  runWorkerNofile,
  sweepMarker,
} from './procs.js';

export const name = 'restart';

// The replacement running within 1.25x of delayMs + a fresh launch.
const LATENCY_MAX = 1.25;
// CPU per restart at the largest H within 1.5x of that at H = 0: "must not grow", with room for noise.
const CPU_GROWTH_MAX = 1.5;
const GRACE_MS = 2000;
const IDLE_SECONDS = '3600';
const LAUNCH_LANES = 32;
// Every wait is bounded: an event that never comes fails the point, it does not hang the run.
const EVENT_TIMEOUT_MS = 10_000;
// Attempts of the crash loop's first launch() (each fails where sh exits before it is confirmed).
const FIRST_ATTEMPTS = 10;

const PARAMS = {
  quick: {
    rounds: 10,
    warmup: 2,
    delayMs: 50,
    held: [0, 50],
    cpuRounds: 1,
    crash: { delayMs: 20, count: 20 },
    idleMs: 500,
    settleMs: 500,
    timeoutMs: 60_000,
  },
  full: {
    rounds: 50,
    warmup: 3,
    delayMs: 50,
    held: [0, 200],
    cpuRounds: 3,
    crash: { delayMs: 20, count: 20 },
    idleMs: 2000,
    settleMs: 1000,
    timeoutMs: 300_000,
  },
};

const BACKENDS = [
  { key: 'native', label: 'custody native' },
  { key: 'js', label: 'custody js' },
];

/** Measures both backends and returns the results. */
export async function run({ quick = false } = {}) {
  const params = PARAMS[quick ? 'quick' : 'full'];
  const idleBin = buildC('idle');
  const self = fileURLToPath(import.meta.url);
  const base = mkdtempSync(join(diskBase(), 'custody-bench-restart-'));
  const fs = fsType(base);
  const loadBefore = os.loadavg();
  const cpuBefore = cpuTicks();
  const backends = {};
  let escaped = 0;
  try {
    for (const b of BACKENDS) {
      const dir = mkdtempSync(join(base, `${b.key}-`));
      const marker = newMarker('restart');
      try {
        backends[b.key] = await runWorkerNofile(self, [b.key, dir, idleBin, marker, JSON.stringify(params)], {
          env: { CUSTODY_BACKEND: b.key },
          timeoutMs: params.timeoutMs,
        });
      } catch (err) {
        backends[b.key] = {
          failedRun: String(err?.message ?? err)
            .split('\n')
            .slice(0, 4)
            .join(' ')
            .slice(0, 400),
        };
      } finally {
        escaped += sweepMarker(marker);
        rmSync(dir, { recursive: true, force: true });
      }
    }
  } finally {
    rmSync(base, { recursive: true, force: true });
  }
  const leftover = childrenOf(process.pid).length;
  return summarizeRun({ quick, params, fs, backends, escaped, leftover, loadBefore, cpuBefore });
}

function summarizeRun({ quick, params, fs, backends, escaped, leftover, loadBefore, cpuBefore }) {
  const targets = [];
  const hMax = Math.max(...params.held);
  for (const b of BACKENDS) {
    const r = backends[b.key];
    const lat = {
      id: `latency.${b.key}`,
      description: `${b.key}: end (SIGKILL) to replacement running / (delayMs + fresh launch), median`,
      op: '<=',
      limit: LATENCY_MAX,
    };
    if (r && !r.failedRun && Number.isFinite(r.latency?.ratio)) {
      targets.push({ ...lat, value: r.latency.ratio, met: r.latency.ratio <= LATENCY_MAX });
    } else {
      targets.push({ ...lat, skipped: r?.failedRun ? 'the run failed (above)' : 'not measured' });
    }
    const cpu = {
      id: `cpu.${b.key}`,
      description: `${b.key}: net CPU ms per crash-loop restart holding ${hMax} / holding 0`,
      op: '<=',
      limit: CPU_GROWTH_MAX,
    };
    const ratio = r?.crash?.growth;
    if (r && !r.failedRun && Number.isFinite(ratio)) {
      targets.push({ ...cpu, value: ratio, met: ratio <= CPU_GROWTH_MAX });
    } else {
      targets.push({ ...cpu, skipped: r?.failedRun ? 'the run failed (above)' : 'not measured' });
    }
  }
  const round2 = (xs) => xs.map((x) => Math.round(x * 100) / 100);
  return {
    name,
    quick,
    params: {
      ...params,
      stateDir: { fs: fs.name },
      graceMs: GRACE_MS,
      latencyProcess: `bench/c/idle.c ${IDLE_SECONDS} <marker> <token>, SIGKILLed by pid`,
      crashProcess: "/bin/sh -c 'sleep 0.1; exit 3' <token>",
    },
    backends,
    targets,
    escapedProcesses: escaped,
    leftoverProcesses: leftover,
    loadavg: { before: round2(loadBefore), after: round2(os.loadavg()) },
    otherCpu: otherCpuShare(cpuBefore, cpuTicks(), os.cpus().length),
  };
}

const fmtMs = (x) => (Number.isFinite(x) ? x.toFixed(x < 10 ? 2 : 1) : 'n/a');
const int = (x) => (Number.isFinite(x) ? Math.round(x).toLocaleString('en-US') : 'n/a');

/** The results as printable tables. */
export function report(results) {
  const { params, backends, targets, quick, escapedProcesses, leftoverProcesses, loadavg, otherCpu } = results;
  const latRows = [];
  const phaseRows = [];
  const cpuRows = [];
  const failures = [];
  const oddities = [];
  for (const b of BACKENDS) {
    const r = backends[b.key];
    if (!r || r.failedRun) {
      failures.push(`  ${b.label}: FAILED ${r?.failedRun ?? 'not run'}`);
      continue;
    }
    const l = r.latency;
    latRows.push([
      b.label,
      int(l.delayMs),
      `${l.samples}/${params.rounds}`,
      fmtMs(l.killToRunning.median),
      fmtMs(l.killToRunning.p90),
      fmtMs(l.killToRunning.max),
      fmtMs(l.killToConfirm.median),
      fmtMs(l.exitToRunning.median),
      fmtMs(l.exitToRunning.p90),
      fmtMs(l.fresh.median),
      fmtMs(l.fresh.p90),
      fmtMs(l.delayMs + l.fresh.median),
      formatRatio(l.ratio),
      formatRatio(l.ratioFromExitEvent),
    ]);
    phaseRows.push([
      b.label,
      fmtMs(l.phases.killToExit),
      fmtMs(l.phases.plainKillToExit),
      fmtMs(l.phases.exitToRestart),
      fmtMs(l.phases.restartToLaunch),
      fmtMs(l.phases.restartToLaunch - l.delayMs),
      fmtMs(l.phases.launchToSpawn),
      fmtMs(l.phases.spawnToConfirm),
      fmtMs(l.phases.confirmToRunning),
      fmtMs(l.freshPhases.callToLaunch),
      fmtMs(l.freshPhases.launchToRunning),
      fmtMs(l.freshPhases.runningToResolved),
    ]);
    for (const p of r.crash.points) {
      cpuRows.push([
        b.label,
        int(p.held),
        p.failed ? 'FAILED' : int(p.restarts),
        p.failed ? '' : `${int(p.exits)} / ${int(p.failedLaunches)}`,
        fmtMs(p.wallMs),
        fmtMs(p.cpuMs),
        fmtMs(p.cpuPerRestart),
        fmtMs(p.wallPerRestart),
        fmtMs(p.idleCpuMsPerS),
        fmtMs(p.netCpuPerRestart),
        p.held === 0
          ? ''
          : formatRatio(p.netCpuPerRestart / r.crash.points.find((x) => x.held === 0)?.netCpuPerRestart),
        p.held === 0 ? '' : formatRatio(p.cpuPerRestart / r.crash.points.find((x) => x.held === 0)?.cpuPerRestart),
      ]);
    }
    for (const o of r.oddities ?? []) oddities.push(`  ${b.key}: ${o}`);
  }
  const hMax = Math.max(...params.held);
  return [
    `restart: LaunchSpec.restart on bench/c/idle.c (SIGKILLed) and /bin/sh -c 'sleep 0.1; exit 3'; state on ${params.stateDir.fs}` +
      `${quick ? ' (quick)' : ''}`,
    `  latency: restart { when: 'always', delayMs: ${params.delayMs} } after a SIGKILL, ${params.rounds} rounds after ${params.warmup}` +
      ` warm-up, each followed by a fresh launch() + stop() of the same spec; ms, from the kill and custody's events as they`,
    `  reach the sink. ratio: kill->running / (D + fresh launch); from exit ev: the same from the exit event's arrival`,
    ...failures,
    latRows.length
      ? formatTable(
          [
            'variant',
            'D',
            'rounds',
            'kill->running',
            'p90',
            'max',
            'kill->confirm',
            'exit ev->running',
            'p90',
            'fresh launch',
            'p90',
            'D + fresh',
            'ratio',
            'from exit ev',
          ],
          latRows,
          { align: 'lrrrrrrrrrrrrr' },
        )
      : null,
    '',
    `  where a restart's time goes (medians, ms): kill->exit: the exit seen, then (with a policy) the cleanup and the`,
    `  fsync'd backoff manifest, which come before the exit event; no policy: the same SIGKILL of an instance without one;`,
    `  exit->restart: what is left of the cleanup; restart->launch: the delay, then the starting manifest (over D: beyond`,
    `  the delay); launch->spawn->confirm->running as in a launch. fresh: call->launch event, launch->running, running->resolved.`,
    phaseRows.length
      ? formatTable(
          [
            'variant',
            'kill->exit',
            'no policy',
            'exit->restart',
            'restart->launch',
            'over D',
            'launch->spawn',
            'spawn->confirm',
            'confirm->running',
            'fresh call->launch',
            'launch->running',
            'running->resolved',
          ],
          phaseRows,
          { align: 'lrrrrrrrrrrr' },
        )
      : null,
    '',
    `  CPU of the agent while /bin/sh -c 'sleep 0.1; exit 3' crash-loops until gave-up (on-failure, delayMs ${params.crash.delayMs},` +
      ` limit ${params.crash.count}), holding H healthy idle instances; process.cpuUsage() user+sys of the worker,` +
      ` median of ${params.cpuRounds} round(s); idle: the worker's CPU holding H with nothing crashing`,
    cpuRows.length
      ? formatTable(
          [
            'variant',
            'H',
            'restarts',
            'exits / failed launches',
            'wall ms',
            'CPU ms',
            'CPU ms/restart',
            'wall ms/restart',
            'idle CPU ms/s',
            'net ms/restart',
            'net vs H=0',
            'raw vs H=0',
          ],
          cpuRows,
          { align: 'lrrrrrrrrrrr' },
        )
      : null,
    `  (a failed launch: sh exited before custody confirmed it; a restart's failed launch counts as an end, as an exit does;`,
    `  net: CPU less idle CPU ms/s x wall, per restart: the restarts' own cost, which is what must not grow with H)`,
    '',
    formatTargets(targets, {
      quick,
      quickNote: `quick holds ${hMax} and runs ${params.rounds} rounds`,
    }),
    `  (CPU target: "must not grow with H"; ${formatRatio(CPU_GROWTH_MAX)} is this bench's room for noise)`,
    oddities.length ? '  noticed:' : null,
    ...oddities,
    escapedProcesses > 0
      ? `  ${escapedProcesses} idle processes outlived their run and were killed by the sweep`
      : null,
    `  leftover processes and state after the run: ${leftoverProcesses + sumLeft(backends)}`,
    noiseLine(otherCpu, loadavg),
  ]
    .filter((l) => l !== null)
    .join('\n');
}

function sumLeft(backends) {
  return Object.values(backends).reduce(
    (s, r) => s + (r.failedRun ? 0 : (r.leftoverChildren ?? 0) + (r.leftoverState ?? 0)),
    0,
  );
}

// ---- statistics ----

/** The q-quantile (0..1) by nearest rank. */
function quantile(xs, q) {
  if (xs.length === 0) return NaN;
  const s = [...xs].sort((a, b) => a - b);
  return s[Math.min(s.length - 1, Math.max(0, Math.ceil(q * s.length) - 1))];
}

function stats(xs) {
  return {
    median: median(xs),
    p90: quantile(xs, 0.9),
    min: xs.length ? Math.min(...xs) : NaN,
    max: xs.length ? Math.max(...xs) : NaN,
  };
}

// ---- worker side ----

/**
 * The onEvent sink: stamps every event as it arrives and wakes whoever waits
 * for one. waitFor(pred, what) resolves with { e, at } for the first event
 * from now on matching pred, and rejects after EVENT_TIMEOUT_MS.
 */
function eventSink() {
  const waiters = new Set();
  const counts = {};
  const warnings = [];
  const taps = new Set();
  const onEvent = (e) => {
    const at = performance.now();
    counts[e.type] = (counts[e.type] ?? 0) + 1;
    if (e.type === 'warning' && warnings.length < 10) warnings.push(String(e.message).slice(0, 200));
    for (const w of waiters) {
      if (w.pred(e)) {
        waiters.delete(w);
        w.resolve({ e, at });
      }
    }
    for (const tap of taps) tap(e, at);
  };
  const waitFor = (pred, what) => {
    let w;
    let timer;
    const p = new Promise((resolve, reject) => {
      w = { pred, resolve };
      timer = setTimeout(() => {
        waiters.delete(w);
        reject(new Error(`no ${what} within ${EVENT_TIMEOUT_MS} ms`));
      }, EVENT_TIMEOUT_MS);
    });
    waiters.add(w);
    return p.finally(() => clearTimeout(timer));
  };
  return { onEvent, waitFor, taps, counts, warnings };
}

/** Launches n idle instances, LAUNCH_LANES at a time; returns their ids. */
async function launchHeld(supervisor, n, idleBin, marker, tag) {
  const ids = [];
  let next = 0;
  const lane = async () => {
    while (next < n) {
      const id = `held-${tag}-${next++}`;
      await supervisor.launch({
        id,
        command: idleBin,
        args: (token) => [IDLE_SECONDS, marker, token],
        // Healthy instances with a policy too, as an agent's would have: they never end, so it never acts.
        restart: { when: 'on-failure' },
      });
      ids.push(id);
    }
  };
  await Promise.all(Array.from({ length: Math.min(LAUNCH_LANES, n) }, lane));
  return ids;
}

async function stopAll(supervisor, ids) {
  const settled = await Promise.allSettled(ids.map((id) => supervisor.stop(id, { graceMs: GRACE_MS })));
  return settled.filter((s) => s.status === 'rejected').length;
}

const cpuMs = (u) => (u.user + u.system) / 1000;

/** Part 1: restart latency against delayMs + a fresh launch, interleaved. */
async function measureLatency(supervisor, sink, { idleBin, marker, rounds, warmup, delayMs }, oddities) {
  const spec = (id) => ({
    id,
    command: idleBin,
    args: (token) => [IDLE_SECONDS, marker, token],
    restart: { when: 'always', delayMs, limit: { count: 1000, withinMs: 60_000 } },
  });
  const inst = await supervisor.launch(spec('lat'));
  const samples = [];
  const fresh = [];
  const freshPhases = [];
  const plainExit = [];
  let pidNotFollowed = 0;
  let failedRounds = 0;
  try {
    for (let i = 0; i < warmup + rounds; i++) {
      const timed = i >= warmup;
      // -- a restart --
      const oldPid = inst.pid;
      const marks = {};
      const tap = (e, at) => {
        if (e.id === 'lat' && marks[e.type] === undefined) marks[e.type] = at;
      };
      sink.taps.add(tap);
      try {
        const next = sink.waitFor(
          (e) => e.id === 'lat' && (e.type === 'gave-up' || (e.type === 'running' && e.pid !== oldPid)),
          `running of lat's replacement (round ${i})`,
        );
        marks.kill = performance.now();
        process.kill(oldPid, 'SIGKILL');
        const first = await next;
        if (first.e.type === 'gave-up') throw new Error(`lat gave up after ${first.e.restarts} restarts`);
        // The live view: launch() resolved with it once; it should now show the new run.
        await new Promise((r) => setImmediate(r));
        if (inst.pid === oldPid || inst.pid !== first.e.pid) pidNotFollowed++;
        const missing = ['exit', 'restart', 'launch', 'spawn', 'confirm', 'running'].filter(
          (k) => marks[k] === undefined,
        );
        if (missing.length) oddities.add(`round ${i}: no ${missing.join(', ')} event before the replacement ran`);
        if (timed && !missing.length) samples.push({ ...marks });
      } catch (err) {
        failedRounds++;
        oddities.add(String(err.message).slice(0, 200));
        if (failedRounds > 2) throw err;
      } finally {
        sink.taps.delete(tap);
      }
      // -- a fresh launch of the same spec --
      const id = `fresh-${i}`;
      const fm = {};
      const ftap = (e, at) => {
        if (e.id === id && fm[e.type] === undefined) fm[e.type] = at;
      };
      sink.taps.add(ftap);
      try {
        fm.call = performance.now();
        await supervisor.launch(spec(id));
        fm.resolved = performance.now();
      } finally {
        sink.taps.delete(ftap);
      }
      const r = await supervisor.stop(id, { graceMs: GRACE_MS });
      if (r.outcome !== 'exited' || r.escalated) oddities.add(`stop of ${id} gave ${JSON.stringify(r)}`);
      if (timed) {
        fresh.push(fm.resolved - fm.call);
        freshPhases.push(fm);
      }
      // -- the same SIGKILL of an instance without a policy: how long custody takes to report an exit --
      const pid = `plain-${i}`;
      const plain = await supervisor.launch({ ...spec(pid), restart: undefined });
      const exit = sink.waitFor((e) => e.id === pid && e.type === 'exit', `exit of ${pid}`);
      const tk = performance.now();
      process.kill(plain.pid, 'SIGKILL');
      try {
        const { at } = await exit;
        if (timed) plainExit.push(at - tk);
      } catch (err) {
        oddities.add(String(err.message));
        await supervisor.stop(pid, { graceMs: GRACE_MS }).catch(() => {});
      }
      // An instance without a policy stays listed as exited until remove(); its cleanup (state removed)
      // given a moment to finish before the next round is timed.
      await new Promise((r) => setTimeout(r, 20));
      await supervisor.remove(pid).catch((err) => oddities.add(`remove of ${pid}: ${err.message}`));
    }
  } finally {
    await supervisor.stop('lat', { graceMs: GRACE_MS }).catch((err) => oddities.add(`stop of lat: ${err.message}`));
  }
  if (pidNotFollowed) oddities.add(`Instance.pid did not follow the replacement in ${pidNotFollowed} round(s)`);
  if (inst.restarts !== warmup + rounds)
    oddities.add(`Instance.restarts is ${inst.restarts} after ${warmup + rounds} restarts`);
  const gap = (from, to) => samples.map((s) => s[to] - s[from]);
  const fgap = (from, to) => median(freshPhases.map((s) => s[to] - s[from]));
  const exitToRunning = stats(gap('exit', 'running'));
  const killToRunning = stats(gap('kill', 'running'));
  const freshStats = stats(fresh);
  return {
    delayMs,
    samples: samples.length,
    exitToRunning,
    exitToConfirm: stats(gap('exit', 'confirm')),
    killToRunning,
    killToConfirm: stats(gap('kill', 'confirm')),
    fresh: freshStats,
    // From the process's end (SIGKILL ends it at once): what an operator waits. The exit event comes only
    // once the cleanup and the backoff manifest are done (see the phases), so from it is shown beside.
    ratio: killToRunning.median / (delayMs + freshStats.median),
    ratioFromExitEvent: exitToRunning.median / (delayMs + freshStats.median),
    plainKillToExit: median(plainExit),
    phases: {
      killToExit: median(gap('kill', 'exit')),
      plainKillToExit: median(plainExit),
      exitToRestart: median(gap('exit', 'restart')),
      restartToLaunch: median(gap('restart', 'launch')),
      launchToSpawn: median(gap('launch', 'spawn')),
      spawnToConfirm: median(gap('spawn', 'confirm')),
      confirmToRunning: median(gap('confirm', 'running')),
    },
    freshPhases: {
      callToLaunch: fgap('call', 'launch'),
      launchToRunning: fgap('launch', 'running'),
      runningToResolved: fgap('running', 'resolved'),
    },
    rawKillToRunning: gap('kill', 'running').map((x) => Math.round(x * 100) / 100),
    rawExitToRunning: gap('exit', 'running').map((x) => Math.round(x * 100) / 100),
    rawFresh: fresh.map((x) => Math.round(x * 100) / 100),
  };
}

/** One crash loop, launch() to gave-up: CPU and wall time of the worker. */
async function crashLoop(supervisor, sink, { delayMs, count }, id) {
  let restarts = 0;
  let exits = 0;
  let abandons = 0;
  let retries = 0;
  const tap = (e) => {
    if (e.id !== id) return;
    if (e.type === 'restart') restarts++;
    if (e.type === 'exit') exits++;
    if (e.type === 'abandon') abandons++;
    if (e.type === 'retry') retries++;
  };
  sink.taps.add(tap);
  try {
    globalThis.gc?.();
    const gaveUp = sink.waitFor((e) => e.id === id && e.type === 'gave-up', `gave-up of ${id}`);
    gaveUp.catch(() => {});
    const cpu0 = process.cpuUsage();
    const t0 = performance.now();
    await supervisor.launch({
      id,
      command: '/bin/sh',
      args: (token) => ['-c', 'sleep 0.1; exit 3', token],
      restart: { when: 'on-failure', delayMs, limit: { count, withinMs: 60_000 } },
      // sh may exit before it is confirmed: launch() then fails that attempt (no restart policy acts on
      // launch() itself), so the first launch gets a few; a restart's failed launch is an end like an exit.
      attempts: FIRST_ATTEMPTS,
    });
    const { e } = await gaveUp;
    const wallMs = performance.now() - t0;
    const cpu = cpuMs(process.cpuUsage(cpu0));
    // Failed attempts of launch() itself each give an abandon and (but the last) a retry.
    const firstFailed = retries;
    return {
      restarts,
      exits,
      failedLaunches: abandons - firstFailed,
      firstFailed,
      reportedRestarts: e.restarts,
      wallMs,
      cpuMs: cpu,
    };
  } finally {
    sink.taps.delete(tap);
    // Failed (or, after a timeout, backoff): stop() cancels what is pending and removes its state.
    await supervisor.stop(id, { graceMs: GRACE_MS }).catch(() => {});
  }
}

/** The worker's CPU over `ms` with nothing to do but hold what it holds: ms of CPU per second. */
async function idleCpu(ms) {
  globalThis.gc?.();
  const cpu0 = process.cpuUsage();
  const t0 = performance.now();
  await new Promise((r) => setTimeout(r, ms));
  return cpuMs(process.cpuUsage(cpu0)) / ((performance.now() - t0) / 1000);
}

/** Part 2: CPU per crash-loop restart, holding each H in turn, rounds interleaved. */
async function measureCrash(supervisor, sink, { idleBin, marker, held, cpuRounds, crash, idleMs, settleMs }, oddities) {
  // Warm-up: the crash path's code compiled before anything is timed.
  await crashLoop(supervisor, sink, { delayMs: crash.delayMs, count: 5 }, 'crash-warmup').catch((err) =>
    oddities.add(`warm-up crash loop: ${err.message}`),
  );
  const raw = Object.fromEntries(held.map((h) => [h, []]));
  const idle = Object.fromEntries(held.map((h) => [h, []]));
  let serial = 0;
  for (let r = 0; r < cpuRounds; r++) {
    for (const h of held) {
      const ids = h > 0 ? await launchHeld(supervisor, h, idleBin, marker, `${r}-${h}`) : [];
      try {
        if (supervisor.list().length !== h) oddities.add(`holding ${supervisor.list().length}, expected ${h}`);
        // What follows a launch (the first log checks, garbage) is over before anything is timed.
        await new Promise((r) => setTimeout(r, settleMs));
        const idleRate = await idleCpu(idleMs);
        idle[h].push(idleRate);
        try {
          const res = await crashLoop(supervisor, sink, crash, `crash-${serial++}`);
          const ends = res.exits + res.failedLaunches;
          if (res.restarts !== crash.count || res.reportedRestarts !== crash.count || ends !== crash.count + 1)
            oddities.add(
              `crash loop (H ${h}): ${res.restarts} restart events, gave-up says ${res.reportedRestarts}, ${ends} ends; expected ${crash.count}, ${crash.count}, ${crash.count + 1}`,
            );
          // Net: less what holding H costs with nothing crashing over the same wall time.
          raw[h].push({ ...res, netCpuMs: res.cpuMs - (idleRate * res.wallMs) / 1000 });
        } catch (err) {
          oddities.add(`crash loop (H ${h}): ${err.message}`);
        }
      } finally {
        const failed = await stopAll(supervisor, ids);
        if (failed) oddities.add(`${failed} of ${h} held instances failed to stop`);
      }
    }
  }
  const points = held.map((h) => {
    const xs = raw[h];
    if (xs.length === 0) return { held: h, failed: true };
    const perRestart = xs.map((x) => x.cpuMs / x.restarts);
    const netPerRestart = xs.map((x) => x.netCpuMs / x.restarts);
    return {
      held: h,
      rounds: xs.length,
      restarts: median(xs.map((x) => x.restarts)),
      exits: median(xs.map((x) => x.exits)),
      failedLaunches: median(xs.map((x) => x.failedLaunches)),
      firstFailed: median(xs.map((x) => x.firstFailed)),
      // Of all the ends: those where sh exited before confirm (a failed launch), not after running.
      failedLaunchShare:
        xs.reduce((a, x) => a + x.failedLaunches, 0) / xs.reduce((a, x) => a + x.failedLaunches + x.exits, 0),
      wallMs: median(xs.map((x) => x.wallMs)),
      cpuMs: median(xs.map((x) => x.cpuMs)),
      cpuPerRestart: median(perRestart),
      cpuPerRestartRounds: perRestart.map((x) => Math.round(x * 1000) / 1000),
      netCpuPerRestart: median(netPerRestart),
      wallPerRestart: median(xs.map((x) => x.wallMs / x.restarts)),
      idleCpuMsPerS: median(idle[h]),
    };
  });
  const at = (h, k) => points.find((p) => p.held === h)?.[k];
  const hMax = Math.max(...held);
  return {
    points,
    growth: at(hMax, 'netCpuPerRestart') / at(0, 'netCpuPerRestart'),
    growthRaw: at(hMax, 'cpuPerRestart') / at(0, 'cpuPerRestart'),
  };
}

async function worker([backend, base, idleBin, marker, paramsJson]) {
  const params = JSON.parse(paramsJson);
  const custody = await import('../dist/index.js');
  const actual = custody.capabilities().backend;
  if (actual !== backend)
    throw new Error(`asked for the ${backend} backend, custody loaded ${actual}: ${custody.capabilities().reason}`);
  const stateDir = join(base, 'state');
  const sink = eventSink();
  const oddities = new Set();
  const { supervisor } = await custody.Supervisor.open({ stateDir, onEvent: sink.onEvent });
  const out = { backend };
  try {
    out.latency = await measureLatency(supervisor, sink, { idleBin, marker, ...params }, oddities);
    out.crash = await measureCrash(supervisor, sink, { idleBin, marker, ...params }, oddities);
    const left = supervisor.list();
    if (left.length) {
      oddities.add(`${left.length} instances listed at the end: ${left.map((i) => `${i.id} ${i.status}`).join(', ')}`);
      await stopAll(
        supervisor,
        left.map((i) => i.id),
      );
    }
  } finally {
    await supervisor.close();
  }
  if (sink.warnings.length) oddities.add(`warnings: ${sink.warnings.join(' | ')}`);
  out.events = sink.counts;
  out.oddities = [...oddities];
  out.leftoverChildren = childrenOf(process.pid).length;
  // Instances left in the state dir; custody's own dot-entries are not.
  out.leftoverState = readdirSync(stateDir).filter((n) => !n.startsWith('.')).length;
  process.stdout.write(`${JSON.stringify(out)}\n`, () => process.exit(0));
}

await runAsScript(import.meta.url, { run, report, worker });
