// memory: what a supervised process costs custody in memory, and whether
// anything accumulates over many launch/stop cycles.
//
//   node bench/memory.js [--quick]          standalone: prints the tables
//   import { run, report } from './memory.js'   for bench/run.js
//
// Part 1, per process: N idle children (bench/c/idle.c) started and kept,
// each as a spawn() handle, on custody native and js, beside
// child_process.spawn; and N instances launched and tracked by a Supervisor
// (state dir on tmpfs). JS heap, RSS and external memory are read with
// process.memoryUsage() after global.gc(), before and after; the difference
// over N is the cost per process. Then every child is killed and reaped and
// the heap read again. That is done twice. The first round also pays what
// is paid once (code compiled and optimized, tables grown to size: ~600 KiB
// for a Supervisor, 2 KiB per instance at the quick run's 300), so the cost
// per process is the last round's, the first's shown beside it; what the
// first round keeps is that one-time part, and what a later round keeps,
// per process, is what would leak.
//
// Part 2, growth: a Supervisor on a tmpfs state dir (/dev/shm, so fsync is
// cheap and the loop is custody's own work) launches and stops a
// short-lived process (idle 30 <marker> <token>) C times, each with a new
// id, after W unmeasured warm-up cycles of the same (V8 goes on compiling
// and optimizing this loop's code for its first ~10 000 cycles: +118 KiB
// of code and its metadata from cycle 3 000 to 9 000 in heap snapshots,
// with every object count flat; that is not retention). Heap, RSS and fds
// are read (after gc) at the start and every C/10 cycles. The least-squares
// slope of the heap over the second half of the run says whether it grows.
// Idle children carry a marker the parent sweeps by afterwards.
//
// Every measurement runs in its own worker (node --expose-gc, ulimit -n 65536):
//   node bench/memory.js --worker hold <native|js|child_process|supervisor-native|supervisor-js> <idle bin> <marker> <n> <rounds> <state dir>
//   node bench/memory.js --worker cycles <native|js> <idle bin> <marker> <cycles> <every> <warm-up> <state dir>
import { spawn as cpSpawn } from 'node:child_process';
import { mkdtempSync, readdirSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { buildC, formatTable, formatTargets, isMain } from './lib.js';
import {
  childrenOf,
  cpuTicks,
  fdCount,
  newMarker,
  noiseLine,
  otherCpuShare,
  runWorkerNofile,
  sweepMarker,
} from './procs.js';

export const name = 'memory';

// Under 2 KiB of JS heap per supervised process: a native spawn() handle,
// and a Supervisor instance (its handle, manifest and table entry) on
// either backend.
const NATIVE_HEAP_PER_PROCESS_MAX = 2048;
const SUPERVISOR_HEAP_PER_INSTANCE_MAX = 2048;
// "Grows": more than this many heap bytes per cycle over the run, and more
// than GROWTH_MIN_BYTES in all (a full gc leaves ~100 KiB of jitter).
const GROWTH_SLOPE_MAX = 16;
const GROWTH_MIN_BYTES = 256 * 1024;

// Quick: 300 held, 600 cycles (~8 s in all); full: 5 000 held, 10 000
// cycles after 10 000 of warm-up (~4 min on a 2-CPU VM: ~3 ms per
// supervised launch, ~0.7 ms per native launch+stop on tmpfs, ~3 ms on js).
const PARAMS = {
  quick: { hold: 300, holdRounds: 2, cycles: 600, warmup: 300, every: 50, printEvery: 200 },
  full: { hold: 5000, holdRounds: 2, cycles: 10000, warmup: 10000, every: 1000, printEvery: 2000 },
};

const HOLD_VARIANTS = [
  { key: 'native', label: 'spawn() handle, custody native', env: { CUSTODY_BACKEND: 'native' } },
  { key: 'js', label: 'spawn() handle, custody js', env: { CUSTODY_BACKEND: 'js' } },
  { key: 'child_process', label: 'child_process.spawn (reference)', env: {} },
  { key: 'supervisor-native', label: 'Supervisor instance, native', env: { CUSTODY_BACKEND: 'native' } },
  { key: 'supervisor-js', label: 'Supervisor instance, js', env: { CUSTODY_BACKEND: 'js' } },
];
const CYCLE_BACKENDS = ['native', 'js'];

function tmpfsDir(what) {
  // tmpfs where there is one; the bench's numbers are about custody, not the disk.
  let base = '/dev/shm';
  try {
    readdirSync(base);
  } catch {
    base = os.tmpdir();
  }
  return mkdtempSync(join(base, `custody-bench-${what}-`));
}

/** Measures every variant, one at a time, and returns the results. */
export async function run({ quick = false } = {}) {
  const params = PARAMS[quick ? 'quick' : 'full'];
  const idleBin = buildC('idle');
  const timeoutMs = 120_000 + params.hold * params.holdRounds * 20 + (params.warmup + params.cycles) * 20;
  const self = fileURLToPath(import.meta.url);
  const loadBefore = os.loadavg();
  const cpuBefore = cpuTicks();
  let escaped = 0;
  let leftover = 0;

  const hold = {};
  for (const v of HOLD_VARIANTS) {
    const marker = newMarker('memory');
    const dir = tmpfsDir('memory');
    try {
      hold[v.key] = {
        label: v.label,
        ...(await runWorkerNofile(self, ['hold', v.key, idleBin, marker, params.hold, params.holdRounds, dir], {
          env: v.env,
          timeoutMs,
        })),
      };
    } finally {
      escaped += sweepMarker(marker);
      rmSync(dir, { recursive: true, force: true });
    }
    leftover += hold[v.key].leftoverChildren;
  }

  const cycles = {};
  for (const backend of CYCLE_BACKENDS) {
    const dir = tmpfsDir('cycles');
    const marker = newMarker('cycles');
    try {
      const args = ['cycles', backend, idleBin, marker, params.cycles, params.every, params.warmup, dir];
      const res = await runWorkerNofile(self, args, {
        env: { CUSTODY_BACKEND: backend },
        timeoutMs,
      });
      cycles[backend] = { ...res, ...growth(res.checkpoints, params.cycles) };
      leftover += res.leftoverChildren;
    } finally {
      escaped += sweepMarker(marker);
      rmSync(dir, { recursive: true, force: true });
    }
  }
  leftover += childrenOf(process.pid).length;

  // The last round's: the first also pays for what is paid once (see the top).
  const nativeHeap = hold.native.perProcess.heapUsed;
  const targets = [
    {
      id: 'nativeHeapPerProcess',
      description: 'native JS heap per spawn() handle',
      value: nativeHeap,
      unit: 'B',
      op: '<=',
      limit: NATIVE_HEAP_PER_PROCESS_MAX,
      met: nativeHeap <= NATIVE_HEAP_PER_PROCESS_MAX,
    },
    ...['native', 'js'].map((b) => {
      const heap = hold[`supervisor-${b}`].perProcess.heapUsed;
      return {
        id: `supervisorHeapPerInstance.${b}`,
        description: `${b} JS heap per Supervisor instance (${params.hold.toLocaleString('en-US')} held)`,
        value: heap,
        unit: 'B',
        op: '<',
        limit: SUPERVISOR_HEAP_PER_INSTANCE_MAX,
        met: heap < SUPERVISOR_HEAP_PER_INSTANCE_MAX,
      };
    }),
    ...CYCLE_BACKENDS.map((b) => ({
      id: `noGrowth.${b}`,
      description: `${b}: heap flat over ${params.cycles.toLocaleString('en-US')} launch/stop cycles (2nd-half slope, or total growth)`,
      value: cycles[b].slopeBytesPerCycle,
      unit: 'B/cycle',
      shown: `${cycles[b].slopeBytesPerCycle.toFixed(1)} B/cycle, ${kib(cycles[b].heapGrowthBytes)} in all`,
      op: '<=',
      limit: GROWTH_SLOPE_MAX,
      shownLimit: `<= ${GROWTH_SLOPE_MAX} B/cycle or <= ${GROWTH_MIN_BYTES / 1024} KiB`,
      met: !cycles[b].grows,
    })),
  ];
  const round2 = (xs) => xs.map((x) => Math.round(x * 100) / 100);
  return {
    name,
    quick,
    params: { ...params, idle: 'bench/c/idle.c', stateDir: 'tmpfs (/dev/shm)' },
    hold,
    cycles,
    targets,
    leftoverProcesses: leftover + escaped,
    loadavg: { before: round2(loadBefore), after: round2(os.loadavg()) },
    otherCpu: otherCpuShare(cpuBefore, cpuTicks(), os.cpus().length),
  };
}

/** Least-squares slope of `field` over cycles for the given checkpoints. */
function slope(pts, field) {
  const n = pts.length;
  if (n < 2) return 0;
  const mx = pts.reduce((s, p) => s + p.cycle, 0) / n;
  const my = pts.reduce((s, p) => s + p[field], 0) / n;
  let sxy = 0;
  let sxx = 0;
  for (const p of pts) {
    sxy += (p.cycle - mx) * (p[field] - my);
    sxx += (p.cycle - mx) ** 2;
  }
  return sxx > 0 ? sxy / sxx : 0;
}

/**
 * Whether the heap grows: the slope over the second half of the run (what
 * is left of the warm-up, tables that grow to their working size, decays
 * in the first), and the growth from the first checkpoint after the start
 * to the last.
 */
function growth(checkpoints, cycles) {
  const late = checkpoints.filter((p) => p.cycle >= cycles / 2);
  const first = checkpoints[1];
  const last = checkpoints[checkpoints.length - 1];
  const slopeBytesPerCycle = slope(late, 'heapUsed');
  const heapGrowthBytes = last.heapUsed - first.heapUsed;
  return {
    slopeBytesPerCycle,
    rssSlopeBytesPerCycle: slope(late, 'rss'),
    heapGrowthBytes,
    rssGrowthBytes: last.rss - first.rss,
    grows: slopeBytesPerCycle > GROWTH_SLOPE_MAX && heapGrowthBytes > GROWTH_MIN_BYTES,
  };
}

const kib = (b) => (Number.isFinite(b) ? `${(b / 1024).toFixed(b < 10 * 1024 && b > -10 * 1024 ? 2 : 0)} KiB` : 'n/a');
const mib = (b) => (Number.isFinite(b) ? `${(b / 2 ** 20).toFixed(1)}` : 'n/a');
const bytes = (b) => (Number.isFinite(b) ? Math.round(b).toLocaleString('en-US') : 'n/a');

/** The results as printable tables. */
export function report(results) {
  const { params, hold, cycles, targets, quick, leftoverProcesses, loadavg, otherCpu } = results;
  const n = params.hold.toLocaleString('en-US');
  const holdRows = HOLD_VARIANTS.map(({ key }) => {
    const h = hold[key];
    return [
      h.label,
      bytes(h.perProcess.heapUsed),
      bytes(h.firstRound.heapUsed),
      bytes(h.perProcess.rss),
      bytes(h.perProcess.external),
      bytes(h.perProcess.fds),
      bytes(h.perProcess.msToStart * 1000),
      kib(h.retainedFirst.heapUsed),
      h.leakPerProcess ? bytes(h.leakPerProcess.heapUsed) : 'n/a',
    ];
  });
  const cycleRows = [];
  for (const b of CYCLE_BACKENDS) {
    for (const p of cycles[b].checkpoints) {
      if (p.cycle % params.printEvery !== 0) continue;
      cycleRows.push([
        b,
        p.cycle.toLocaleString('en-US'),
        mib(p.heapUsed),
        mib(p.heapTotal),
        mib(p.rss),
        mib(p.external),
        p.fds,
        p.children,
        p.stateEntries,
        p.tracked,
      ]);
    }
  }
  const verdicts = CYCLE_BACKENDS.map((b) => {
    const c = cycles[b];
    const sign = (x) => (x >= 0 ? '+' : '');
    return (
      `  ${b}: ${c.msPerCycle.toFixed(2)} ms per launch+stop; from cycle ${c.checkpoints[1].cycle.toLocaleString('en-US')} to ${c.checkpoints.at(-1).cycle.toLocaleString('en-US')}` +
      ` heap ${sign(c.heapGrowthBytes)}${kib(c.heapGrowthBytes)}, rss ${sign(c.rssGrowthBytes)}${kib(c.rssGrowthBytes)};` +
      ` second half: heap ${c.slopeBytesPerCycle.toFixed(1)} B/cycle, rss ${c.rssSlopeBytesPerCycle.toFixed(0)} B/cycle -> heap ${c.grows ? 'GROWS' : 'flat'}`
    );
  });
  const lines = [
    `memory: per supervised process, ${n} idle children held (bench/c/idle.c), ${params.holdRounds} rounds;` +
      ` bytes per process from process.memoryUsage() after gc, round ${params.holdRounds}` +
      ` (round 1 also pays what is paid once)${quick ? ' (quick)' : ''}`,
    formatTable(
      [
        'variant',
        'heap B',
        'heap B, round 1',
        'rss B',
        'external B',
        'fds',
        'us to start',
        'heap kept by round 1',
        `heap kept/process, round ${params.holdRounds}`,
      ],
      holdRows,
    ),
    '',
    `  growth: ${params.cycles.toLocaleString('en-US')} Supervisor launch+stop cycles after ${params.warmup.toLocaleString('en-US')} unmeasured ones, a new id each (idle 30 <marker> <token>, state on ${params.stateDir}), read after gc`,
    formatTable(
      [
        'backend',
        'cycle',
        'heap MiB',
        'heap total',
        'rss MiB',
        'external',
        'fds',
        'children',
        'state entries',
        'tracked',
      ],
      cycleRows,
    ),
    ...verdicts,
    '',
    formatTargets(
      targets.map((t) => ({
        ...t,
        shown: t.shown ?? `${t.value.toFixed(0)} ${t.unit}`,
        shownLimit: t.shownLimit ?? `${t.op} ${t.limit} ${t.unit}`,
      })),
      { quick },
    ),
    '',
    `  leftover processes after the run: ${leftoverProcesses}`,
    noiseLine(otherCpu, loadavg),
  ];
  return lines.join('\n');
}

// ---- worker side ----

function settle() {
  return new Promise((resolve) => setImmediate(resolve));
}

async function measured() {
  // Twice: the first may only finalize what the second frees.
  await settle();
  globalThis.gc();
  await settle();
  globalThis.gc();
  const m = process.memoryUsage();
  return {
    heapUsed: m.heapUsed,
    heapTotal: m.heapTotal,
    rss: m.rss,
    external: m.external,
    arrayBuffers: m.arrayBuffers,
    fds: fdCount(),
  };
}

async function loadCustody(backend) {
  const custody = await import('../dist/index.js');
  const actual = custody.capabilities().backend;
  if (actual !== backend)
    throw new Error(`asked for the ${backend} backend, custody loaded ${actual}: ${custody.capabilities().reason}`);
  return custody;
}

async function holdWorker([variant, idleBin, marker, nArg, roundsArg, stateDir]) {
  if (typeof globalThis.gc !== 'function') throw new Error('run with --expose-gc');
  const [n, rounds] = [nArg, roundsArg].map(Number);
  const idleArgs = (extra) => ['3600', marker, ...extra];
  let start;
  let stop;
  let close = async () => {};
  if (variant === 'child_process') {
    const kids = [];
    start = () => {
      for (let i = 0; i < n; i++) {
        const c = cpSpawn(idleBin, idleArgs([]), { stdio: 'ignore' });
        c.once('error', (err) => {
          throw err;
        });
        c.ended = new Promise((resolve) => c.once('exit', resolve));
        kids.push(c);
      }
    };
    stop = async () => {
      for (const c of kids) c.kill('SIGKILL');
      await Promise.all(kids.map((c) => c.ended));
      kids.length = 0;
    };
  } else if (variant === 'native' || variant === 'js') {
    const custody = await loadCustody(variant);
    const handles = [];
    start = () => {
      for (let i = 0; i < n; i++) handles.push(custody.spawn(idleBin, idleArgs([]), { stdio: 'ignore' }));
    };
    stop = async () => {
      for (const h of handles) h.signal('SIGKILL');
      await Promise.all(handles.map((h) => h.exited));
      for (const h of handles) h.close();
      handles.length = 0;
    };
  } else if (variant === 'supervisor-native' || variant === 'supervisor-js') {
    const custody = await loadCustody(variant.slice('supervisor-'.length));
    const { supervisor } = await custody.Supervisor.open({ stateDir: join(stateDir, 'state'), onEvent: () => {} });
    const ids = [];
    let round = 0;
    start = async () => {
      round++;
      for (let i = 0; i < n; i++) {
        const id = `r${round}-${i}`;
        await supervisor.launch({ id, command: idleBin, args: (token) => idleArgs([token]) });
        ids.push(id);
      }
    };
    stop = async () => {
      // Stopped together: SIGTERM ends idle at once.
      const results = await Promise.all(ids.map((id) => supervisor.stop(id, { graceMs: 5000 })));
      if (results.some((r) => r.outcome !== 'exited')) throw new Error('an instance was gone before stop');
      ids.length = 0;
    };
    close = () => supervisor.close();
  } else {
    throw new Error(`unknown variant ${variant}`);
  }
  // Round 1 gives the cost per process; each later round starts from where
  // the one before ended, so what its end keeps over its start is a leak.
  const out = [];
  try {
    for (let r = 0; r < rounds; r++) {
      const before = await measured();
      const t0 = performance.now();
      let after;
      try {
        await start();
        const msToStart = performance.now() - t0;
        after = { ...(await measured()), msToStart };
      } finally {
        await stop();
      }
      const end = await measured();
      out.push({ before, after, end });
    }
  } finally {
    await close();
  }
  const last = out[out.length - 1];
  const perRound = ({ before, after }) => {
    const per = (k) => (after[k] - before[k]) / n;
    return {
      heapUsed: per('heapUsed'),
      heapTotal: per('heapTotal'),
      rss: per('rss'),
      external: per('external'),
      arrayBuffers: per('arrayBuffers'),
      fds: per('fds'),
      msToStart: after.msToStart / n,
    };
  };
  const { before } = out[0];
  const leftoverChildren = childrenOf(process.pid).length;
  process.stdout.write(
    `${JSON.stringify({
      variant,
      n,
      rounds: out,
      // The last round's cost: the first also pays what is paid once.
      perProcess: perRound(last),
      firstRound: perRound(out[0]),
      // After the first round: what the first round kept (tables grown to
      // size, compiled code) and, per process, what a later round kept.
      retainedFirst: { heapUsed: out[0].end.heapUsed - before.heapUsed, fds: out[0].end.fds - before.fds },
      leakPerProcess:
        rounds > 1
          ? { heapUsed: (last.end.heapUsed - last.before.heapUsed) / n, fds: (last.end.fds - last.before.fds) / n }
          : null,
      leftoverChildren,
    })}\n`,
  );
}

async function cyclesWorker([backend, idleBin, marker, cyclesArg, everyArg, warmupArg, stateDirBase]) {
  if (typeof globalThis.gc !== 'function') throw new Error('run with --expose-gc');
  const [cycles, every, warmup] = [cyclesArg, everyArg, warmupArg].map(Number);
  const custody = await loadCustody(backend);
  const stateDir = join(stateDirBase, 'state');
  const { supervisor } = await custody.Supervisor.open({ stateDir, onEvent: () => {} });
  const checkpoints = [];
  const checkpoint = async (cycle) => {
    const m = await measured();
    checkpoints.push({
      cycle,
      ...m,
      children: childrenOf(process.pid).length,
      stateEntries: readdirSync(stateDir).length,
      tracked: supervisor.list().length,
    });
  };
  const cycle = async (id) => {
    await supervisor.launch({ id, command: idleBin, args: (token) => ['30', marker, token] });
    const r = await supervisor.stop(id, { graceMs: 5000 });
    if (r.outcome !== 'exited' || r.escalated) throw new Error(`cycle ${id}: stop gave ${JSON.stringify(r)}`);
  };
  let t0 = 0;
  try {
    for (let i = 1; i <= warmup; i++) await cycle(`w${i}`);
    await checkpoint(0);
    t0 = performance.now();
    for (let i = 1; i <= cycles; i++) {
      await cycle(`c${i}`);
      if (i % every === 0) await checkpoint(i);
    }
  } finally {
    await supervisor.close();
  }
  const elapsed = performance.now() - t0;
  // The checkpoints' gc and scans are not the cycles' cost.
  const msPerCycle = elapsed / cycles;
  process.stdout.write(
    `${JSON.stringify({ backend, cycles, every, msPerCycle, checkpoints, leftoverChildren: childrenOf(process.pid).length })}\n`,
  );
}

if (isMain(import.meta.url)) {
  const argv = process.argv.slice(2);
  if (argv[0] === '--worker') {
    if (argv[1] === 'hold') await holdWorker(argv.slice(2));
    else if (argv[1] === 'cycles') await cyclesWorker(argv.slice(2));
    else throw new Error(`unknown worker ${argv[1]}`);
  } else {
    const results = await run({ quick: argv.includes('--quick') });
    console.log(report(results));
  }
}
