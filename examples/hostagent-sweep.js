// A Lima-style host-agent sweep (`node examples/hostagent-sweep.js`).
//
// Lima runs one host agent per VM instance, `limactl hostagent --pidfile
// <dir>/ha.pid --socket <dir>/ha.sock <instance>`. When the agent that
// started them crashes, they are left behind, re-parented to init. Ending
// them by name (`pkill -f hostagent`) would also end instance `default-2`'s
// agent and an operator's `tail -f` of a log; custody's sweep ends exactly
// the argv it is given, our uid only, each process re-checked under its
// pidfd before it is signalled.
//
// Here python stands in for limactl (its argv is what a sweep matches on).
import { execFileSync, spawn } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { sweep } from 'custody';

const PYTHON = execFileSync('python3', ['-c', 'import sys; print(sys.executable)'], { encoding: 'utf8' }).trim();
const HOSTAGENT = 'import time; time.sleep(300)';
const home = mkdtempSync(join(tmpdir(), 'custody-lima-'));
const agentArgv = (instance) => {
  const dir = join(home, instance);
  return [
    PYTHON,
    '-c',
    HOSTAGENT,
    'hostagent',
    '--pidfile',
    join(dir, 'ha.pid'),
    '--socket',
    join(dir, 'ha.sock'),
    instance,
  ];
};

/** Starts argv as an orphan (its parent exits at once, as a crashed agent's children are left) and returns its pid. */
async function orphan(argv) {
  const pidFile = join(home, `orphan-${Math.random().toString(16).slice(2)}`);
  spawn('/bin/sh', ['-c', '"$@" >/dev/null 2>&1 </dev/null & echo $! > "$0"', pidFile, ...argv], { stdio: 'ignore' });
  for (let i = 0; i < 500; i++) {
    try {
      const pid = Number(readFileSync(pidFile, 'utf8'));
      if (pid) return pid;
    } catch {
      // not written yet
    }
    await sleep(10);
  }
  throw new Error(`${argv[0]} did not start`);
}

writeFileSync(join(home, 'ha.stderr.log'), '');
const left = {
  default: await orphan(agentArgv('default')),
  'default-2': await orphan(agentArgv('default-2')),
  tail: await orphan(['tail', '-f', join(home, 'ha.stderr.log'), 'hostagent', 'default']),
};
await sleep(100); // let each exec
console.log(`left behind by a crashed agent: ${JSON.stringify(left)}`);

const pattern = { argv: agentArgv('default'), executable: PYTHON };
const dry = await sweep({ ...pattern, dryRun: true });
console.log(`dry run matches ${dry.matched.map((p) => p.pid).join(', ') || 'nothing'} (only instance "default")`);
const result = await sweep(pattern);
console.log(
  `swept: terminated ${result.terminated.map((p) => p.pid).join(', ') || '-'}, killed ${result.killed.length}, survivors ${result.survivors.length}`,
);
// A supervisor does the same while idle: Supervisor.open({ stateDir, sweep: { intervalMs: 60_000, patterns: [pattern] } }).

const alive = (pid) => {
  try {
    return readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1][0] !== 'Z';
  } catch {
    return false;
  }
};
console.log(`still running, untouched: default-2 ${alive(left['default-2'])}, tail ${alive(left.tail)}`);
// This example's own clean-up: the two it was not meant to sweep.
for (const pid of [left['default-2'], left.tail]) process.kill(pid, 'SIGTERM');
for (let i = 0; i < 200 && (alive(left['default-2']) || alive(left.tail)); i++) await sleep(10);
rmSync(home, { recursive: true, force: true });
if (alive(left.default) || result.matched.length !== 1) process.exitCode = 1;
