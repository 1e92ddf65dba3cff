// The benchmark harness behind `npm run bench`.
//
//   node --expose-gc bench/run.js [--quick]
//
// Runs every bench module in BENCHES, prints each one's table and writes
// bench/results.json (machine info plus every bench's results). Targets are
// reported, never enforced: a missed target does not fail the run, in quick
// or full mode, because the machines this runs on are noisy. Only a bench
// that cannot run at all makes the exit status non-zero.
//
// A bench module exports:
//   name                      its key in results.json
//   run({ quick }) -> results a JSON-serializable object (quick: a few seconds)
//   report(results) -> string  optional; the table to print
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { benchDir, machineInfo } from './lib.js';

// Adding a bench is adding its module here.
const BENCHES = [
  './identity.js',
  './spawn.js',
  './exits.js',
  './memory.js',
  './lifecycle.js',
  './scan.js',
  './recover.js',
  './drain.js',
  './restart.js',
  './exec-attrs.js',
];

const quick = process.argv.includes('--quick');
const machine = machineInfo();
const results = { mode: quick ? 'quick' : 'full', machine, benches: {} };

console.log(
  `custody benchmarks (${results.mode}): ${machine.cpu}, ${machine.nproc} CPUs, Linux ${machine.kernel}, Node ${machine.node}, load ${machine.loadavg.join(' ')}\n`,
);

let failed = 0;
for (const spec of BENCHES) {
  const mod = await import(spec);
  const key = mod.name ?? spec.replace(/^\.\/|\.js$/g, '');
  const started = performance.now();
  try {
    const res = await mod.run({ quick });
    const seconds = (performance.now() - started) / 1000;
    results.benches[key] = { ...res, seconds };
    console.log(typeof mod.report === 'function' ? mod.report(res) : JSON.stringify(res, null, 2));
    console.log(`  (${seconds.toFixed(1)} s)\n`);
  } catch (err) {
    failed++;
    results.benches[key] = { error: String(err?.stack ?? err) };
    console.error(`${key}: FAILED\n${err?.stack ?? err}\n`);
  }
}

const out = join(benchDir, 'results.json');
writeFileSync(out, `${JSON.stringify(results, null, 2)}\n`);
console.log(`results written to ${out}`);

// Missed targets are data; only a bench that could not run is a failure.
if (failed > 0) process.exitCode = 1;
