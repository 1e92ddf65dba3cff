// lifecycle: throughput of the whole supervised lifecycle, Supervisor.launch
// (starting manifest written and fsync'd, spawn, confirm, identity manifest
// written and fsync'd) then stop (SIGTERM, exit seen and reaped, state
// removed and the dir fsync'd), in cycles per second, sequential and 32
// concurrent, on custody native and js.
//
//   node bench/lifecycle.js [--quick]          standalone: prints the tables
//   import { run, report } from './lifecycle.js'   for bench/run.js
//
// Every variant runs once with its state dir on tmpfs (/dev/shm, where
// fsync returns at once) and once on a disk (/var/tmp, or /tmp where
// /var/tmp is a tmpfs; the table names the file system statfs reports).
// Where the time goes is measured from custody's own events, without
// changing it: the worker's onEvent sink stamps each event as it arrives
// (events are emitted synchronously, so the stamp is the moment of the step;
// performance.now(), finer than the event's millisecond `time`), and the
// gaps between them are the phases of a launch:
//   call -> launch event    the starting manifest written and fsync'd
//   launch -> spawn         spawn (returns once the child has exec'd)
//   spawn -> confirm        confirm (the argv seen under a pin)
//   confirm -> running      the identity manifest written and fsync'd, the
//                           instance tracked
//   running -> resolved     launch() resolving
// and of a stop: call -> the instance's `exited` settling (SIGTERM, exit
// seen, reaped), exited -> stop event (state removed, dir fsync'd), stop
// event -> resolved. The fsyncs of each cycle are counted through node:fs
// (bench/instrument.js), and each worker also times the state store alone
// (a new manifest, its overwrite, its removal: what one cycle writes) on
// the same file system. The supervised process is bench/c/idle.c (`idle 30
// <marker> <token>`), which ends on SIGTERM at once and dies with its
// worker.
//
// Each round launches and stops for a fixed time (lanes of one cycle at a
// time), then lets the cycles in flight finish; its rate is cycles / elapsed,
// and the table shows the median of the rounds. Rounds are interleaved (each
// round runs every variant once), and every variant runs in its own worker
// (custody picks its backend when it loads):
//   node bench/lifecycle.js --worker <native|js> <state base> <idle bin> <marker> <round ms> <rounds> <warmup ms> <store ops> <concurrency>...
import { readdirSync, readFileSync, mkdtempSync, rmSync } from 'node:fs';
import os from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { countFsyncs } from './instrument.js';
import { buildC, formatRatio, formatTable, median, runAsScript, summarize } from './lib.js';
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

export const name = 'lifecycle';

// Rounds are interleaved, a worker per variant per round, each with its own
// warm-up. Quick: ~8 s in all; full: ~50 s.
const PARAMS = {
  quick: { roundMs: 150, rounds: 3, warmupMs: 60, storeOps: 45 },
  full: { roundMs: 800, rounds: 5, warmupMs: 200, storeOps: 300 },
};

const CONCURRENCY = 32;
const MODES = [
  { key: 'seq', label: 'sequential', concurrency: 1 },
  { key: 'conc', label: `${CONCURRENCY} concurrent`, concurrency: CONCURRENCY },
];
const BACKENDS = [
  { key: 'native', label: 'custody native' },
  { key: 'js', label: 'custody js' },
];
const STORAGE = [
  { key: 'tmpfs', base: '/dev/shm' },
  { key: 'disk', base: diskBase() },
];

// The phases of one cycle, in order: [key, label, from event, to event].
// 'call', 'resolved', 'stopCall', 'exited', 'stopResolved' are the worker's
// own stamps; the rest are custody's events.
const PHASES = [
  ['starting', 'write starting', 'call', 'launch'],
  ['spawn', 'spawn', 'launch', 'spawn'],
  ['confirm', 'confirm', 'spawn', 'confirm'],
  ['running', 'write running', 'confirm', 'running'],
  ['resolve', 'resolve', 'running', 'resolved'],
  ['term', 'term to reap', 'stopCall', 'exited'],
  ['remove', 'remove state', 'exited', 'stop'],
  ['stopRest', 'stop resolve', 'stop', 'stopResolved'],
];

