// drain: what stopping N instances at once costs, as N grows: an agent
// draining a host calls stop() on every instance together. N from 100 to
// 5 000, on custody native and js, each instance launched by the measuring
// supervisor itself (its children) or adopted by it after a restart (a
// reopened state dir: non-children), without and with a cgroup root. The
// measure is wall time ÷ N (ms per stop); beside it, whether every stop
// succeeded and how many escalated to SIGKILL (none should: every process
// dies at SIGTERM at once, so an escalation is a deadline misread on a
// starved loop).
//
//   node bench/drain.js [--quick] [--sizes=100,1000]   standalone: prints the tables
//   import { run, report } from './drain.js'   for bench/run.js
//
// The instances are bench/c/idle.c processes (dead at SIGTERM, and dead
// with their parent), launched 32 at a time. Launched: the worker opens a
// Supervisor on a fresh state dir, launches N, then stops all at once
// (graceMs 2000). Adopted: a holder (this file with --holder) launches N
// with the native backend and closes its Supervisor, keeping its children;
// the worker opens the state dir (recovery adopts them; not timed), then
// stops all at once; the holder reaps them as they die. Each measurement
// runs in its own worker under a raised fd limit, its state dir on a disk
// (the stop's manifest write and removal are fsync'd), one round per point:
// every point is thousands of processes. Whatever still carries the run's
// marker afterwards is killed by pid and counted.
//   node bench/drain.js --worker <launched|adopted> <state dir> <N> <cgroup root|-> <idle bin> <marker>
//   node bench/drain.js --holder <state dir> <N> <cgroup root|-> <idle bin> <marker>
import { mkdirSync, mkdtempSync, rmdirSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { buildC, formatRatio, formatTable, formatTargets, runAsScript, sizesOption } from './lib.js';
import {
  cpuTicks,
  diskBase,
  fsType,
  killMarked,
  newMarker,
  noiseLine,
  nofileCommand,
  otherCpuShare,
  processBudget,
  runWorkerNofile,
  startHolder,
  sweepMarker,
} from './procs.js';

export const name = 'drain';

// The cost per stop at N = 5 000 within 1.5x of that at 500: linear, whatever is in flight.
const GROWTH_MAX = 1.5;
const GROWTH_FROM = 500;
const GRACE_MS = 2000;
const LAUNCH_LANES = 32;
const IDLE_SECONDS = '3600';

const PARAMS = {
  quick: { sizes: [100, 300], cgroups: false, timeoutMs: 120_000 },
  full: { sizes: [100, 500, 1000, 2000, 5000], cgroups: true, timeoutMs: 600_000 },
};

const BACKENDS = [
  { key: 'native', label: 'custody native' },
  { key: 'js', label: 'custody js' },
];
const MODES = ['launched', 'adopted'];

/** Where instance cgroups can go here: a root under the cgroup v2 mount, or why not. */
async function cgroupPlace() {
  const custody = await import('../dist/index.js');
  const mount = custody.capabilities().cgroup?.mount ?? null;
  if (!mount) return { root: null, why: 'no cgroup v2 mount' };
  const root = join(mount, `custody-bench-drain-${process.pid}`);
  try {
    mkdirSync(root);
    rmdirSync(root);
    return { root, why: null };
  } catch (err) {
    return { root: null, why: `cgroup v2 at ${mount} is not writable (${err.code})` };
  }
}

/** Removes a cgroup root the supervisors made (empty by then: its instances' and their own are gone). */
function removeRoot(root) {
  if (!root) return;
  try {
    rmdirSync(root);
  } catch {
    // Not made, or not empty: the report's leftover count says so.
  }
}

/** Measures every point and returns the results. */
export async function run({ quick = false, sizes: only = null } = {}) {
  const params = { ...PARAMS[quick ? 'quick' : 'full'], ...(only ? { sizes: only, sizesGiven: true } : {}) };
  const idleBin = buildC('idle');
  const self = fileURLToPath(import.meta.url);
  const budget = processBudget(Math.max(...params.sizes));
  const sizes = params.sizes.filter((n) => n <= budget.count);
  if (sizes.length === 0) throw new Error(`drain: no room for ${params.sizes[0]} processes (${budget.limitedBy})`);
  const place = params.cgroups ? await cgroupPlace() : { root: null, why: 'quick runs without cgroups' };
  const cgroupModes = place.root ? [false, true] : [false];
  const base = mkdtempSync(join(diskBase(), 'custody-bench-drain-'));
  const fs = fsType(base);
  const marker = newMarker('drain');
  const loadBefore = os.loadavg();
  const cpuBefore = cpuTicks();
  let escaped = 0;
  const points = [];
  let serial = 0;
  try {
    for (const cgroup of cgroupModes) {
      for (const mode of MODES) {
        for (const b of BACKENDS) {
          for (const n of sizes) {
            const stateDir = join(base, `state-${serial++}`);
            const root = cgroup ? place.root : null;
            const point = { backend: b.key, mode, cgroup, n };
            let holder = null;
            try {
              if (mode === 'adopted') {
                const [cmd, args] = nofileCommand(self, ['--holder', stateDir, n, root ?? '-', idleBin, marker]);
                holder = startHolder(cmd, args, {
                  what: 'drain holder',
                  env: { ...process.env, CUSTODY_BACKEND: 'native' },
                });
                const ready = await holder.next(60_000 + n * 30);
                if (ready.error) throw new Error(`drain holder: ${ready.error}`);
                point.launchMs = ready.ms;
              }
              const res = await runWorkerNofile(self, [mode, stateDir, n, root ?? '-', idleBin, marker], {
                env: { CUSTODY_BACKEND: b.key },
                timeoutMs: params.timeoutMs,
              });
              Object.assign(point, res, { msPerStop: res.stopMs / n });
            } catch (err) {
              point.failedRun = String(err?.message ?? err)
                .split('\n')
                .slice(0, 3)
                .join(' ')
                .slice(0, 300);
            } finally {
              if (holder) {
                const { messages } = await holder.stop(60_000);
                const end = messages.find((m) => m.stopped !== undefined);
                if (end) point.holderLeft = end.leftover;
              }
              escaped += sweepMarker(marker);
              removeRoot(root);
              rmSync(stateDir, { recursive: true, force: true });
            }
            points.push(point);
          }
        }
      }
    }
  } finally {
    escaped += sweepMarker(marker);
    removeRoot(place.root);
    rmSync(base, { recursive: true, force: true });
  }
  return summarizeRun({ quick, params, sizes, budget, fs, place, points, escaped, loadBefore, cpuBefore });
}

function summarizeRun({ quick, params, sizes, budget, fs, place, points, escaped, loadBefore, cpuBefore }) {
  const targets = [];
  const from = sizes.includes(GROWTH_FROM) ? GROWTH_FROM : sizes[0];
  const to = sizes.at(-1);
  for (const cgroup of [false, true]) {
    for (const mode of MODES) {
      for (const b of BACKENDS) {
        const of = (n) =>
          points.find((p) => p.backend === b.key && p.mode === mode && p.cgroup === cgroup && p.n === n);
        const [a, z] = [of(from), of(to)];
        if (!a && !z) continue;
        const what = `${b.key}, ${mode}${cgroup ? ', cgroups' : ''}`;
        const t = {
          id: `linear.${b.key}.${mode}${cgroup ? '.cgroup' : ''}`,
          description: `${what}: ms per stop at N = ${to.toLocaleString('en-US')} / at N = ${from.toLocaleString('en-US')}`,
          op: '<=',
          limit: GROWTH_MAX,
        };
        if (a?.msPerStop && z?.msPerStop && from !== to) {
          const ratio = z.msPerStop / a.msPerStop;
          targets.push({ ...t, value: ratio, met: ratio <= GROWTH_MAX });
        } else {
          targets.push({ ...t, skipped: from === to ? 'one size measured' : 'a point failed (above)' });
        }
      }
    }
  }
  const measured = points.filter((p) => !p.failedRun);
  const failedStops = measured.reduce((s, p) => s + p.failed, 0);
  const escalated = measured.reduce((s, p) => s + p.escalated, 0);
  const stops = measured.reduce((s, p) => s + p.n, 0);
  targets.push({
    id: 'truthful',
    description: `every stop succeeded, none escalated (${stops.toLocaleString('en-US')} stops)`,
    op: '<=',
    limit: 0,
    value: failedStops + escalated + (points.length - measured.length),
    shown: `${failedStops} failed, ${escalated} escalated, ${points.length - measured.length} runs failed`,
    shownLimit: '0',
    met: failedStops + escalated === 0 && measured.length === points.length,
  });
  const round2 = (xs) => xs.map((x) => Math.round(x * 100) / 100);
  return {
    name,
    quick,
    params: {
      ...params,
      sizes,
      sizesWanted: params.sizes,
      limitedBy: sizes.length < params.sizes.length ? budget.limitedBy : null,
      cgroupRoot: place.root,
      cgroupsSkipped: place.root ? null : place.why,
      stateDir: { fs: fs.name },
      graceMs: GRACE_MS,
      unit: 'ms per stop: wall time of stopping all N at once, divided by N',
    },
    points,
    targets,
    escapedProcesses: escaped,
    loadavg: { before: round2(loadBefore), after: round2(os.loadavg()) },
    otherCpu: otherCpuShare(cpuBefore, cpuTicks(), os.cpus().length),
  };
}

const fmt = (x, digits = 2) => (Number.isFinite(x) ? x.toFixed(digits) : 'n/a');
const int = (x) => (Number.isFinite(x) ? Math.round(x).toLocaleString('en-US') : 'n/a');

/** The results as printable tables. */
export function report(results) {
  const { params, points, targets, quick, escapedProcesses, loadavg, otherCpu } = results;
  const rows = points.map((p) => {
    const head = [p.mode, p.cgroup ? 'yes' : 'no', BACKENDS.find((b) => b.key === p.backend).label, int(p.n)];
    if (p.failedRun) return [...head, 'FAILED', '', '', '', p.failedRun.slice(0, 80)];
    const codes = Object.entries(p.codes ?? {})
      .map(([c, k]) => `${c} ${k}`)
      .join(', ');
    return [...head, int(p.stopMs), fmt(p.msPerStop, 3), int(p.failed), int(p.escalated), codes];
  });
  // The cost per stop at each N over that at the first N, per series: the curve's shape in one line each.
  const curves = [];
  for (const cgroup of [false, true]) {
    for (const mode of MODES) {
      for (const b of BACKENDS) {
        const series = points.filter(
          (p) => p.backend === b.key && p.mode === mode && p.cgroup === cgroup && p.msPerStop,
        );
        if (series.length < 2) continue;
        const base = series[0].msPerStop;
        curves.push(
          `  ${b.key}, ${mode}${cgroup ? ', cgroups' : ''}: ${series.map((p) => `${int(p.n)} ${formatRatio(p.msPerStop / base)}`).join(', ')}`,
        );
      }
    }
  }
  return [
    `drain: stop() of N instances at once (bench/c/idle.c, dead at SIGTERM; graceMs ${params.graceMs}), launched by the` +
      ` supervisor or adopted after a reopen; state on ${params.stateDir.fs}; one round per point${quick ? ' (quick)' : ''}`,
    quick
      ? `  quick measures N = ${params.sizes.join(', ')} without cgroups, not the full run's ${PARAMS.full.sizes.join(', ')}`
      : null,
    params.cgroupsSkipped && !quick ? `  no cgroup series: ${params.cgroupsSkipped}` : null,
    params.limitedBy ? `  N limited to ${params.sizes.join(', ')} by ${params.limitedBy}` : null,
    formatTable(
      ['mode', 'cgroups', 'backend', 'N', 'all stopped, ms', 'ms per stop', 'failed', 'escalated', 'errors'],
      rows,
    ),
    '',
    '  ms per stop against the smallest N:',
    ...curves,
    '',
    formatTargets(targets, { quick, quickNote: 'quick stops at a few hundred' }),
    escapedProcesses > 0
      ? `  ${escapedProcesses} idle processes outlived their run and were killed by the sweep`
      : null,
    noiseLine(otherCpu, loadavg),
  ]
    .filter((l) => l !== null)
    .join('\n');
}

// ---- worker side ----

/** Launches n idle instances on the supervisor, LAUNCH_LANES at a time; returns the ms it took. */
async function launchAll(supervisor, n, idleBin, marker) {
  const t0 = performance.now();
  let next = 0;
  const lane = async () => {
    while (next < n) {
      const id = `drain-${next++}`;
      await supervisor.launch({ id, command: idleBin, args: (token) => [IDLE_SECONDS, marker, token] });
    }
  };
  await Promise.all(Array.from({ length: LAUNCH_LANES }, lane));
  return performance.now() - t0;
}

/** Worker: one point. Prints { stopMs, failed, escalated, codes, ... } as its last line. */
async function worker([mode, stateDir, nArg, rootArg, idleBin, marker]) {
  const custody = await import('../dist/index.js');
  const n = Number(nArg);
  const options = { stateDir, onEvent: () => {} };
  if (rootArg !== '-') options.cgroup = { root: rootArg };
  const out = { backend: custody.capabilities().backend };
  const { supervisor, report: rep } = await custody.Supervisor.open(options);
  try {
    if (mode === 'launched') out.launchMs = await launchAll(supervisor, n, idleBin, marker);
    else out.adopted = rep.adopted.length;
    const ids = supervisor.list().map((i) => i.id);
    if (ids.length !== n) throw new Error(`${ids.length} instances to stop, expected ${n}`);
    globalThis.gc?.();
    const t0 = performance.now();
    const settled = await Promise.allSettled(ids.map((id) => supervisor.stop(id, { graceMs: GRACE_MS })));
    out.stopMs = performance.now() - t0;
    const failed = settled.filter((s) => s.status === 'rejected');
    out.failed = failed.length;
    out.escalated = settled.filter((s) => s.status === 'fulfilled' && s.value.escalated).length;
    out.codes = {};
    for (const f of failed) {
      const code = f.reason?.code ?? 'other';
      out.codes[code] = (out.codes[code] ?? 0) + 1;
    }
    out.firstError = failed[0] ? String(failed[0].reason?.message ?? failed[0].reason).slice(0, 200) : null;
    out.left = supervisor.list().length;
  } finally {
    await supervisor.close();
  }
  process.stdout.write(`${JSON.stringify(out)}\n`, () => process.exit(0));
}

// ---- holder side ----

/**
 * Holder: launches n idle instances (its children), closes its Supervisor
 * and answers { ms }; they keep running for a worker to adopt. On EOF of
 * stdin or SIGINT/SIGTERM it kills by pid whatever of them still runs (the
 * worker stopped them all, normally), waits for custody to have reaped them,
 * answers { stopped, leftover } and exits. Its idle processes die with it.
 */
async function holder([stateDir, nArg, rootArg, idleBin, marker]) {
  const custody = await import('../dist/index.js');
  const n = Number(nArg);
  const options = { stateDir, onEvent: () => {} };
  if (rootArg !== '-') options.cgroup = { root: rootArg };
  const pids = [];
  let ending = null;
  const end = () =>
    (ending ??= (async () => {
      const stopped = killMarked(pids, marker);
      // custody's watchers reap its children even after the supervisor closed; give them a moment.
      for (let i = 0; i < 200 && (await childCount()) > 0; i++) await new Promise((r) => setTimeout(r, 10));
      process.stdout.write(`${JSON.stringify({ stopped, leftover: await childCount() })}\n`, () => process.exit(0));
      await new Promise(() => {});
    })());
  process.once('SIGINT', end);
  process.once('SIGTERM', end);
  const { supervisor } = await custody.Supervisor.open(options);
  let answer;
  try {
    const t0 = performance.now();
    const lane = async () => {
      while (pids.length < n && !ending) {
        const id = `drain-${pids.length}`;
        pids.push(0);
        const slot = pids.length - 1;
        const inst = await supervisor.launch({ id, command: idleBin, args: (token) => [IDLE_SECONDS, marker, token] });
        pids[slot] = inst.pid;
      }
    };
    await Promise.all(Array.from({ length: LAUNCH_LANES }, lane));
    answer = { ms: performance.now() - t0, launched: pids.length };
  } catch (err) {
    answer = { error: String(err?.stack ?? err) };
  } finally {
    await supervisor.close();
  }
  process.stdout.write(`${JSON.stringify(answer)}\n`);
  const lines = createInterface({ input: process.stdin });
  lines.on('close', end);
  await new Promise(() => {});
}

/** How many children this process has now (zombies too). */
async function childCount() {
  const { childrenOf } = await import('./procs.js');
  return childrenOf(process.pid).length;
}

await runAsScript(import.meta.url, { run, report, worker, holder, options: sizesOption });
