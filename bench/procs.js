// Process helpers shared by the exits, memory and lifecycle benches: workers
// run with a raised fd limit, idle children marked so a sweep can find any
// that escaped, and /proc scans for children and fds. No dependencies
// beyond Node itself.
import { randomBytes } from 'node:crypto';
import { readdirSync, readFileSync } from 'node:fs';
import { runJson } from './lib.js';

/**
 * Runs a bench module as a worker, like lib.js runWorker, but under
 * `ulimit -n <nofile>` (raised as far as the hard limit allows when it
 * cannot be raised to that), so a worker can hold thousands of pidfds.
 */
export function runWorkerNofile(file, args = [], { env = {}, execArgv = ['--expose-gc'], timeoutMs, nofile = 65536 } = {}) {
  const script = `ulimit -n ${Number(nofile)} 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null; exec "$@"`;
  return runJson('/bin/sh', ['-c', script, 'sh', process.execPath, ...execArgv, file, '--worker', ...args.map(String)], {
    env: { ...process.env, ...env },
    timeoutMs,
  });
}

/** A marker no other process carries: idle children get it in their argv. */
export function newMarker(what) {
  return `custody-bench-${what}-${process.pid}-${randomBytes(4).toString('hex')}`;
}

/** Fields of /proc/<pid>/stat after comm (which may hold spaces and parentheses). */
function statFields(pid) {
  const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
  return stat.slice(stat.lastIndexOf(')') + 2).split(' ');
}

function pids() {
  return readdirSync('/proc').filter((e) => /^\d+$/.test(e)).map(Number);
}

/** The pids whose parent is `pid`, from /proc (zombies included). */
export function childrenOf(pid = process.pid) {
  const out = [];
  for (const p of pids()) {
    try {
      if (Number(statFields(p)[1]) === pid) out.push(p);
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

/** The live processes whose argv carries `marker`. */
export function withMarker(marker) {
  const out = [];
  for (const p of pids()) {
    try {
      if (readFileSync(`/proc/${p}/cmdline`, 'latin1').split('\0').includes(marker)) out.push(p);
    } catch {
      // gone meanwhile
    }
  }
  return out;
}

/**
 * Kills (SIGKILL) every process whose argv carries `marker` and returns how
 * many there were. The benches' idle children die with their worker
 * (PR_SET_PDEATHSIG), so this should find none; it is the safety net.
 */
export function sweepMarker(marker) {
  const found = withMarker(marker);
  for (const p of found) {
    try {
      process.kill(p, 'SIGKILL');
    } catch {
      // already gone
    }
  }
  return found.length;
}

/** How many fds this process holds. */
export function fdCount() {
  return readdirSync('/proc/self/fd').length - 1; // minus the one readdir used
}

/**
 * CPU time of the machine and of this process with its reaped descendants
 * (workers, and through them their children), in USER_HZ ticks. Take one
 * before and one after a bench and hand both to otherCpuShare.
 */
export function cpuTicks() {
  try {
    const cpu = readFileSync('/proc/stat', 'utf8').split('\n')[0].trim().split(/\s+/).slice(1).map(Number);
    // user nice system idle iowait irq softirq steal: everything but idle and iowait is busy.
    const busy = cpu[0] + cpu[1] + cpu[2] + cpu[5] + cpu[6] + (cpu[7] || 0);
    // utime, stime, cutime, cstime: fields 14-17 of /proc/self/stat.
    const f = statFields('self').map(Number);
    return { ms: performance.now(), busy, ours: f[11] + f[12] + f[13] + f[14] };
  } catch {
    return null;
  }
}

/**
 * The share of the machine's CPU capacity that other work used between two
 * cpuTicks(): on a 2-CPU machine anyone else's busy CPU slows the children
 * we wait for and makes every number noisy. null where /proc cannot say.
 */
export function otherCpuShare(before, after, ncpu) {
  if (!before || !after || after.ms <= before.ms) return null;
  const hz = 100; // USER_HZ, the unit of both files on every Linux
  const capacity = ((after.ms - before.ms) / 1000) * hz * ncpu;
  const others = after.busy - before.busy - (after.ours - before.ours);
  return Math.max(0, Math.min(1, others / capacity));
}

/** One report line about the machine's other work, with a warning when it was busy. */
export function noiseLine(otherCpu, loadavg) {
  const load = loadavg ? `; load average before ${loadavg.before.join(' ')}, after ${loadavg.after.join(' ')}` : '';
  if (otherCpu === null || otherCpu === undefined) return `  other work on the machine: unknown${load}`;
  return (
    `  other work on the machine used ${(otherCpu * 100).toFixed(0)}% of its CPU time during the run${load}` +
    (otherCpu > 0.1 ? '\n  (the machine was busy: the numbers are noisy, rerun on an idle machine)' : '')
  );
}
