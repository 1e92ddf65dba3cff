// exits: exit notification at scale. With 0, 1 000 and 5 000 idle
// supervised children alive, what does it cost to spawn a short-lived child
// (/bin/true) and see its exit? Per exit, for custody native, custody js,
// child_process.spawn and two C programs (bench/c/exits.c) holding every
// child's pidfd in one epoll set.
//
//   node bench/exits.js [--quick]          standalone: prints the table
//   import { run, report } from './exits.js'   for bench/run.js
//
// Why it can grow with the idle count:
//   - libuv (child_process, hence custody js) answers every SIGCHLD by
//     calling waitpid(pid, WNOHANG) on every child it has spawned: O(idle)
//     per exit.
//   - every idle child custody native supervises holds a pidfd, so the fd
//     table grows by one per child, and clone without CLONE_FILES copies
//     the whole table into each new child (which then closes it all again
//     before exec): O(idle) per spawn. The C program measures that path
//     ("plain", what native/spawn.cc did at first) beside what it does now
//     ("files": stdio sources dup3'd onto reserved low slots, CLONE_FILES,
//     then close_range(CLOSE_RANGE_UNSHARE) in the child, which copies only
//     the fds up to the slots; see bench/c/exits.c).
//   - a pidfd in epoll is O(1) per exit: that part must not grow.
//
// Idle children are bench/c/idle.c (sleeps, dies with its parent through
// PR_SET_PDEATHSIG), with a marker in their argv that the parent sweeps by
// after every worker as a safety net. Workers run under ulimit -n 65536.
//   node bench/exits.js --worker <native|js|child_process> <idle bin> <marker> <short> <rounds> <warmup> <idle count>...
// prints one JSON line in the same shape as the C program's.
import { spawn as cpSpawn } from 'node:child_process';
import os from 'node:os';
import { fileURLToPath } from 'node:url';
import { buildC, formatRatio, formatTable, formatTargets, runAsScript, runJson, summarize } from './lib.js';
import { childrenOf, cpuTicks, newMarker, noiseLine, otherCpuShare, runWorkerNofile, sweepMarker } from './procs.js';

export const name = 'exits';

// native's per-exit cost with 5 000 idle children within 1.5 x its cost with none.
const NATIVE_GROWTH_MAX = 1.5;

const SHORT = '/bin/true';

// On a 2-CPU VM a /bin/true cycle costs ~0.5 ms from C; an idle child ~0.3 ms
// to start from C, ~1 ms from child_process. Quick keeps to ~1 000 idle
// children (~7 s in all); full goes to 5 000 (~1.5 min).
const PARAMS = {
  quick: { idleCounts: [0, 1000], shortLived: 100, rounds: 3, warmup: 20 },
  full: { idleCounts: [0, 1000, 5000], shortLived: 500, rounds: 5, warmup: 50 },
};

const VARIANTS = [
  { key: 'c-plain', kind: 'c', mode: 'plain', label: 'C clone, whole fd table copied' },
  { key: 'c-files', kind: 'c', mode: 'files', label: 'C CLONE_FILES + close_range UNSHARE (as custody)' },
  { key: 'native', kind: 'node', label: 'custody native', env: { CUSTODY_BACKEND: 'native' } },
  { key: 'js', kind: 'node', label: 'custody js', env: { CUSTODY_BACKEND: 'js' } },
  { key: 'child_process', kind: 'node', label: 'child_process.spawn', env: {} },
];

