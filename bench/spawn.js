// spawn: spawn + reap throughput of /bin/true, in spawns per second, for
// custody's native and js backends against child_process.spawn, execa,
// Bun.spawn (Bun's own posix_spawn, run by Bun as a peer runtime; see
// bench/bun.js) and the C limit (bench/c/spawn.c: vfork and
// clone3(CLONE_PIDFD | CLONE_VM | CLONE_VFORK) loops with no JavaScript).
//
//   node bench/spawn.js [--quick]            standalone: prints the table
//   import { run, report } from './spawn.js'   for bench/run.js
//
// Two modes: sequential (start one, await its exit, start the next) and 32
// concurrent (32 lanes, each starting the next child as soon as its last one
// exited). Each round starts children for a fixed time, then waits for the
// ones in flight; its rate is children reaped / elapsed time, and the table
// shows the median of the rounds.
//
// Every Node variant also runs with a big parent: a 2 GiB heap (512 MiB in
// quick mode) of Buffers, every page written so it is resident. A fork copies
// the parent's page tables, so its cost grows with the heap; a CLONE_VM |
// CLONE_VFORK spawn does not. Every variant runs in its own child process:
// custody picks its backend from CUSTODY_BACKEND when it loads, and a big heap
// must not slow anything but the variant it belongs to. The Bun variant is
// this same worker, with the same loop, run by Bun instead of Node; where
// Bun cannot be fetched or run, it is skipped with a note saying why.
//   node bench/spawn.js --worker <native|js|child_process|execa> <heap MiB> <round ms> <rounds> <warmup ms> <concurrency>...
//   bun bench/spawn.js --worker bun <heap MiB> <round ms> <rounds> <warmup ms> <concurrency>...
// prints one JSON line with the rates for each concurrency.
import { spawn as cpSpawn } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import os from 'node:os';
import { fileURLToPath } from 'node:url';
import { bunEnv, findBun } from './bun.js';
import { buildC, formatRatio, formatTable, formatTargets, runAsScript, runJson, runWorker, summarize } from './lib.js';

export const name = 'spawn';

const COMMAND = '/bin/true';

// native >= 2.5 x child_process: otherwise the addon's spawn is not worth it.
const NATIVE_OVER_CHILD_PROCESS_MIN = 2.5;
// native >= 0.8 x the C limit: the JavaScript around clone may cost 20%.
const NATIVE_OVER_C_MIN = 0.8;
// native with a big heap >= 0.9 x native with a small one: CLONE_VM means
// the heap is not copied, so it must not matter.
const NATIVE_BIG_OVER_SMALL_MIN = 0.9;
// native >= 1.0 x Bun.spawn: a Node library should not spawn slower than the
// runtime that made spawn speed its point.
const NATIVE_OVER_BUN_MIN = 1.0;

// On a 2-CPU VM: /bin/true costs ~0.5 ms per spawn from C, a fork of a 2 GiB
// parent ~70 ms. Rounds are timed, not counted, so a slow variant still gets
// a bounded run (~10 spawns per round at worst). The machine may be shared,
// so a full run measures every variant in two passes, one after the other,
// and pools their rounds: a burst of someone else's work then lands on
// rounds of several variants instead of all rounds of one. Quick is ~20 s in
// all, full ~2.5 min.
const PARAMS = {
  quick: { passes: 1, roundMs: 200, rounds: 3, warmupMs: 100, bigHeapMiB: 512 },
  full: { passes: 2, roundMs: 600, rounds: 4, warmupMs: 300, bigHeapMiB: 2048 },
};

const CONCURRENCY = 32;
const MODES = [
  { key: 'seq', label: 'sequential', concurrency: 1 },
  { key: 'conc', label: `${CONCURRENCY} concurrent`, concurrency: CONCURRENCY },
];

// Node variants, each measured with a small and a big heap, in both modes.
const NODE_VARIANTS = [
  { key: 'native', label: 'custody native', env: { CUSTODY_BACKEND: 'native' } },
  { key: 'js', label: 'custody js', env: { CUSTODY_BACKEND: 'js' } },
  { key: 'child_process', label: 'child_process.spawn', env: {} },
  { key: 'execa', label: 'execa', env: {} },
];
// Run by Bun, not Node: the same worker, its spawner Bun.spawn.
const BUN_VARIANT = { key: 'bun', label: 'Bun.spawn' };