/**
 * Measures every variant and returns the results. Rounds are interleaved:
 * each round runs every variant once, in its own worker, so noise from other
 * work on the machine, which comes and goes over seconds, lands on all
 * variants alike instead of on whichever ran during it.
 */
export async function run({ quick = false } = {}) {
  const params = PARAMS[quick ? 'quick' : 'full'];
  const idleBin = buildC('idle');
  const self = fileURLToPath(import.meta.url);
  const timeoutMs = 60_000 + 20 * MODES.length * (params.warmupMs + params.roundMs) + params.storeOps * 200;
  const loadBefore = os.loadavg();
  const cpuBefore = cpuTicks();
  const storage = Object.fromEntries(
    STORAGE.map((st) => {
      const t = fsType(st.base);
      return [st.key, { base: st.base, fs: t.name, tmpfs: t.tmpfs }];
    }),
  );
  // raw[backend][storage] = { rates: { mode: [] }, launch: { mode: [] }, stop: { mode: [] }, phases: { mode: { sums, cycles, fsyncs } }, store: [] }
  const raw = {};
  let leftover = 0;
  let escaped = 0;
  const storeOpsPerRound = Math.ceil(params.storeOps / params.rounds);
  for (let round = 0; round < params.rounds; round++) {
    for (const st of STORAGE) {
      for (const b of BACKENDS) {
        const base = mkdtempSync(join(st.base, 'custody-bench-lifecycle-'));
        const marker = newMarker('lifecycle');
        let res;
        try {
          res = await runWorkerNofile(
            self,
            [
              b.key,
              base,
              idleBin,
              marker,
              params.roundMs,
              1,
              params.warmupMs,
              storeOpsPerRound,
              ...MODES.map((m) => m.concurrency),
            ],
            { env: { CUSTODY_BACKEND: b.key }, timeoutMs },
          );
        } finally {
          escaped += sweepMarker(marker);
          rmSync(base, { recursive: true, force: true });
        }
        leftover += res.leftoverChildren + res.leftoverState;
        const r = ((raw[b.key] ??= {})[st.key] ??= {
          rates: {},
          counts: {},
          launch: {},
          stop: {},
          phases: {},
          store: [],
        });
        for (const m of MODES) {
          const x = res.modes[String(m.concurrency)];
          (r.rates[m.key] ??= []).push(...x.rates);
          (r.counts[m.key] ??= []).push(...x.counts);
          (r.launch[m.key] ??= []).push(x.launchMs);
          (r.stop[m.key] ??= []).push(x.stopMs);
          // Phases are summed over every timed cycle of every round: their means add up to the cycle.
          const ph = (r.phases[m.key] ??= { sums: {}, cycles: 0, fsyncs: 0 });
          for (const [k, v] of Object.entries(x.phaseSums)) ph.sums[k] = (ph.sums[k] ?? 0) + v;
          ph.cycles += x.phaseCycles;
          ph.fsyncs += x.fsyncs;
        }
        r.store.push(res.store);
      }
    }
  }
  leftover += childrenOf(process.pid).length;

  const variants = {};
  for (const b of BACKENDS) {
    for (const st of STORAGE) {
      const r = raw[b.key][st.key];
      const modes = {};
      for (const m of MODES) {
        const ph = r.phases[m.key];
        modes[m.key] = {
          ...summarize(r.rates[m.key]),
          counts: r.counts[m.key],
          launchMs: median(r.launch[m.key]),
          stopMs: median(r.stop[m.key]),
          // Mean ms per cycle in each phase, and fsyncs per cycle.
          phasesMs: Object.fromEntries(PHASES.map(([k]) => [k, (ph.sums[k] ?? NaN) / ph.cycles])),
          fsyncsPerCycle: ph.fsyncs / ph.cycles,
        };
      }
      const store = {};
      for (const k of Object.keys(r.store[0])) store[k] = median(r.store.map((x) => x[k]));
      (variants[b.key] ??= {})[st.key] = { modes, store };
    }
  }

  const rate = (b, s, m) => variants[b][s].modes[m].median;
  const ratios = {};
  for (const m of MODES) {
    ratios[m.key] = {
      nativeOverJsTmpfs: rate('native', 'tmpfs', m.key) / rate('js', 'tmpfs', m.key),
      nativeOverJsDisk: rate('native', 'disk', m.key) / rate('js', 'disk', m.key),
      nativeDiskOverTmpfs: rate('native', 'disk', m.key) / rate('native', 'tmpfs', m.key),
      jsDiskOverTmpfs: rate('js', 'disk', m.key) / rate('js', 'tmpfs', m.key),
    };
  }
  const round2 = (xs) => xs.map((x) => Math.round(x * 100) / 100);
  return {
    name,
    quick,
    params: {
      ...params,
      concurrency: CONCURRENCY,
      process: 'bench/c/idle.c 30 <marker> <token>',
      unit: 'launch+stop cycles per second, median of rounds',
    },
    storage,
    variants,
    ratios,
    // Throughput is reported here, not judged: no rate is a goal of its own.
    targets: [],
    leftoverProcesses: leftover + escaped,
    loadavg: { before: round2(loadBefore), after: round2(os.loadavg()) },
    otherCpu: otherCpuShare(cpuBefore, cpuTicks(), os.cpus().length),
  };
}