/** Measures every variant, one at a time, and returns the results. */
export async function run({ quick = false } = {}) {
  const params = PARAMS[quick ? 'quick' : 'full'];
  const { idleCounts, shortLived, rounds, warmup } = params;
  const cBin = buildC('exits');
  const idleBin = buildC('idle');
  const maxIdle = Math.max(...idleCounts);
  // Generous: ~2 ms per idle child and ~5 ms per short-lived one at worst.
  const timeoutMs = 60_000 + maxIdle * 4 + idleCounts.length * (rounds * shortLived + warmup) * 10;
  const loadBefore = os.loadavg();
  const cpuBefore = cpuTicks();

  const variants = {};
  let leftover = 0;
  let escaped = 0;
  for (const v of VARIANTS) {
    const marker = newMarker('exits');
    const args = [idleBin, marker, shortLived, rounds, warmup, ...idleCounts];
    let res;
    try {
      res =
        v.kind === 'c'
          ? // The C program raises its own fd limit (setrlimit) as far as it needs.
            await runJson(cBin, [v.mode, ...args].map(String), { timeoutMs })
          : await runWorkerNofile(fileURLToPath(import.meta.url), [v.key, ...args], { env: v.env, timeoutMs });
    } finally {
      // The idle children die with their worker; anything still carrying the
      // marker escaped that and is killed here.
      escaped += sweepMarker(marker);
    }
    leftover += res.leftover_children ?? 0;
    variants[v.key] = {
      label: v.label,
      idle: Object.fromEntries(
        res.idle.map((x) => [
          x.idle,
          {
            perExitUs: summarize(x.rounds_us),
            spawnCallUs: summarize(x.clone_rounds_us),
            setupUsPerIdle: x.setup_us_per_idle,
          },
        ]),
      ),
    };
  }
  leftover += childrenOf(process.pid).length;

  const lo = idleCounts[0];
  const hi = maxIdle;
  const cost = (key, n) => variants[key].idle[n].perExitUs.median;
  const growth = Object.fromEntries(VARIANTS.map((v) => [v.key, cost(v.key, hi) / cost(v.key, lo)]));
  const ratios = {
    growth,
    nativeOverC: Object.fromEntries(idleCounts.map((n) => [n, cost('native', n) / cost('c-plain', n)])),
    childProcessOverNative: Object.fromEntries(
      idleCounts.map((n) => [n, cost('child_process', n) / cost('native', n)]),
    ),
    cPlainOverFiles: Object.fromEntries(idleCounts.map((n) => [n, cost('c-plain', n) / cost('c-files', n)])),
  };
  const round2 = (xs) => xs.map((x) => Math.round(x * 100) / 100);
  return {
    name,
    quick,
    params: {
      ...params,
      short: SHORT,
      idle: 'bench/c/idle.c',
      unit: 'us per short-lived child: spawn + exit seen + reaped, median of rounds',
    },
    variants,
    ratios,
    targets: [
      {
        id: 'nativeGrowth',
        description: `native per-exit cost, ${hi.toLocaleString('en-US')} idle / ${lo} idle`,
        value: growth.native,
        op: '<=',
        limit: NATIVE_GROWTH_MAX,
        met: growth.native <= NATIVE_GROWTH_MAX,
      },
    ],
    leftoverProcesses: leftover + escaped,
    loadavg: { before: round2(loadBefore), after: round2(os.loadavg()) },
    otherCpu: otherCpuShare(cpuBefore, cpuTicks(), os.cpus().length),
  };
}

function fmtUs(x) {
  return Number.isFinite(x) ? (x >= 100 ? Math.round(x).toLocaleString('en-US') : x.toFixed(1)) : 'n/a';
}

/** The results as a printable table. */
export function report(results) {
  const { params, variants, ratios, targets, quick, leftoverProcesses, loadavg, otherCpu } = results;
  const counts = params.idleCounts;
  const lo = counts[0];
  const hi = counts[counts.length - 1];
  const n = (x) => x.toLocaleString('en-US');
  const perExit = VARIANTS.map(({ key }) => {
    const v = variants[key];
    return [
      v.label,
      ...counts.map((c) => fmtUs(v.idle[c].perExitUs.median)),
      formatRatio(ratios.growth[key]),
      ...counts.map((c) => fmtUs(v.idle[c].spawnCallUs.median)),
      fmtUs(v.idle[hi].setupUsPerIdle),
    ];
  });
  const lines = [
    `exits: spawn ${params.short} and see its exit, one at a time, with N idle children alive;` +
      ` ${params.rounds} rounds x ${params.shortLived} children per N; us per child${quick ? ' (quick)' : ''}`,
    `  idle children: ${params.idle}; "spawn call": the part spent in spawn()/clone (returns once the child has exec'd)`,
    formatTable(
      [
        'variant',
        ...counts.map((c) => `${n(c)} idle`),
        `${n(hi)}/${lo}`,
        ...counts.map((c) => `spawn call @${n(c)}`),
        `start idle @${n(hi)}`,
      ],
      perExit,
    ),
    '',
    `  child_process / native: ${counts.map((c) => `${formatRatio(ratios.childProcessOverNative[c])} at ${n(c)}`).join(', ')};` +
      ` native / C (plain): ${counts.map((c) => `${formatRatio(ratios.nativeOverC[c])} at ${n(c)}`).join(', ')}`,
    `  the fd-table copy, C plain / C files: ${counts.map((c) => `${formatRatio(ratios.cPlainOverFiles[c])} at ${n(c)}`).join(', ')}`,
    '',
    formatTargets(targets, { quick, quickNote: `quick stops at ${n(hi)} idle` }),
    '',
    `  leftover processes after the run: ${leftoverProcesses}`,
    noiseLine(otherCpu, loadavg),
  ];
  return lines.join('\n');
}

