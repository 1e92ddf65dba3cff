// recover: what Supervisor.open() costs, i.e. recovering every manifest in
// the state dir, as the state grows: N running instances (live processes,
// adopted by open()) and M = N/10 interrupted launches (`starting`
// manifests whose process is gone, cleaned by open()), for N from 100 to
// 5 000, on custody native and js. Beside each N: one full process-table
// scan, from custody (backend.listProcesses()) and from C (bench/c/scan.c:
// the same reads, and cmdline only), the least one open() has to pay for.
//
//   node bench/recover.js [--quick] [--sizes=100,1000]   standalone: prints the tables
//   import { run, report } from './recover.js'   for bench/run.js
//
// The running instances are bench/c/idle.c processes launched by
// Supervisor.launch, with the library's own manifests, from a holder process
// (this file with --holder): it opens a Supervisor on the state dir, launches
// until N run (32 in flight), closes it (the processes keep running, its
// children, so it reaps them when they end) and answers; it grows the set N
// by N, so 5 000 launches serve every size. Its idle processes carry a
// marker; at the end (or on EOF of its stdin, or SIGINT/SIGTERM) it
// SIGKILLs each by pid and waits until each is reaped. They also die with it
// (PR_SET_PDEATHSIG), and the harness kills by pid whatever still carries
// the marker after it.
//
// The interrupted launches are written by each measuring worker before it
// opens, through the library's StateStore: each is a running manifest read
// back from the store with a new token (in its argv too), state `starting`,
// no identity, and the pid of a process that has exited as its supervisor;
// so they follow the manifest format whatever fields it grows. A worker
// first removes what an earlier worker may have left (only `starting` and
// unreadable manifests; untimed).
//
// Every open() runs in its own worker (custody picks its backend when it
// loads), under ulimit -n 65536 (it holds a pidfd per adopted instance),
// with its state dir on a disk (fsyncs wait for the device; the table names
// the file system). Rounds alternate the backends; a round is repeated only
// while one open() takes under roundBudgetMs, and a backend whose open()
// times out is not measured at larger N (the table says so). Each worker
// counts, without changing custody (bench/instrument.js), its backend calls
// (process-table scans, inspections) and its fsyncs during open(); at N =
// 5 000 it then sits idle for two seconds, holding what it adopted, and
// reports the CPU it took in each:
//   node bench/recover.js --worker <state dir> <interrupted M> <running N>
//   node bench/recover.js --holder <state dir> <idle bin> <marker>
import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { createInterface } from 'node:readline';
import { fileURLToPath } from 'node:url';
import { countFsyncs, profileBackend } from './instrument.js';
import {
  buildC,
  formatRatio,
  formatTable,
  formatTargets,
  median,
  runAsScript,
  runJson,
  sizesOption,
  summarize,
} from './lib.js';
import {
  childrenOf,
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

export const name = 'recover';

// open() with 5 000 running + 500 interrupted launches: within 1 s native,
// 2 s js. An agent that restarts must be back before its callers give up.
const GOAL_RUNNING = 5000;
const GOAL_INTERRUPTED = 500;
const OPEN_MAX_MS = { native: 1000, js: 2000 };
// Linear in manifests + processes: the cost per manifest at the largest N
// within 2x of that at the smallest (an O(starting x processes) recovery
// is ~20x at 5 000 against 100).
const PER_MANIFEST_GROWTH_MAX = 2;

// Once open() returns, at N = GOAL_RUNNING: the share of one CPU the process
// takes while it only holds what it adopted, over IDLE_WINDOW_MS twice: the
// first window (settling: the adopted instances' first log checks run in
// it) and the second (held: what holding them costs from then on). The js
// backend polls each adopted non-child's /proc on a timer; at 5 000 that
// took three quarters of the thread before the poller had a budget.
const IDLE_WINDOW_MS = 1000;
const HELD_CPU_MAX = 0.15;

const INTERRUPTED_SHARE = 0.1;
const LAUNCH_CONCURRENCY = 32;
const IDLE_SECONDS = '3600';

// Today (one scan of the table per `starting` manifest) open() at 5 000 +
// 500 takes minutes; once linear, well under a second. A full run is ~5 min
// before, ~1 min after (launching 5 000 instances is ~10 s of it); quick
// (N = 100, 400) ~10 s.
const PARAMS = {
  quick: { sizes: [100, 400], rounds: 2, roundBudgetMs: 5_000, timeoutMs: 120_000, cRounds: 3 },
  full: { sizes: [100, 500, 1000, 2000, 5000], rounds: 3, roundBudgetMs: 10_000, timeoutMs: 600_000, cRounds: 5 },
};

const BACKENDS = [
  { key: 'native', label: 'custody native' },
  { key: 'js', label: 'custody js' },
];
const C_SCANS = [
  { key: 'owner', mode: 'stat-cmdline-owner', label: 'C stat+cmdline+owner' },
  { key: 'cmdline', mode: 'cmdline', label: 'C cmdline only' },
];

const interruptedFor = (n) => Math.round(n * INTERRUPTED_SHARE);

/** Measures every size on every backend and returns the results. */
export async function run({ quick = false, sizes: only = null } = {}) {
  const params = { ...PARAMS[quick ? 'quick' : 'full'], ...(only ? { sizes: only, sizesGiven: true } : {}) };
  const idleBin = buildC('idle');
  const cBin = buildC('scan');
  const self = fileURLToPath(import.meta.url);
  const budget = processBudget(Math.max(...params.sizes));
  const sizes = params.sizes.filter((n) => n <= budget.count);
  if (sizes.length === 0) throw new Error(`recover: no room for ${params.sizes[0]} processes (${budget.limitedBy})`);
  const base = mkdtempSync(join(diskBase(), 'custody-bench-recover-'));
  const stateDir = join(base, 'state');
  const fs = fsType(base);
  const marker = newMarker('recover');
  const loadBefore = os.loadavg();
  const cpuBefore = cpuTicks();

  const [holderCmd, holderArgs] = nofileCommand(self, ['--holder', stateDir, idleBin, marker]);
  const holder = startHolder(holderCmd, holderArgs, { what: 'recover holder' });
  const pids = [];
  let holderReport = null;
  let escaped = 0;
  let cleaned = false;
  const cleanup = async () => {
    if (cleaned) return;
    cleaned = true;
    try {
      const { status, messages } = await holder.stop(60_000);
      holderReport = { status, ...messages.find((m) => m.stopped !== undefined) };
    } finally {
      // Whatever still carries the marker escaped the holder: by pid, then by a scan.
      escaped = killMarked(pids, marker) + sweepMarker(marker);
      rmSync(base, { recursive: true, force: true });
    }
  };
  // Ctrl-C or a kill while thousands of idle processes run: end them first.
  const onSignal = (sig) => {
    console.error(`recover: ${sig}: ending the ${pids.length} idle processes`);
    cleanup().finally(() => process.exit(128 + os.constants.signals[sig]));
  };
  process.once('SIGINT', onSignal);
  process.once('SIGTERM', onSignal);

  const points = [];
  // Per backend: why it was not measured at larger N (a timeout or a failure), once it happened.
  const stopped = {};
  let holderBackend = null;
  try {
    for (const n of sizes) {
      const m = interruptedFor(n);
      holder.send({ grow: n });
      // ~1-3 ms per launch on a busy 2-CPU VM with the state on a disk; generous.
      const grown = await holder.next(60_000 + n * 20);
      if (grown.error) throw new Error(`recover holder: ${grown.error}`);
      pids.push(...grown.pids);
      holderBackend = grown.backend;
      const point = {
        running: n,
        interrupted: m,
        launchMs: grown.ms,
        launched: grown.pids.length,
        c: {},
        backends: {},
      };
      for (const c of C_SCANS) {
        const r = await runJson(cBin, [c.mode, params.cRounds, 1].map(String));
        point.c[c.key] = { ...summarize(r.rounds_ms), listed: median(r.listed_rounds) };
      }
      for (let round = 0; round < params.rounds; round++) {
        const order = round % 2 === 0 ? BACKENDS : [...BACKENDS].reverse();
        for (const b of order) {
          if (stopped[b.key]) continue;
          const prev = point.backends[b.key];
          if (prev && (prev.failed || prev.openMs.some((x) => x > params.roundBudgetMs))) continue;
          const slot = (point.backends[b.key] ??= { openMs: [], runs: [] });
          const t0 = performance.now();
          let res;
          try {
            res = await runWorkerNofile(self, [stateDir, m, n], {
              env: { CUSTODY_BACKEND: b.key },
              timeoutMs: params.timeoutMs,
            });
          } catch (err) {
            const elapsed = performance.now() - t0;
            const timedOut = elapsed >= params.timeoutMs - 1000;
            slot.failed = timedOut ? `timed out after ${Math.round(params.timeoutMs / 1000)} s` : briefError(err);
            slot.timedOut = timedOut;
            stopped[b.key] = `${timedOut ? 'timed out' : 'failed'} at N = ${n.toLocaleString('en-US')}`;
            continue;
          }
          if (res.problem) {
            slot.failed = res.problem;
            stopped[b.key] = `recovery misreported at N = ${n.toLocaleString('en-US')}`;
          }
          slot.openMs.push(res.openMs);
          slot.runs.push(res);
        }
      }
      points.push(point);
    }
  } finally {
    process.off('SIGINT', onSignal);
    process.off('SIGTERM', onSignal);
    await cleanup();
  }
  const leftover = childrenOf(process.pid).length + escaped + (holderReport?.leftover ?? 0);
  if (holderReport?.status.code !== 0 || holderReport.reaped !== holderReport.stopped) {
    throw new Error(`recover: the holder did not end its idle processes cleanly: ${JSON.stringify(holderReport)}`);
  }
  return summarizeRun({
    quick,
    params,
    sizes,
    budget,
    fs,
    base,
    holderBackend,
    points,
    stopped,
    leftover,
    loadBefore,
    cpuBefore,
  });
}

/** The line of a worker's failure that says what went wrong (runJson's message ends with its stderr). */
function briefError(err) {
  const lines = String(err?.message ?? err).split('\n');
  const line = lines.slice(1).find((l) => /^\s*\w*Error\b/.test(l)) ?? lines[0];
  return line.trim().slice(0, 240);
}

/** Medians, growth and targets from the raw points. */
function summarizeRun({
  quick,
  params,
  sizes,
  budget,
  fs,
  base,
  holderBackend,
  points,
  stopped,
  leftover,
  loadBefore,
  cpuBefore,
}) {
  for (const p of points) {
    for (const [key, b] of Object.entries(p.backends)) {
      if (b.openMs.length === 0) continue;
      const runs = b.runs;
      const calls = (method) => median(runs.map((r) => r.calls[method]?.calls ?? 0));
      Object.assign(b, {
        open: summarize(b.openMs),
        usPerManifest: (median(b.openMs) * 1000) / (p.running + p.interrupted),
        scans: calls('listProcesses'),
        inScansMs: median(runs.map((r) => r.calls.listProcesses?.ms ?? 0)),
        inspections: calls('inspectPinned') + calls('inspect'),
        fsyncs: median(runs.map((r) => r.fsyncs)),
        listed: median(runs.map((r) => r.listed)),
        scanMs: median(runs.map((r) => r.scanMs)),
        firstEventMs: median(runs.map((r) => r.firstEventMs ?? NaN)),
        settlingCpu: median(runs.map((r) => r.idleCpu?.[0] ?? NaN)),
        heldCpu: median(runs.map((r) => r.idleCpu?.[1] ?? NaN)),
        backend: key,
      });
    }
  }
  const growth = {};
  for (const { key } of BACKENDS) {
    const measured = points.filter((p) => p.backends[key]?.open && !p.backends[key].failed);
    const first = measured[0];
    const last = measured.at(-1);
    const marginal = [];
    for (let i = 1; i < measured.length; i++) {
      const [a, b] = [measured[i - 1], measured[i]];
      const added = b.running + b.interrupted - (a.running + a.interrupted);
      marginal.push({
        from: a.running,
        to: b.running,
        usPerManifest: ((b.backends[key].open.median - a.backends[key].open.median) * 1000) / added,
      });
    }
    growth[key] = {
      from: first?.running,
      to: last?.running,
      ratio:
        first && last && last !== first ? last.backends[key].usPerManifest / first.backends[key].usPerManifest : NaN,
      marginal,
      stoppedAt: stopped[key] ?? null,
    };
  }

  const largest = sizes.at(-1);
  const targets = [];
  for (const { key } of BACKENDS) {
    const goal = points.find((p) => p.running === GOAL_RUNNING && p.interrupted === GOAL_INTERRUPTED)?.backends[key];
    const t = {
      id: `open.${key}`,
      description: `${key}: open() with ${GOAL_RUNNING.toLocaleString('en-US')} running + ${GOAL_INTERRUPTED} interrupted`,
      op: '<=',
      limit: OPEN_MAX_MS[key],
      shownLimit: `<= ${OPEN_MAX_MS[key].toLocaleString('en-US')} ms`,
    };
    if (goal?.open && !goal.failed) {
      targets.push({
        ...t,
        value: goal.open.median,
        shown: `${fmtMs(goal.open.median)} ms`,
        met: goal.open.median <= OPEN_MAX_MS[key],
      });
    } else if (stopped[key]) {
      const timedOut = stopped[key].startsWith('timed out');
      const shown = timedOut ? `> ${Math.round(params.timeoutMs / 1000)} s` : 'failed';
      targets.push({ ...t, value: Infinity, shown, met: false, reason: `${stopped[key]}, see the notes above` });
    } else {
      const upTo = largest.toLocaleString('en-US');
      const why = params.sizesGiven
        ? `this run stops at N = ${upTo} (--sizes)`
        : quick
          ? `quick stops at N = ${upTo}`
          : `N limited to ${upTo} by ${budget.limitedBy}`;
      targets.push({ ...t, skipped: why });
    }
  }
  for (const { key } of BACKENDS) {
    const goal = points.find((p) => p.running === GOAL_RUNNING)?.backends[key];
    const t = {
      id: `held.${key}`,
      description: `${key}: CPU while holding ${GOAL_RUNNING.toLocaleString('en-US')} adopted, idle (share of one CPU)`,
      op: '<=',
      limit: HELD_CPU_MAX,
      shownLimit: `<= ${pct(HELD_CPU_MAX)}`,
    };
    if (goal?.open && Number.isFinite(goal.heldCpu)) {
      targets.push({ ...t, value: goal.heldCpu, shown: pct(goal.heldCpu), met: goal.heldCpu <= HELD_CPU_MAX });
    } else {
      targets.push({ ...t, skipped: `N = ${GOAL_RUNNING.toLocaleString('en-US')} not measured` });
    }
  }
  for (const { key } of BACKENDS) {
    const g = growth[key];
    const t = {
      id: `linear.${key}`,
      description: `${key}: cost per manifest at N = ${(g.to ?? largest).toLocaleString('en-US')} / at N = ${(g.from ?? sizes[0]).toLocaleString('en-US')} (linear)`,
      op: '<=',
      limit: PER_MANIFEST_GROWTH_MAX,
    };
    if (g.stoppedAt) {
      targets.push({ ...t, value: g.ratio, met: false, reason: `${g.stoppedAt}, see the notes above` });
    } else if (Number.isFinite(g.ratio)) {
      targets.push({ ...t, value: g.ratio, met: g.ratio <= PER_MANIFEST_GROWTH_MAX });
    } else {
      targets.push({ ...t, skipped: 'fewer than two sizes measured' });
    }
  }
  const round2 = (xs) => xs.map((x) => Math.round(x * 100) / 100);
  return {
    name,
    quick,
    params: {
      ...params,
      sizes,
      sizesWanted: params.sizes,
      limitedBy: sizes.length < params.sizes.length ? budget.limitedBy : null,
      interruptedShare: INTERRUPTED_SHARE,
      stateDir: { base, fs: fs.name },
      holderBackend,
      unit: 'ms per Supervisor.open(), median of rounds',
    },
    points,
    growth,
    targets,
    leftoverProcesses: leftover,
    loadavg: { before: round2(loadBefore), after: round2(os.loadavg()) },
    otherCpu: otherCpuShare(cpuBefore, cpuTicks(), os.cpus().length),
  };
}

function pct(x) {
  return Number.isFinite(x) ? `${(x * 100).toFixed(1)}%` : 'n/a';
}

function fmtMs(x) {
  if (!Number.isFinite(x)) return 'n/a';
  return x >= 100 ? Math.round(x).toLocaleString('en-US') : x.toFixed(1);
}

/** The results as printable tables. */
export function report(results) {
  const { params, points, growth, targets, quick, leftoverProcesses, loadavg, otherCpu } = results;
  const n = (x) => (Number.isFinite(x) ? Math.round(x).toLocaleString('en-US') : 'n/a');
  const rows = [];
  const notes = [];
  for (const p of points) {
    for (const { key, label } of BACKENDS) {
      const b = p.backends[key];
      const head = [n(p.running), n(p.interrupted), label];
      if (b?.failed) notes.push(`  [${notes.length + 1}] ${label} at N = ${n(p.running)}: ${b.failed}`);
      const mark = b?.failed ? ` [${notes.length}]` : '';
      if (!b?.open) {
        rows.push([...head, b?.failed ? `FAILED${mark}` : 'not measured']);
        continue;
      }
      const spread = b.open.rounds.length > 1 ? `${fmtMs(b.open.min)}-${fmtMs(b.open.max)}` : '';
      rows.push([
        ...head,
        `${fmtMs(b.open.median)}${mark}`,
        spread,
        n(b.usPerManifest),
        n(b.scans),
        fmtMs(b.inScansMs),
        n(b.inspections),
        n(b.fsyncs),
        n(b.listed),
        fmtMs(b.scanMs),
        `${fmtMs(p.c.owner.median)} / ${fmtMs(p.c.cmdline.median)}`,
        formatRatio(b.open.median / p.c.owner.median),
        Number.isFinite(b.settlingCpu) ? `${pct(b.settlingCpu)} / ${pct(b.heldCpu)}` : '',
      ]);
    }
  }
  const growthLines = BACKENDS.map(({ key }) => {
    const g = growth[key];
    const marg = g.marginal.map((x) => `${n(x.from)}->${n(x.to)}: ${n(x.usPerManifest)}`).join(', ');
    return (
      `  ${key}: us per manifest at N = ${n(g.from)} -> ${n(g.to)}: ${formatRatio(g.ratio)}; marginal us per added manifest ${marg || 'n/a'}` +
      (g.stoppedAt ? '; not measured past a failure (above)' : '')
    );
  });
  const lines = [
    `recover: Supervisor.open() with N running instances (bench/c/idle.c, launched by Supervisor.launch) + N/10 interrupted launches` +
      ` (starting manifests, process gone); state on ${params.stateDir.fs}; up to ${params.rounds} rounds${quick ? ' (quick)' : ''}`,
    quick
      ? `  quick measures N = ${params.sizes.join(', ')}, not the full run's ${PARAMS.full.sizes.join(', ')}`
      : null,
    params.limitedBy
      ? `  N limited to ${params.sizes.join(', ')} of ${params.sizesWanted.join(', ')} by ${params.limitedBy}`
      : null,
    `  per open(): scans = backend.listProcesses() calls (in scans: the ms they took), inspections = inspect/inspectPinned calls,` +
      ` fsyncs through node:fs; table = processes in /proc;`,
    `  one scan: custody's listProcesses() once, and C (bench/c/scan.c) stat+cmdline+owner / cmdline only, ms;` +
      ` open / C = open() over one C scan doing the same reads;`,
    `  idle CPU (at N = ${GOAL_RUNNING.toLocaleString('en-US')}) = the share of one CPU the process took, holding what it adopted and doing nothing else,` +
      ` in the first and the second ${IDLE_WINDOW_MS} ms after open() returned (the first log checks run in the first)`,
    formatTable(
      [
        'running',
        'interrupted',
        'backend',
        'open() ms',
        'min-max',
        'us/manifest',
        'scans',
        'in scans ms',
        'inspections',
        'fsyncs',
        'table',
        'one scan',
        'C scan',
        'open / C',
        'idle CPU 1st s / 2nd s',
      ],
      rows,
      { align: 'rrllrrrrrrrrrrr' },
    ),
    ...notes,
    '',
    '  growth (linear: the ratio stays near 1 or below; fixed costs make small N dearer per manifest):',
    ...growthLines,
    `  instances launched by the holder on ${params.holderBackend}: ${points.map((p) => `${n(p.launched)} in ${n(p.launchMs)} ms`).join(', ')}`,
    '',
    formatTargets(
      targets.map((t) => ({ ...t, shown: t.shown ?? (t.skipped ? undefined : formatRatio(t.value)) })),
      { quick, quickNote: 'quick' },
    ),
    '',
    `  leftover processes after the run: ${leftoverProcesses}`,
    noiseLine(otherCpu, loadavg),
  ];
  return lines.filter((l) => l !== null).join('\n');
}

// ---- worker side ----

/**
 * Removes every manifest that is not `running` (interrupted launches an
 * earlier worker did not get to clean, unreadable leftovers): what each
 * measurement starts from is exactly N running instances.
 */
async function keepOnlyRunning(store) {
  let running = 0;
  let removed = 0;
  for (const id of store.ids()) {
    let m = null;
    try {
      m = store.read(id);
    } catch {
      // unreadable: not one of ours to keep
    }
    if (m?.state === 'running') {
      running++;
      continue;
    }
    await store.remove(id);
    removed++;
  }
  return { running, removed };
}

/**
 * A process that has exited, the supervisor of an interrupted launch: its pid, and the memory layout
 * it showed (its manifest's forkImage), which no live process shows now.
 */
function deadSupervisor(parseImage) {
  const r = spawnSync('/bin/sh', ['-c', 'cat /proc/$$/stat'], { encoding: 'latin1' });
  if (r.error || !r.pid) throw new Error(`/bin/sh: ${r.error?.message ?? 'no pid'}`);
  return { pid: r.pid, image: parseImage(r.stdout) };
}

async function worker([stateDir, interruptedArg, runningArg]) {
  const [interrupted, expectRunning] = [interruptedArg, runningArg].map(Number);
  // Before custody loads: its state store binds fsync when it does.
  const fsyncs = countFsyncs();
  const { backend } = await import('../dist/backend/index.js');
  const custody = await import('../dist/index.js');
  const { StateStore } = await import('../dist/state/store.js');
  const actual = custody.capabilities().backend;
  if (actual !== process.env.CUSTODY_BACKEND)
    throw new Error(
      `asked for the ${process.env.CUSTODY_BACKEND} backend, custody loaded ${actual}: ${custody.capabilities().reason}`,
    );
  const profile = profileBackend(backend);

  // Untimed: the state the measurement starts from, through the store (which
  // holds the state dir's lock until it is closed, before open() below).
  const store = await StateStore.open(stateDir, { emit: () => {}, create: false });
  const { running } = await keepOnlyRunning(store);
  if (running !== expectRunning)
    throw new Error(`the state dir holds ${running} running manifests, not ${expectRunning}`);
  // Every manifest left is a running one.
  const template = store.read(store.ids()[0]);
  const gone = deadSupervisor((await import('../dist/process/proc.js')).parseImage);
  const now = new Date().toISOString();
  for (let k = 0; k < interrupted; k++) {
    const token = randomBytes(16).toString('hex');
    await store.write({
      ...template,
      id: `interrupted-${k}`,
      token,
      state: 'starting',
      identity: null,
      args: template.args.map((a) => a.split(template.token).join(token)),
      supervisorPid: gone.pid,
      forkImage: gone.image,
      createdAt: now,
      updatedAt: now,
      quarantine: null,
    });
  }
  store.close();
  globalThis.gc?.();

  const events = {};
  let firstEvent = null;
  const onEvent = (e) => {
    events[e.type] = (events[e.type] ?? 0) + 1;
    firstEvent ??= performance.now();
  };
  const callsBefore = profile.snapshot();
  const fsyncsBefore = fsyncs.count();
  const t0 = performance.now();
  const { supervisor, report: rep } = await custody.Supervisor.open({ stateDir, onEvent });
  const openMs = performance.now() - t0;
  const fsyncCount = fsyncs.count() - fsyncsBefore;
  const calls = diffCalls(callsBefore, profile.snapshot());
  const statuses = {};
  for (const i of supervisor.list()) statuses[i.status] = (statuses[i.status] ?? 0) + 1;
  // Every thread's CPU time (the collector's too) over idle windows, each as a share of one CPU.
  const idleCpu = [];
  if (expectRunning >= GOAL_RUNNING) {
    for (let w = 0; w < 2; w++) {
      const from = process.cpuUsage();
      const t = performance.now();
      await new Promise((resolve) => setTimeout(resolve, IDLE_WINDOW_MS));
      const used = process.cpuUsage(from);
      idleCpu.push((used.user + used.system) / 1000 / (performance.now() - t));
    }
  }
  await supervisor.close();

  const counts = {
    adopted: rep.adopted.length,
    repaired: rep.repaired.length,
    cleaned: rep.cleaned.length,
    quarantined: rep.quarantined.length,
  };
  let problem = null;
  if (counts.adopted !== expectRunning || counts.cleaned !== interrupted || counts.repaired || counts.quarantined) {
    const q = rep.quarantined.slice(0, 3).map((e) => `${e.id}: ${e.reason}${e.field ? ` (${e.field})` : ''}`);
    problem = `recovery reported ${JSON.stringify(counts)}, expected ${expectRunning} adopted and ${interrupted} cleaned${q.length ? `; ${q.join('; ')}` : ''}`;
  }
  // One full scan, for scale, after the measurement.
  const s0 = performance.now();
  const listed = (await backend.listProcesses()).length;
  const scanMs = performance.now() - s0;
  const out = {
    backend: actual,
    openMs,
    counts,
    statuses,
    problem,
    calls,
    fsyncs: fsyncCount,
    events,
    firstEventMs: firstEvent === null ? null : firstEvent - t0,
    idleCpu,
    scanMs,
    listed,
  };
  process.stdout.write(`${JSON.stringify(out)}\n`, () => process.exit(0));
}

function diffCalls(before, after) {
  const out = {};
  for (const [k, v] of Object.entries(after)) {
    const b = before[k] ?? { calls: 0, nested: 0, ms: 0 };
    if (v.calls > b.calls) out[k] = { calls: v.calls - b.calls, nested: v.nested - b.nested, ms: v.ms - b.ms };
  }
  return out;
}

// ---- holder side ----

/**
 * Holder side: on each { grow: N } line, launch until N instances run (one
 * Supervisor per request, closed before answering so the workers can take
 * the state dir) and answer { running, pids, ms, backend }. On EOF of stdin
 * or SIGINT/SIGTERM: SIGKILL every idle process by pid, wait until each is
 * reaped (by custody, which reaps the children it spawned even after its
 * supervisor closed), answer { stopped, reaped, leftover } and exit.
 */
async function holder([stateDir, idleBin, marker]) {
  const custody = await import('../dist/index.js');
  const { StateStore } = await import('../dist/state/store.js');
  const backendName = custody.capabilities().backend;
  const pids = [];
  let ending = null;
  // The request being served: ending waits for it, so no launch in flight escapes the kill.
  let growing = Promise.resolve();
  const end = () =>
    (ending ??= (async () => {
      await growing;
      const t0 = performance.now();
      // In batches: thousands of tasks made runnable at once would show in
      // the load average for a minute, as if the machine had been busy.
      let reaped = 0;
      for (let i = 0; i < pids.length; i += 100) {
        const batch = pids.slice(i, i + 100);
        killMarked(batch, marker);
        reaped += await waitGone(batch, 20_000);
      }
      const leftover = childrenOf(process.pid).length;
      process.stdout.write(
        `${JSON.stringify({ stopped: pids.length, reaped, leftover, stopMs: performance.now() - t0 })}\n`,
        () => process.exit(0),
      );
      // Until the write's callback exits: nothing else runs.
      await new Promise(() => {});
    })());
  process.once('SIGINT', end);
  process.once('SIGTERM', end);

  const grow = async (n) => {
    const t0 = performance.now();
    const store = await StateStore.open(stateDir, { emit: () => {} });
    await keepOnlyRunning(store);
    store.close();
    const { supervisor } = await custody.Supervisor.open({ stateDir, onEvent: () => {} });
    const fresh = [];
    let started = pids.length;
    try {
      const lane = async () => {
        while (started < n && !ending) {
          const id = `running-${started++}-${randomBytes(4).toString('hex')}`;
          const inst = await supervisor.launch({
            id,
            command: idleBin,
            args: (token) => [IDLE_SECONDS, marker, token],
          });
          fresh.push(inst.pid);
        }
      };
      await Promise.all(Array.from({ length: LAUNCH_CONCURRENCY }, lane));
    } finally {
      pids.push(...fresh);
      await supervisor.close();
    }
    return { running: pids.length, pids: fresh, ms: performance.now() - t0, backend: backendName };
  };

  const lines = createInterface({ input: process.stdin });
  lines.on('close', end);
  for await (const line of lines) {
    if (ending) break;
    const request = JSON.parse(line);
    const serving = grow(request.grow);
    growing = serving.catch(() => {});
    let answer;
    try {
      answer = await serving;
    } catch (err) {
      answer = { error: String(err?.stack ?? err) };
    }
    process.stdout.write(`${JSON.stringify(answer)}\n`);
  }
  await end();
}

/** Waits until every pid is gone from /proc (reaped), at most `ms`; returns how many are. */
async function waitGone(pids, ms) {
  const deadline = performance.now() + ms;
  const alive = (p) => {
    try {
      readFileSync(`/proc/${p}/stat`);
      return true;
    } catch {
      return false;
    }
  };
  let left = pids.filter(alive);
  while (left.length > 0 && performance.now() < deadline) {
    await new Promise((r) => setTimeout(r, 5));
    left = left.filter(alive);
  }
  return pids.length - left.length;
}

await runAsScript(import.meta.url, { run, report, worker, holder, options: sizesOption });
