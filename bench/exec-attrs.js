// exec-attrs: what the exec attributes cost a native spawn. /bin/true spawned
// and reaped one after another through custody's spawn(), with every
// attribute set (runAs, all eight rlimits, oomScoreAdj, umask,
// noNewPrivileges) against none, in the same worker, rounds of the two
// interleaved so that a burst of someone else's work lands on both. The
// attributes are those the agent already has (its own uid, gid and groups,
// limits and oom_score_adj), so every step runs and none is refused; runAs
// only as root (setgroups needs CAP_SETGID), which the table says.
//
//   node bench/exec-attrs.js [--quick]          standalone: prints the table
//   import { run, report } from './exec-attrs.js'  for bench/run.js
//   node bench/exec-attrs.js --worker <round ms> <rounds> <warmup ms>
import { readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';
import { formatRatio, formatTable, formatTargets, runAsScript, runWorker, summarize } from './lib.js';

export const name = 'exec-attrs';

// every attribute <= 1.15 x none: seven syscalls and an open/write/close in the child, next to a clone and an exec.
const ALL_OVER_NONE_MAX = 1.15;

const PARAMS = {
  quick: { roundMs: 200, rounds: 5, warmupMs: 100 },
  full: { roundMs: 500, rounds: 12, warmupMs: 300 },
};

export async function run({ quick = false } = {}) {
  const { roundMs, rounds, warmupMs } = PARAMS[quick ? 'quick' : 'full'];
  const res = await runWorker(fileURLToPath(import.meta.url), [roundMs, rounds, warmupMs], {
    env: { CUSTODY_BACKEND: 'native' },
    timeoutMs: 60_000 + 4 * rounds * roundMs,
  });
  const none = summarize(res.none);
  const all = summarize(res.all);
  // Time per spawn, every attribute over none: the inverse of the rates.
  const ratio = none.median / all.median;
  return { quick, none, all, ratio, runAs: res.runAs };
}

export function report(r) {
  const rows = [
    ['none', Math.round(r.none.median), `${Math.round(r.none.min)}-${Math.round(r.none.max)}`],
    [
      `every attribute${r.runAs ? '' : ' (no runAs: not root)'}`,
      Math.round(r.all.median),
      `${Math.round(r.all.min)}-${Math.round(r.all.max)}`,
    ],
  ];
  const target = {
    description: 'native spawn, every attribute / none (time per spawn)',
    value: r.ratio,
    op: '<=',
    limit: ALL_OVER_NONE_MAX,
    met: r.ratio <= ALL_OVER_NONE_MAX,
  };
  return [
    'exec attributes: /bin/true spawned and reaped sequentially (native), spawns per second',
    formatTable(['attributes', 'median', 'range'], rows),
    `  ratio ${formatRatio(r.ratio)}`,
    formatTargets([target], { quick: r.quick }),
  ].join('\n');
}

/** The agent's own limits, as /proc/self/limits gives them (Infinity for unlimited). */
function ownLimits() {
  const text = readFileSync('/proc/self/limits', 'utf8');
  const rows = {
    nofile: 'Max open files',
    memlock: 'Max locked memory',
    core: 'Max core file size',
    nproc: 'Max processes',
    as: 'Max address space',
    fsize: 'Max file size',
    stack: 'Max stack size',
    cpu: 'Max cpu time',
  };
  const value = (v) => (v === 'unlimited' ? Number.POSITIVE_INFINITY : Number(v));
  const out = {};
  for (const [key, row] of Object.entries(rows)) {
    const m = new RegExp(`^${row}\\s+(\\S+)\\s+(\\S+)`, 'm').exec(text);
    out[key] = [value(m[1]), value(m[2])];
  }
  return out;
}

async function worker([roundMs, rounds, warmupMs]) {
  const { spawn } = await import('../dist/index.js');
  const root = process.getuid() === 0;
  const all = {
    ...(root ? { runAs: { uid: 0, gid: 0, groups: process.getgroups() } } : {}),
    rlimits: ownLimits(),
    oomScoreAdj: Number(readFileSync('/proc/self/oom_score_adj', 'utf8').trim()),
    umask: 0o022,
    noNewPrivileges: true,
  };
  const round = async (options, ms) => {
    const start = performance.now();
    let n = 0;
    while (performance.now() - start < ms) {
      await spawn('/bin/true', [], options).exited;
      n++;
    }
    return (n * 1000) / (performance.now() - start);
  };
  await round({}, Number(warmupMs));
  await round(all, Number(warmupMs));
  const out = { none: [], all: [], runAs: root };
  for (let i = 0; i < Number(rounds); i++) {
    // Alternating which goes first, so neither always follows the other.
    const order = i % 2 ? ['all', 'none'] : ['none', 'all'];
    for (const k of order) out[k].push(await round(k === 'all' ? all : {}, Number(roundMs)));
  }
  console.log(JSON.stringify(out));
}

await runAsScript(import.meta.url, { run, report, worker });