// ---- worker side ----

async function makeVariant(variant, idleBin, marker) {
  const idleArgs = ['3600', marker];
  const us = (ms) => ms * 1000;
  if (variant === 'native' || variant === 'js') {
    // Imported only here, after the parent set CUSTODY_BACKEND.
    const custody = await import('../dist/index.js');
    const actual = custody.capabilities().backend;
    if (actual !== variant)
      throw new Error(`asked for the ${variant} backend, custody loaded ${actual}: ${custody.capabilities().reason}`);
    const idle = [];
    return {
      idleCount: () => idle.length,
      spawnIdle() {
        idle.push(custody.spawn(idleBin, idleArgs, { stdio: 'ignore' }));
      },
      async short() {
        const t0 = performance.now();
        const h = custody.spawn(SHORT, [], { stdio: 'ignore' });
        const t1 = performance.now();
        const s = await h.exited;
        if (s.code !== 0) throw new Error(`${SHORT} ended ${JSON.stringify(s)}`);
        return us(t1 - t0);
      },
      anyIdleExited: () => idle.some((h) => h.exitStatus !== undefined),
      async killAll() {
        for (const h of idle) h.signal('SIGKILL');
        const st = await Promise.all(idle.map((h) => h.exited));
        for (const h of idle) h.close();
        return st.filter((s) => s.signal !== 'SIGKILL').length;
      },
    };
  }
  if (variant === 'child_process') {
    const idle = [];
    return {
      idleCount: () => idle.length,
      spawnIdle() {
        const c = cpSpawn(idleBin, idleArgs, { stdio: 'ignore' });
        c.once('error', (err) => {
          throw err;
        });
        c.ended = new Promise((resolve) => c.once('exit', (code, signal) => resolve({ code, signal })));
        idle.push(c);
      },
      short() {
        return new Promise((resolve, reject) => {
          const t0 = performance.now();
          const c = cpSpawn(SHORT, [], { stdio: 'ignore' });
          const t1 = performance.now();
          c.once('error', reject);
          c.once('exit', (code, signal) =>
            code === 0 ? resolve(us(t1 - t0)) : reject(new Error(`${SHORT} ended code ${code} signal ${signal}`)),
          );
        });
      },
      anyIdleExited: () => idle.some((c) => c.exitCode !== null || c.signalCode !== null),
      async killAll() {
        for (const c of idle) c.kill('SIGKILL');
        const st = await Promise.all(idle.map((c) => c.ended));
        return st.filter((s) => s.signal !== 'SIGKILL').length;
      },
    };
  }
  throw new Error(`unknown variant ${variant}`);
}

async function worker([variant, idleBin, marker, shortArg, roundsArg, warmupArg, ...countArgs]) {
  const [shortLived, rounds, warmup] = [shortArg, roundsArg, warmupArg].map(Number);
  const counts = countArgs.map(Number);
  const v = await makeVariant(variant, idleBin, marker);
  const out = [];
  let killedOddly = 0;
  try {
    for (const count of counts) {
      const t0 = performance.now();
      const added = count - v.idleCount();
      while (v.idleCount() < count) v.spawnIdle();
      const setupUs = (performance.now() - t0) * 1000;
      for (let i = 0; i < warmup; i++) await v.short();
      const roundsUs = [];
      const spawnUs = [];
      for (let r = 0; r < rounds; r++) {
        globalThis.gc?.();
        let inSpawn = 0;
        const r0 = performance.now();
        for (let i = 0; i < shortLived; i++) inSpawn += await v.short();
        roundsUs.push(((performance.now() - r0) * 1000) / shortLived);
        spawnUs.push(inSpawn / shortLived);
      }
      if (v.anyIdleExited()) throw new Error('an idle child exited during the run');
      out.push({
        idle: count,
        setup_us_per_idle: added > 0 ? setupUs / added : 0,
        rounds_us: roundsUs,
        clone_rounds_us: spawnUs,
      });
    }
  } finally {
    // Every idle child killed and reaped, on success and failure alike.
    killedOddly = await v.killAll();
  }
  if (killedOddly) throw new Error(`${killedOddly} idle children did not end by SIGKILL`);
  const leftover = childrenOf(process.pid).length;
  process.stdout.write(`${JSON.stringify({ variant, idle: out, leftover_children: leftover })}\n`);
}

await runAsScript(import.meta.url, { run, report, worker });