// C loops. The first two, with a small heap and in both modes, are the C
// limit; the rest are references (sequential only): the same kernel paths
// with a big heap, and fork, which is what libuv (so child_process, execa and
// custody js) does.
const C_RUNS = [
  { key: 'c-vfork', method: 'vfork', label: 'C vfork', big: false, modes: ['seq', 'conc'] },
  { key: 'c-clone3', method: 'clone3', label: 'C clone3 (pidfd, vm, vfork)', big: false, modes: ['seq', 'conc'] },
  { key: 'c-clone3', method: 'clone3', label: 'C clone3 (pidfd, vm, vfork)', big: true, modes: ['seq'] },
  { key: 'c-fork', method: 'fork', label: 'C fork (reference)', big: false, modes: ['seq'] },
  { key: 'c-fork', method: 'fork', label: 'C fork (reference)', big: true, modes: ['seq'] },
];

const heapKey = (big) => (big ? 'big' : 'small');

/** Measures every variant, one at a time, and returns the results. */
export async function run({ quick = false } = {}) {
  const params = PARAMS[quick ? 'quick' : 'full'];
  const { passes, roundMs, rounds, warmupMs, bigHeapMiB } = params;
  // Generous: a round overruns its time by at most the in-flight children,
  // and touching a 2 GiB heap on a cold VM can take several seconds.
  const perModeMs = warmupMs + rounds * roundMs;
  const timeoutMs = 60_000 + 4 * MODES.length * perModeMs;
  const cBin = buildC('spawn');
  // Fetched (or found in the cache) before anything is timed.
  const bun = findBun();
  const loadBefore = os.loadavg();
  const cpuBefore = cpuTicks();

  // Per-round rates and counts, pooled over the passes:
  // raw[key][heap][mode] = { rates, counts, syscall? }
  const raw = {};
  const labels = {};
  const rss = {};
  const add = (key, label, big, mode, rates, counts, extra = {}) => {
    labels[key] = label;
    const slot = (((raw[key] ??= {})[heapKey(big)] ??= {})[mode] ??= { rates: [], counts: [] });
    slot.rates.push(...rates);
    slot.counts.push(...counts);
    Object.assign(slot, extra);
  };

  // One variant at a time: on a 2-CPU machine running them together would
  // measure contention, not spawn.
  let leftover = 0;
  for (let pass = 0; pass < passes; pass++) {
    for (const c of C_RUNS) {
      for (const mode of c.modes) {
        const { concurrency } = MODES.find((m) => m.key === mode);
        const res = await runJson(
          cBin,
          [c.method, concurrency, roundMs, rounds, warmupMs, c.big ? bigHeapMiB : 0].map(String),
          { timeoutMs },
        );
        add(c.key, c.label, c.big, mode, res.rounds_per_s, res.counts, { syscall: res.syscall });
        (rss[c.key] ??= {})[heapKey(c.big)] = Math.round(res.rss_kib / 1024);
      }
    }
    for (const v of NODE_VARIANTS) {
      for (const big of [false, true]) {
        const res = await runWorker(
          fileURLToPath(import.meta.url),
          [v.key, big ? bigHeapMiB : 0, roundMs, rounds, warmupMs, ...MODES.map((m) => m.concurrency)],
          { env: v.env, timeoutMs, execArgv: ['--expose-gc'] },
        );
        for (const m of MODES) {
          const r = res.modes[String(m.concurrency)];
          add(v.key, v.label, big, m.key, r.rounds_per_s, r.counts);
        }
        (rss[v.key] ??= {})[heapKey(big)] = Math.round(res.rssBytes / 2 ** 20);
        leftover += res.leftoverChildren;
      }
    }
    if (bun.skip) continue;
    for (const big of [false, true]) {
      const res = await runJson(
        bun.path,
        [
          fileURLToPath(import.meta.url),
          '--worker',
          BUN_VARIANT.key,
          big ? bigHeapMiB : 0,
          roundMs,
          rounds,
          warmupMs,
          ...MODES.map((m) => m.concurrency),
        ].map(String),
        { env: bunEnv(), timeoutMs },
      );
      for (const m of MODES) {
        const r = res.modes[String(m.concurrency)];
        add(BUN_VARIANT.key, `${BUN_VARIANT.label} (Bun ${bun.version})`, big, m.key, r.rounds_per_s, r.counts);
      }
      (rss[BUN_VARIANT.key] ??= {})[heapKey(big)] = Math.round(res.rssBytes / 2 ** 20);
      leftover += res.leftoverChildren;
    }
  }
  // variants[key][heap][mode] = median, min, max and rounds of spawns/s
  const variants = {};
  for (const [key, heaps] of Object.entries(raw)) {
    for (const [heap, modes] of Object.entries(heaps)) {
      for (const [mode, { rates, ...rest }] of Object.entries(modes)) {
        ((variants[key] ??= {})[heap] ??= {})[mode] = { ...summarize(rates), ...rest };
      }
    }
  }
  // The workers have exited; nothing they or the C loops started may remain
  // a child of ours either.
  leftover += childrenOf(process.pid).length;
  const round2 = (xs) => xs.map((x) => Math.round(x * 100) / 100);
  const loadavg = { before: round2(loadBefore), after: round2(os.loadavg()) };
  const otherCpu = otherCpuShare(cpuBefore, cpuTicks());

  const rate = (key, heap, mode) => variants[key]?.[heap]?.[mode]?.median ?? NaN;
  const ratios = {};
  const cLimit = {};
  const targets = [];
  for (const { key: mode, label } of MODES) {
    const vfork = rate('c-vfork', 'small', mode);
    const clone3 = rate('c-clone3', 'small', mode);
    cLimit[mode] = vfork >= clone3 ? { variant: 'c-vfork', rate: vfork } : { variant: 'c-clone3', rate: clone3 };
    const native = rate('native', 'small', mode);
    const r = {
      nativeOverChildProcess: native / rate('child_process', 'small', mode),
      nativeOverCLimit: native / cLimit[mode].rate,
      nativeBigOverSmall: rate('native', 'big', mode) / native,
      // Context, not targets.
      jsOverChildProcess: rate('js', 'small', mode) / rate('child_process', 'small', mode),
      execaOverChildProcess: rate('execa', 'small', mode) / rate('child_process', 'small', mode),
      childProcessBigOverSmall: rate('child_process', 'big', mode) / rate('child_process', 'small', mode),
      nativeOverChildProcessBigHeap: rate('native', 'big', mode) / rate('child_process', 'big', mode),
      nativeOverBun: rate('native', 'small', mode) / rate('bun', 'small', mode),
      // The ceiling of the child_process target: C doing the kernel work
      // custody does (clone3 with a pidfd from birth) and the bare vfork loop.
      cClone3OverChildProcess: clone3 / rate('child_process', 'small', mode),
      cVforkOverChildProcess: vfork / rate('child_process', 'small', mode),
    };
    ratios[mode] = r;
    const heapName = formatMiB(bigHeapMiB);
    targets.push(
      {
        ...target(
          `nativeOverChildProcess.${mode}`,
          `native / child_process, ${label}`,
          r.nativeOverChildProcess,
          NATIVE_OVER_CHILD_PROCESS_MIN,
        ),
        // No JavaScript spawner can beat the C loops: where they are below
        // the limit too, the machine sets the ratio, not custody.
        reason:
          `C with custody's kernel work ${formatRatio(r.cClone3OverChildProcess)}, ` +
          `C vfork ${formatRatio(r.cVforkOverChildProcess)} child_process`,
      },
      target(`nativeOverCLimit.${mode}`, `native / C limit, ${label}`, r.nativeOverCLimit, NATIVE_OVER_C_MIN),
      target(
        `nativeBigOverSmall.${mode}`,
        `native ${heapName} heap / small heap, ${label}`,
        r.nativeBigOverSmall,
        NATIVE_BIG_OVER_SMALL_MIN,
      ),
      {
        ...target(`nativeOverBun.${mode}`, `native / Bun.spawn, ${label}`, r.nativeOverBun, NATIVE_OVER_BUN_MIN),
        ...(bun.skip ? { skipped: `Bun not run (${bun.skip})` } : {}),
      },
    );
  }

  return {
    name,
    quick,
    params: {
      ...params,
      command: COMMAND,
      concurrency: CONCURRENCY,
      unit: 'spawns per second (spawn + exit + reap), median of rounds',
    },
    variants,
    labels,
    rssMiB: rss,
    cLimit,
    ratios,
    targets,
    bun: bun.skip ? { skipped: bun.skip } : { version: bun.version, package: bun.pkg },
    leftoverProcesses: leftover,
    loadavg,
    otherCpu,
  };
}