const fmtRate = (x) => (Number.isFinite(x) ? Math.round(x).toLocaleString('en-US') : 'n/a');
const fmtMs = (x) => (Number.isFinite(x) ? x.toFixed(x < 10 ? 2 : 1) : 'n/a');
const fmtUs = (x) => (Number.isFinite(x) ? Math.round(x).toLocaleString('en-US') : 'n/a');

/** The results as printable tables. */
export function report(results) {
  const { params, storage, variants, ratios, quick, leftoverProcesses, loadavg, otherCpu } = results;
  const rows = [];
  for (const b of BACKENDS) {
    for (const st of STORAGE) {
      for (const m of MODES) {
        const v = variants[b.key][st.key].modes[m.key];
        rows.push([
          b.label,
          `${st.key} (${storage[st.key].fs})`,
          m.label,
          fmtRate(v.median),
          fmtRate(v.min),
          fmtRate(v.max),
          formatRatio(v.median / variants.js[st.key].modes[m.key].median),
          fmtMs(v.launchMs),
          fmtMs(v.stopMs),
        ]);
      }
    }
  }
  const storeRows = [];
  for (const st of STORAGE) {
    for (const b of BACKENDS) {
      const s = variants[b.key][st.key].store;
      storeRows.push([
        `${st.key} (${storage[st.key].fs})`,
        b.label,
        fmtUs(s.writeNewUs),
        fmtUs(s.overwriteUs),
        fmtUs(s.removeUs),
        fmtUs(s.cycleUs),
      ]);
    }
  }
  const phaseRows = [];
  for (const b of BACKENDS) {
    for (const st of STORAGE) {
      for (const m of MODES) {
        const v = variants[b.key][st.key].modes[m.key];
        const total = PHASES.reduce((sum, [k]) => sum + v.phasesMs[k], 0);
        phaseRows.push([
          b.label,
          st.key,
          m.label,
          ...PHASES.map(([k]) => fmtMs(v.phasesMs[k])),
          fmtMs(total),
          v.fsyncsPerCycle.toFixed(1),
        ]);
      }
    }
  }
  const tmpfsMissing = storage.tmpfs.tmpfs
    ? null
    : `  note: ${storage.tmpfs.base} is not a tmpfs here (${storage.tmpfs.fs}): the tmpfs rows pay for a disk too`;
  const fsyncShare = (b, m) => {
    const tmpfs = 1000 / variants[b].tmpfs.modes[m].median;
    const disk = 1000 / variants[b].disk.modes[m].median;
    return `${fmtMs(disk - tmpfs)} ms of ${fmtMs(disk)} ms per cycle`;
  };
  const lines = [
    `lifecycle: Supervisor.launch (2 fsync'd manifest writes, spawn, confirm) + stop (SIGTERM, reap, state removed) of ${params.process};` +
      ` ${params.rounds} rounds x ${params.roundMs} ms after ${params.warmupMs} ms warm-up; cycles/s${quick ? ' (quick)' : ''}`,
    `  launch ms / stop ms: median latency of each call (in ${CONCURRENCY}-concurrent mode it includes waiting for the other lanes)`,
    formatTable(['variant', 'state dir', 'mode', 'median', 'min', 'max', 'vs js', 'launch ms', 'stop ms'], rows, {
      align: 'lllrrrrrr',
    }),
    tmpfsMissing,
    '',
    `  where the time goes: mean ms per cycle in each phase, from custody's events, and fsyncs per cycle counted through node:fs.`,
    `  write starting / running: that manifest written and fsync'd (with its dirs; running also tracks the instance); spawn:`,
    `  until the child has exec'd; term to reap: SIGTERM until its exit is seen and reaped; remove state: the instance dir`,
    `  removed, the state dir fsync'd.`,
    `  ${CONCURRENCY}-concurrent phases include waiting for the other lanes on the one event loop.`,
    formatTable(['variant', 'state', 'mode', ...PHASES.map(([, label]) => label), 'sum', 'fsyncs'], phaseRows, {
      align: `lll${'r'.repeat(PHASES.length + 2)}`,
    }),
    '',
    `  fsync and disk, disk - tmpfs per cycle: native ${MODES.map((m) => `${m.label} ${fsyncShare('native', m.key)}`).join('; ')};` +
      ` js ${MODES.map((m) => `${m.label} ${fsyncShare('js', m.key)}`).join('; ')}`,
    `  native / js: ${MODES.map((m) => `${m.label} ${formatRatio(ratios[m.key].nativeOverJsTmpfs)} on tmpfs, ${formatRatio(ratios[m.key].nativeOverJsDisk)} on disk`).join('; ')}`,
    '',
    `  the state store alone (StateStore of dist/store.js, ${params.storeOps} times each, median us): what one cycle writes`,
    formatTable(['state dir', 'process', 'write new', 'overwrite', 'remove', 'all three'], storeRows, {
      align: 'llrrrr',
    }),
    '',
    `  leftover processes and state after the run: ${leftoverProcesses}`,
    noiseLine(otherCpu, loadavg),
  ];
  return lines.filter((l) => l !== null).join('\n');
}

