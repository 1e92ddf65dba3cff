// identity: what one inspect(pid) costs on custody's native and js backends,
// against the C limit (bench/c/identity.c: the same syscalls, no JavaScript).
//
//   node bench/identity.js [--quick]       standalone: prints the table
//   import { run, report } from './identity.js'   for bench/run.js
//
// The backend is chosen once, when custody loads, from CUSTODY_BACKEND, so
// each backend is measured in its own child process:
//   node bench/identity.js --worker <native|js> <pid> <iterations> <rounds> <warmup>
// which prints one JSON line in the same shape as the C program's.
import { fileURLToPath } from 'node:url';
import {
  buildC,
  formatNs,
  formatRatio,
  formatTable,
  formatTargets,
  runAsScript,
  runJson,
  runWorker,
  startSleeper,
  summarize,
} from './lib.js';

export const name = 'identity';

// native <= 1.5 x C: the addon may add JS object creation, not syscalls.
const NATIVE_OVER_C_MAX = 1.5;
// js >= 3 x native: otherwise the addon is not worth its build.
const JS_OVER_NATIVE_MIN = 3;

// Calls per round. On a slow 2-CPU VM (~55 us per js call) quick takes ~1.5 s
// and full ~5 s in all; rounds are medianed, so one noisy round costs little.
const PARAMS = {
  quick: { iterations: 2000, rounds: 5, warmup: 500 },
  full: { iterations: 5000, rounds: 7, warmup: 2000 },
};

const VARIANTS = [
  { key: 'c', label: 'C (same syscalls)' },
  { key: 'native', label: 'custody native' },
  { key: 'js', label: 'custody js' },
];

/** Measures all three variants on a fresh `sleep` and returns the results. */
export async function run({ quick = false } = {}) {
  const params = PARAMS[quick ? 'quick' : 'full'];
  const cBin = buildC('identity');
  const target = startSleeper();
  try {
    await target.ready;
    const args = [target.pid, params.iterations, params.rounds, params.warmup];
    // One variant at a time: on a 2-CPU machine running them together would
    // measure contention, not inspect().
    const raw = {};
    raw.c = await runJson(cBin, args.map(String));
    for (const backend of ['native', 'js']) {
      raw[backend] = await runWorker(fileURLToPath(import.meta.url), [backend, ...args], {
        env: { CUSTODY_BACKEND: backend },
      });
    }
    checkSamples(raw);

    const variants = {};
    for (const { key } of VARIANTS) variants[key] = { ...summarize(raw[key].rounds_ns), sample: raw[key].sample };
    const nativeOverC = variants.native.median / variants.c.median;
    const jsOverNative = variants.js.median / variants.native.median;
    return {
      name,
      quick,
      params: { ...params, target: `sleep (pid ${target.pid})`, unit: 'ns per inspect() call, median of rounds' },
      variants,
      ratios: { nativeOverC, jsOverNative },
      targets: [
        {
          id: 'nativeOverC',
          description: `native within ${NATIVE_OVER_C_MAX}x of C`,
          value: nativeOverC,
          op: '<=',
          limit: NATIVE_OVER_C_MAX,
          met: nativeOverC <= NATIVE_OVER_C_MAX,
        },
        {
          id: 'jsOverNative',
          description: `native at least ${JS_OVER_NATIVE_MIN}x faster than js`,
          value: jsOverNative,
          op: '>=',
          limit: JS_OVER_NATIVE_MIN,
          met: jsOverNative >= JS_OVER_NATIVE_MIN,
        },
      ],
    };
  } finally {
    await target.stop();
  }
}

/**
 * The three variants must have read the same process, or the comparison
 * means nothing. The js backend has no pidfd, hence no pidfs id to compare.
 */
function checkSamples(raw) {
  const c = raw.c.sample;
  for (const key of ['native', 'js']) {
    const s = raw[key].sample;
    const fields = ['state', 'ppid', 'startTicks', 'uid', 'argc'];
    if (key === 'native') fields.push('pidfsId');
    for (const f of fields) {
      if (s[f] !== c[f])
        throw new Error(`identity: ${key} read ${f}=${JSON.stringify(s[f])}, C read ${JSON.stringify(c[f])}`);
    }
    if (JSON.stringify(s.exe) !== JSON.stringify(c.exe)) {
      throw new Error(`identity: ${key} read exe ${JSON.stringify(s.exe)}, C read ${JSON.stringify(c.exe)}`);
    }
  }
}

/** The results as a printable table. */
export function report(results) {
  const { params, variants, targets, quick } = results;
  const c = variants.c.median;
  const lines = [
    `identity: inspect(pid) of an idle ${params.target}; ${params.rounds} rounds x ${params.iterations.toLocaleString('en-US')} calls` +
      ` after ${params.warmup.toLocaleString('en-US')} warm-up; ns per call${quick ? ' (quick)' : ''}`,
    formatTable(
      ['variant', 'median', 'min', 'max', 'vs C'],
      VARIANTS.map(({ key, label }) => {
        const v = variants[key];
        return [label, formatNs(v.median), formatNs(v.min), formatNs(v.max), formatRatio(v.median / c)];
      }),
    ),
    '',
    formatTargets(targets, { quick }),
  ];
  return lines.join('\n');
}

/**
 * Worker side: time the library's public inspect() on one backend. Custody is
 * imported here, after the parent set CUSTODY_BACKEND, and never in the parent.
 */
async function worker([backend, pidArg, iterationsArg, roundsArg, warmupArg]) {
  const custody = await import('../dist/index.js');
  const actual = custody.capabilities().backend;
  if (actual !== backend)
    throw new Error(`asked for the ${backend} backend, custody loaded ${actual}: ${custody.capabilities().reason}`);
  const [pid, iterations, rounds, warmup] = [pidArg, iterationsArg, roundsArg, warmupArg].map(Number);
  const { inspect } = custody;

  let id;
  for (let i = 0; i < warmup; i++) id = inspect(pid);
  const roundsNs = [];
  for (let r = 0; r < rounds; r++) {
    // Start each round from a collected heap so one round does not pay for
    // the garbage of the previous ones.
    globalThis.gc?.();
    const t0 = process.hrtime.bigint();
    for (let i = 0; i < iterations; i++) id = inspect(pid);
    roundsNs.push(Number(process.hrtime.bigint() - t0) / iterations);
  }
  id = inspect(pid);
  const sample = {
    state: id.state,
    ppid: id.ppid,
    startTicks: id.startTicks,
    uid: id.uid,
    argc: id.argv.length,
    exe: id.exe,
    pidfsId: id.pidfsId,
  };
  const { median } = summarize(roundsNs);
  process.stdout.write(
    `${JSON.stringify({ variant: backend, pid, iterations, warmup, ns_per_call: median, rounds_ns: roundsNs, sample })}\n`,
  );
}

await runAsScript(import.meta.url, { run, report, worker });