function target(id, description, value, limit) {
  return { id, description, value, op: '>=', limit, met: value >= limit };
}

function formatMiB(mib) {
  return mib >= 1024 && mib % 1024 === 0 ? `${mib / 1024} GiB` : `${mib} MiB`;
}

function formatRate(x) {
  return Number.isFinite(x) ? Math.round(x).toLocaleString('en-US') : 'n/a';
}

/**
 * CPU time in clock ticks: the whole machine's busy time (/proc/stat) and
 * this process tree's (/proc/self/stat: ours plus every reaped descendant's,
 * which covers the workers, the C loops and all their children).
 */
function cpuTicks() {
  try {
    const [, user, nice, system, , , irq, softirq, steal] = readFileSync('/proc/stat', 'utf8')
      .split('\n')[0]
      .trim()
      .split(/\s+/)
      .map(Number);
    const self = readFileSync('/proc/self/stat', 'utf8');
    // utime, stime, cutime, cstime are fields 14-17; fields resume after the last ')' at field 3.
    const f = self
      .slice(self.lastIndexOf(')') + 2)
      .split(' ')
      .map(Number);
    return {
      ms: performance.now(),
      machine: user + nice + system + irq + softirq + steal,
      ours: f[11] + f[12] + f[13] + f[14],
    };
  } catch {
    return null;
  }
}

