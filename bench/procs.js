// Process helpers shared by the benches that hold many processes: workers
// run with a raised fd limit, idle children marked so a sweep can find any
// that escaped, the machine's process limits, the file systems state dirs
// live on, and /proc scans for children and fds. No dependencies beyond
// Node itself.
import { spawn as cpSpawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { readdirSync, readFileSync, statfsSync } from 'node:fs';
import { createInterface } from 'node:readline';
import { runJson } from './lib.js';

/**
 * The command line that runs `node [execArgv] <file> ...args` under
 * `ulimit -n <nofile>` (raised as far as the hard limit allows when it
 * cannot be raised to that), so the process can hold thousands of pidfds:
 * [command, args] for spawn.
 */
export function nofileCommand(file, args = [], { execArgv = ['--expose-gc'], nofile = 65536 } = {}) {
  const script = `ulimit -n ${Number(nofile)} 2>/dev/null || ulimit -n "$(ulimit -Hn)" 2>/dev/null; exec "$@"`;
  return ['/bin/sh', ['-c', script, 'sh', process.execPath, ...execArgv, file, ...args.map(String)]];
}

/** Runs a bench module as a worker, like lib.js runWorker, but under a raised fd limit (see nofileCommand). */
export function runWorkerNofile(
  file,
  args = [],
  { env = {}, execArgv = ['--expose-gc'], timeoutMs, nofile = 65536 } = {},
) {
  const [command, argv] = nofileCommand(file, ['--worker', ...args], { execArgv, nofile });
  return runJson(command, argv, { env: { ...process.env, ...env }, timeoutMs });
}

// Room left for everything else on the machine when checking the limits.
const PROCESS_HEADROOM = 1000;

/**
 * How many more processes the machine's limits allow beside what runs now:
 * RLIMIT_NPROC (soft; counts tasks, i.e. threads, of our uid — we count all
 * tasks on the machine, which is at least that), kernel.pid_max and
 * kernel.threads-max, each minus PROCESS_HEADROOM. Limits are read, never
 * raised. Returns { count: min(wanted, room), limitedBy: why, or null }.
 */
export function processBudget(wanted) {
  const limits = [];
  try {
    const line = readFileSync('/proc/self/limits', 'utf8')
      .split('\n')
      .find((l) => l.startsWith('Max processes'));
    const soft = line?.slice('Max processes'.length).trim().split(/\s+/)[0];
    if (soft && soft !== 'unlimited') limits.push({ what: 'RLIMIT_NPROC', n: Number(soft) });
  } catch {
    /* unknown: no limit to respect */
  }
  for (const [what, file] of [
    ['pid_max', '/proc/sys/kernel/pid_max'],
    ['threads-max', '/proc/sys/kernel/threads-max'],
  ]) {
    try {
      limits.push({ what, n: Number(readFileSync(file, 'utf8').trim()) });
    } catch {
      /* unknown */
    }
  }
  let tasks = 0;
  try {
    tasks = Number(readFileSync('/proc/loadavg', 'utf8').split(' ')[3].split('/')[1]);
  } catch {
    /* unknown */
  }
  let count = wanted;
  let limitedBy = null;
  for (const { what, n } of limits) {
    const room = n - tasks - PROCESS_HEADROOM;
    if (room < count) {
      count = Math.max(0, room);
      limitedBy = `${what} ${n}, ${tasks} tasks running`;
    }
  }
  return { count, limitedBy };
}

// statfs(2) f_type values (linux/magic.h), as `stat -f` names them.
const FS_MAGIC = {
  16914836: 'tmpfs',
  61267: 'ext2/3/4',
  1481003842: 'xfs',
  2435016766: 'btrfs',
  2035054128: 'overlayfs',
};

/**
 * The file system a path lives on: the type statfs(2) reports (what
 * `stat -f` prints) and, from /proc/self/mounts (longest matching mount
 * point), the mount's type and device, e.g. "ext4 on /dev/vda".
 */
export function fsType(path) {
  let magic = null;
  try {
    const { type } = statfsSync(path);
    magic = FS_MAGIC[type] ?? `0x${type.toString(16)}`;
  } catch {
    // no such path: the mount table alone
  }
  let best = { dir: '', type: magic ?? 'unknown', dev: '' };
  try {
    for (const line of readFileSync('/proc/self/mounts', 'utf8').split('\n')) {
      const [dev, dir, type] = line.split(' ');
      if (!dir) continue;
      if ((path === dir || path.startsWith(dir.endsWith('/') ? dir : `${dir}/`)) && dir.length >= best.dir.length)
        best = { dir, type, dev };
    }
  } catch {
    // no /proc: statfs alone
  }
  return {
    tmpfs: magic === 'tmpfs' || best.type === 'tmpfs',
    name: `${best.type}${best.dev && best.type !== 'tmpfs' ? ` on ${best.dev}` : ''}`,
  };
}

/**
 * Where a bench puts a state dir that must be on a disk (fsync waits for
 * the device): the first of /var/tmp, /tmp that is not a tmpfs. The
 * benches write only there, under /dev/shm and under bench/.
 */
export function diskBase() {
  for (const base of ['/var/tmp', '/tmp']) {
    try {
      if (!fsType(base).tmpfs) return base;
    } catch {
      // not there
    }
  }
  return '/var/tmp';
}

/**
 * Starts a holder: a child that keeps processes for the bench and talks in
 * JSON lines, requests on its stdin and answers on its stdout, and that on
 * EOF of its stdin (the bench ending it, or dying) ends what it holds and
 * exits. Returns { pid, send(msg), next(timeoutMs, what) -> its next
 * message, stop(timeoutMs) -> { status, messages } }: stop closes its stdin
 * and waits for it to exit (SIGKILL after timeoutMs), with every message it
 * printed that next() did not take.
 */
export function startHolder(command, args, { env = process.env, what = 'holder' } = {}) {
  const child = cpSpawn(command, args, { stdio: ['pipe', 'pipe', 'inherit'], env });
  // 'close', not 'exit': by then every line it printed has been read.
  const exited = new Promise((resolve) => {
    child.once('close', (code, signal) => resolve({ code, signal }));
    child.once('error', (err) => resolve({ code: null, signal: null, error: err.message }));
  });
  // A holder that died has no reader on its stdin: its EPIPE is not ours to throw.
  child.stdin.on('error', () => {});
  const lines = createInterface({ input: child.stdout });
  const messages = [];
  let wake = null;
  lines.on('line', (l) => {
    try {
      messages.push(JSON.parse(l));
    } catch {
      messages.push({ error: `${what} printed ${JSON.stringify(l.slice(0, 200))}` });
    }
    wake?.();
  });
  const next = async (timeoutMs) => {
    let timer;
    const timeout = new Promise((r) => (timer = setTimeout(() => r({ timeout: true }), timeoutMs)));
    try {
      while (messages.length === 0) {
        const done = await Promise.race([exited.then((s) => ({ exit: s })), new Promise((r) => (wake = r)), timeout]);
        if (messages.length > 0) break;
        if (done?.exit) throw new Error(`${what} exited ${JSON.stringify(done.exit)} before answering`);
        if (done?.timeout) throw new Error(`${what} did not answer within ${timeoutMs} ms`);
      }
      return messages.shift();
    } finally {
      clearTimeout(timer);
    }
  };
  const send = (msg) => child.stdin.write(`${JSON.stringify(msg)}\n`);
  const stop = async (timeoutMs = 60_000) => {
    child.stdin.end();
    const timer = setTimeout(() => child.kill('SIGKILL'), timeoutMs);
    try {
      return { status: await exited, messages };
    } finally {
      clearTimeout(timer);
    }
  };
  return { pid: child.pid, send, next, stop };
}

/**
 * SIGKILLs each of `pids` that still carries `marker` in its argv (a pid
 * reused by someone else's process is left alone) and returns how many it
 * signalled.
 */
export function killMarked(pids, marker) {
  let n = 0;
  for (const p of pids) {
    try {
      if (!readFileSync(`/proc/${p}/cmdline`, 'latin1').split('\0').includes(marker)) continue;
      process.kill(p, 'SIGKILL');
      n++;
    } catch {
      // gone already
    }
  }
  return n;
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
  return readdirSync('/proc')
    .filter((e) => /^\d+$/.test(e))
    .map(Number);
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