// ---- worker side ----

/** Keeps `concurrency` lanes launching and stopping for `ms`, then waits for the cycles in flight. */
async function runFor(cycle, concurrency, ms) {
  let done = 0;
  const launch = [];
  const stop = [];
  const t0 = performance.now();
  const end = t0 + ms;
  const lane = async (l) => {
    for (let _k = 0; performance.now() < end; _k++) {
      const t = await cycle(l);
      launch.push(t.launch);
      stop.push(t.stop);
      done++;
    }
  };
  await Promise.all(Array.from({ length: concurrency }, (_, l) => lane(l)));
  return { done, ms: performance.now() - t0, launch, stop };
}

/** What one launch/stop cycle writes, through the state store alone. */
async function timeStore(StateStore, manifest, dir, ops) {
  const store = await StateStore.open(dir, { emit: () => {} });
  const writeNew = [];
  const overwrite = [];
  const remove = [];
  const cycle = [];
  for (let i = 0; i < ops; i++) {
    const id = `s${i}`;
    const m = { ...manifest, id };
    const t0 = performance.now();
    await store.write({ ...m, state: 'starting', identity: null });
    const t1 = performance.now();
    await store.write(m);
    const t2 = performance.now();
    await store.remove(id);
    const t3 = performance.now();
    writeNew.push((t1 - t0) * 1000);
    overwrite.push((t2 - t1) * 1000);
    remove.push((t3 - t2) * 1000);
    cycle.push((t3 - t0) * 1000);
  }
  store.close();
  return {
    writeNewUs: median(writeNew),
    overwriteUs: median(overwrite),
    removeUs: median(remove),
    cycleUs: median(cycle),
  };
}