/**
 * The share of the machine's CPU capacity that other work used while we
 * measured: on a 2-CPU machine, anyone else's busy CPU slows the children
 * we wait for and makes every number here noisy.
 */
function otherCpuShare(before, after) {
  if (!before || !after) return null;
  const hz = 100; // USER_HZ, the unit of both files on every Linux
  // /proc/stat counts every CPU of the machine, whatever our affinity.
  const capacity = ((after.ms - before.ms) / 1000) * hz * os.cpus().length;
  const others = after.machine - before.machine - (after.ours - before.ours);
  return Math.max(0, Math.min(1, others / capacity));
}

/** The pids whose parent is `pid`, from /proc (zombies included). */
function childrenOf(pid) {
  const out = [];
  for (const entry of readdirSync('/proc')) {
    if (!/^\d+$/.test(entry)) continue;
    let stat;
    try {
      stat = readFileSync(`/proc/${entry}/stat`, 'utf8');
    } catch {
      continue; // gone meanwhile
    }
    // comm may hold spaces and parentheses: fields resume after the last ')'.
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    if (Number(fields[1]) === pid) out.push(Number(entry));
  }
  return out;
}

/** The results as a printable table. */
export function report(results) {
  const { params, variants, labels, rssMiB, cLimit, targets, quick, leftoverProcesses, loadavg, otherCpu, bun } =
    results;
  const bigName = formatMiB(params.bigHeapMiB);
  const rows = [];
  const order = ['c-vfork', 'c-clone3', 'c-fork', ...NODE_VARIANTS.map((v) => v.key), BUN_VARIANT.key];
  for (const key of order) {
    for (const heap of ['small', 'big']) {
      for (const { key: mode, label } of MODES) {
        const v = variants[key]?.[heap]?.[mode];
        if (!v) continue;
        const limit = cLimit[mode].rate;
        rows.push([
          labels[key],
          label,
          heap === 'big' ? bigName : 'small',
          rssMiB[key]?.[heap] ?? '',
          formatRate(v.median),
          formatRate(v.min),
          formatRate(v.max),
          formatRatio(v.median / limit),
        ]);
      }
    }
  }
  const lines = [
    `spawn: spawn + reap of ${params.command}, stdio ignored; ${params.passes > 1 ? `${params.passes} passes x ` : ''}` +
      `${params.rounds} rounds x ${params.roundMs} ms after ${params.warmupMs} ms warm-up; spawns/s, median of rounds` +
      `${quick ? ' (quick)' : ''}`,
    `  big heap: ${bigName} of Buffers, every page written${quick ? ' (quick mode; a full run uses 2 GiB)' : ''};` +
      ` rss: the measured process's resident MiB`,
    formatTable(['variant', 'mode', 'heap', 'rss MiB', 'median', 'min', 'max', 'vs C limit'], rows, {
      align: 'lllrrrrr',
    }),
    '',
    `  C limit: ${MODES.map((m) => `${m.label} ${formatRate(cLimit[m.key].rate)}/s (${labels[cLimit[m.key].variant]})`).join(', ')}`,
    bun.skipped
      ? `  Bun.spawn: skipped, ${bun.skipped}`
      : `  Bun.spawn: ${bun.package} from the npm registry (cached in bench/.cache), the same worker loop run by Bun`,
    '',
    formatTargets(targets, { quick }),
    '',
    `  leftover processes after the run: ${leftoverProcesses}; load average before ${loadavg.before.join(' ')}, after ${loadavg.after.join(' ')}`,
    otherCpu === null
      ? '  other work on the machine: unknown'
      : `  other work on the machine used ${(otherCpu * 100).toFixed(0)}% of its CPU time during the run` +
        (otherCpu > 0.1 ? ': the numbers are noisy (C and custody alike), rerun on an idle machine' : ''),
  ];
  return lines.join('\n');
}