async function worker([
  backend,
  base,
  idleBin,
  marker,
  roundMsArg,
  roundsArg,
  warmupArg,
  storeOpsArg,
  ...concurrencyArgs
]) {
  const [roundMs, rounds, warmupMs, storeOps] = [roundMsArg, roundsArg, warmupArg, storeOpsArg].map(Number);
  // Before custody loads: its state store binds fsync when it does.
  const fsyncs = countFsyncs();
  const custody = await import('../dist/index.js');
  const actual = custody.capabilities().backend;
  if (actual !== backend)
    throw new Error(`asked for the ${backend} backend, custody loaded ${actual}: ${custody.capabilities().reason}`);
  const stateDir = join(base, 'state');
  // stamps.get(id)[event type] = when the event reached the sink.
  const stamps = new Map();
  const onEvent = (e) => {
    const rec = e.id === undefined ? undefined : stamps.get(e.id);
    if (rec) rec[e.type] = performance.now();
  };
  const { supervisor } = await custody.Supervisor.open({ stateDir, onEvent });
  let seq = 0;
  let sample = null;
  // Summed over the timed rounds of the current mode; null while warming up.
  let phaseSums = null;
  let phaseCycles = 0;
  const cycle = async (lane) => {
    const id = `l${lane}-${seq++}`;
    const rec = { call: performance.now() };
    stamps.set(id, rec);
    const instance = await supervisor.launch({ id, command: idleBin, args: (token) => ['30', marker, token] });
    rec.resolved = performance.now();
    // Attached before stop() awaits the same promise, so it runs first.
    instance.exited.then(() => (rec.exited = performance.now()));
    if (sample === null) sample = JSON.parse(readFileSync(join(stateDir, id, 'manifest.json'), 'utf8'));
    rec.stopCall = performance.now();
    const r = await supervisor.stop(id, { graceMs: 5000 });
    rec.stopResolved = performance.now();
    stamps.delete(id);
    if (r.outcome !== 'exited' || r.escalated) throw new Error(`stop of ${id} gave ${JSON.stringify(r)}`);
    if (phaseSums) {
      for (const [k, , from, to] of PHASES) {
        if (rec[from] === undefined || rec[to] === undefined)
          throw new Error(
            `${id}: no ${rec[from] === undefined ? from : to} stamp (events seen: ${Object.keys(rec).join(', ')})`,
          );
        phaseSums[k] = (phaseSums[k] ?? 0) + (rec[to] - rec[from]);
      }
      phaseCycles++;
    }
    return { launch: rec.resolved - rec.call, stop: rec.stopResolved - rec.stopCall };
  };
  const modes = {};
  try {
    for (const concurrency of concurrencyArgs.map(Number)) {
      phaseSums = null;
      await runFor(cycle, concurrency, warmupMs);
      const rates = [];
      const counts = [];
      const launch = [];
      const stop = [];
      phaseSums = {};
      phaseCycles = 0;
      const fsyncsBefore = fsyncs.count();
      for (let r = 0; r < rounds; r++) {
        globalThis.gc?.();
        const res = await runFor(cycle, concurrency, roundMs);
        rates.push((res.done * 1000) / res.ms);
        counts.push(res.done);
        launch.push(...res.launch);
        stop.push(...res.stop);
      }
      modes[concurrency] = {
        rates,
        counts,
        launchMs: median(launch),
        stopMs: median(stop),
        phaseSums,
        phaseCycles,
        fsyncs: fsyncs.count() - fsyncsBefore,
      };
    }
  } finally {
    await supervisor.close();
  }
  // Instances left in the state dir; custody's own dot-entries (.custody, .lock*, .logs, kept after stop) are not.
  const leftoverState = readdirSync(stateDir).filter((n) => !n.startsWith('.')).length;
  const { StateStore } = await import('../dist/state/store.js');
  const storeDir = mkdtempSync(join(base, 'store-'));
  const store = await timeStore(StateStore, sample, join(storeDir, 'state'), storeOps);
  process.stdout.write(
    `${JSON.stringify({ backend, modes, store, leftoverChildren: childrenOf(process.pid).length, leftoverState })}\n`,
  );
}

await runAsScript(import.meta.url, { run, report, worker });