// ---- worker side ----

/** Allocates `mib` MiB of Buffers and writes every byte, so every page is resident. */
function touchHeap(mib) {
  const chunks = [];
  const chunk = 256;
  for (let left = mib; left > 0; left -= chunk) {
    // allocUnsafeSlow: its own allocation, outside V8's heap and the pool.
    chunks.push(Buffer.allocUnsafeSlow(Math.min(left, chunk) * 2 ** 20).fill(0x5a));
  }
  return chunks;
}

async function makeSpawner(variant) {
  if (variant === 'native' || variant === 'js') {
    // Imported only here, after the parent set CUSTODY_BACKEND.
    const custody = await import('../dist/index.js');
    const actual = custody.capabilities().backend;
    if (actual !== variant)
      throw new Error(`asked for the ${variant} backend, custody loaded ${actual}: ${custody.capabilities().reason}`);
    return async () => {
      const h = custody.spawn(COMMAND, [], { stdio: 'ignore' });
      const s = await h.exited;
      if (s.code !== 0) throw new Error(`${COMMAND} ended ${JSON.stringify(s)}`);
    };
  }
  if (variant === 'child_process') {
    return () =>
      new Promise((resolve, reject) => {
        const child = cpSpawn(COMMAND, [], { stdio: 'ignore' });
        child.once('error', reject);
        child.once('exit', (code, signal) =>
          code === 0 ? resolve() : reject(new Error(`${COMMAND} ended code ${code} signal ${signal}`)),
        );
      });
  }
  if (variant === 'bun') {
    if (typeof globalThis.Bun?.spawn !== 'function') throw new Error('the bun variant runs under Bun');
    // Bun has no --expose-gc; its own collector, forced and synchronous.
    globalThis.gc ??= () => globalThis.Bun.gc(true);
    return async () => {
      const p = globalThis.Bun.spawn([COMMAND], { stdin: 'ignore', stdout: 'ignore', stderr: 'ignore' });
      const code = await p.exited;
      if (code !== 0) throw new Error(`${COMMAND} ended code ${code} signal ${p.signalCode}`);
    };
  }
  if (variant === 'execa') {
    const { execa } = await import('execa');
    return async () => {
      // Rejects on a non-zero exit.
      await execa(COMMAND, [], { stdio: 'ignore' });
    };
  }
  throw new Error(`unknown variant ${variant}`);
}

/** Keeps `concurrency` spawns in flight for `ms`, then waits for the last ones. */
async function runFor(spawnOne, concurrency, ms) {
  let done = 0;
  const t0 = performance.now();
  const end = t0 + ms;
  const lane = async () => {
    while (performance.now() < end) {
      await spawnOne();
      done++;
    }
  };
  await Promise.all(Array.from({ length: concurrency }, lane));
  return { done, ms: performance.now() - t0 };
}

async function worker([variant, heapArg, roundMsArg, roundsArg, warmupArg, ...concurrencyArgs]) {
  const [heapMiB, roundMs, rounds, warmupMs] = [heapArg, roundMsArg, roundsArg, warmupArg].map(Number);
  // The heap first: everything after it runs in the big process.
  const heap = touchHeap(heapMiB);
  const spawnOne = await makeSpawner(variant);
  const modes = {};
  let rssBytes = 0;
  for (const concurrency of concurrencyArgs.map(Number)) {
    await runFor(spawnOne, concurrency, warmupMs);
    const rates = [];
    const counts = [];
    for (let r = 0; r < rounds; r++) {
      // Start each round from a collected heap so one round does not pay for
      // the garbage of the previous ones.
      globalThis.gc?.();
      const { done, ms } = await runFor(spawnOne, concurrency, roundMs);
      rates.push((done * 1000) / ms);
      counts.push(done);
    }
    rssBytes = Math.max(rssBytes, process.memoryUsage.rss());
    modes[concurrency] = { rounds_per_s: rates, counts, spawns_per_s: summarize(rates).median };
  }
  // Every child was awaited, so every child was reaped: check.
  const leftoverChildren = childrenOf(process.pid).length;
  process.stdout.write(
    `${JSON.stringify({ variant, heapMiB, heapBytes: heap.reduce((n, b) => n + b.length, 0), rssBytes, modes, leftoverChildren })}\n`,
  );
}

await runAsScript(import.meta.url, { run, report, worker });
