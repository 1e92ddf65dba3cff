/**
 * The js backend's exec attributes. child_process sets the uid and gid
 * (libuv: setgroups(0), setgid, setuid, then exec) and can do nothing else
 * between fork and exec; the rest is the exec wrapper's (/bin/sh: `ulimit`,
 * oom_score_adj, `umask`), which runs after that uid change. What neither
 * can give is ERR_CUSTODY_UNSUPPORTED, before anything runs; a step the
 * wrapper tries and the kernel refuses ends it with status 126, and the
 * program never runs.
 */
import { UnsupportedError } from '../errors.js';
import { readProcText } from './procview.js';
import { type ExecAttrs, RLIMIT_NAMES, type RlimitName } from './types.js';

/**
 * `ulimit`'s flag and unit for each limit, the same in dash and in bash as
 * sh (POSIX mode); nproc has none in common (dash -p, bash -u).
 */
const ULIMIT: Record<RlimitName, { flag: string; unit: number } | null> = {
  nofile: { flag: '-n', unit: 1 },
  cpu: { flag: '-t', unit: 1 },
  stack: { flag: '-s', unit: 1024 },
  memlock: { flag: '-l', unit: 1024 },
  as: { flag: '-v', unit: 1024 },
  core: { flag: '-c', unit: 512 },
  fsize: { flag: '-f', unit: 512 },
  nproc: null,
};

/** /proc/self/limits' row for each limit. */
const LIMITS_ROW: Record<RlimitName, string> = {
  nofile: 'Max open files',
  cpu: 'Max cpu time',
  stack: 'Max stack size',
  memlock: 'Max locked memory',
  as: 'Max address space',
  core: 'Max core file size',
  fsize: 'Max file size',
  nproc: 'Max processes',
};

/** The exec attributes this backend applies (Capabilities.exec). */
export const JS_EXEC_SUPPORT = {
  runAs: true,
  umask: true,
  oomScoreAdj: true,
  noNewPrivileges: false,
  rlimits: RLIMIT_NAMES.filter((n) => ULIMIT[n] !== null),
  reason:
    'child_process sets only the uid and gid (no supplementary groups), and its exec wrapper runs as that uid: ' +
    'no noNewPrivileges (no prctl), no nproc (no ulimit flag dash and bash share), limits in ulimit units ' +
    '(memlock, as, stack: KiB; core, fsize: 512 bytes); with runAs no uid or gid above 2^31 - 1, no cgroup, ' +
    'no limit above our hard one, ' +
    'no oomScoreAdj below ours',
};

/** This process's hard limit of `name` (Infinity for unlimited). */
function ourHardLimit(name: RlimitName): number {
  const row = new RegExp(`^${LIMITS_ROW[name]}\\s+\\S+\\s+(\\S+)`, 'm').exec(readProcText('/proc/self/limits'));
  return row?.[1] === undefined || row[1] === 'unlimited' ? Number.POSITIVE_INFINITY : Number(row[1]);
}

/** Throws ERR_CUSTODY_UNSUPPORTED for what this backend cannot apply; `cgroup`: the child is placed in one. */
export function checkJsExec(x: ExecAttrs, cgroup: boolean): void {
  if (x.noNewPrivileges) unsupportedThrow('set noNewPrivileges (the shell has no prctl)');
  for (const l of x.rlimits) {
    const u = ULIMIT[l.name];
    if (!u) unsupportedThrow(`set rlimits.${l.name} (no ulimit flag that dash and bash share)`);
    for (const v of [l.soft, l.hard]) {
      if (v !== Number.POSITIVE_INFINITY && v % u.unit !== 0)
        unsupportedThrow(`set rlimits.${l.name} to ${v} (ulimit counts it in units of ${u.unit} bytes)`);
    }
  }
  if (!x.runAs) return;
  // child_process takes a uid and a gid as int32 only.
  if (x.runAs.uid > 2 ** 31 - 1 || x.runAs.gid > 2 ** 31 - 1)
    unsupportedThrow('run as a uid or gid above 2147483647 (child_process takes an int32)');
  // child_process drops the uid before the wrapper runs: the wrapper can do only what that uid may.
  if (x.runAs.groups.length > 0) unsupportedThrow('set runAs.groups (libuv clears the supplementary groups)');
  if (cgroup) unsupportedThrow('place a runAs child in a cgroup (its wrapper runs as runAs.uid)');
  for (const l of x.rlimits) {
    if (l.hard > ourHardLimit(l.name))
      unsupportedThrow(
        `raise rlimits.${l.name} above this process's hard limit with runAs (its wrapper runs as runAs.uid)`,
      );
  }
  if (x.oomScoreAdj !== null && x.oomScoreAdj < Number(readProcText('/proc/self/oom_score_adj').trim()))
    unsupportedThrow("lower oomScoreAdj below this process's with runAs (its wrapper runs as runAs.uid)");
}

function unsupportedThrow(why: string): never {
  throw new UnsupportedError(`the js backend cannot ${why}; use the native backend (capabilities().exec)`);
}

/** Whether the wrapper has something to do for x (runAs alone is child_process's). */
export function needsWrapper(x: ExecAttrs | null | undefined): boolean {
  return !!x && (x.rlimits.length > 0 || x.oomScoreAdj !== null || x.umask !== null);
}

/**
 * The wrapper's steps for x, in the native child's order (rlimits, oom_score_adj, umask), each ending the
 * wrapper with 126 when it fails. Every value is an integer checked by src/process/exec-attrs.ts: nothing of
 * the caller's text reaches the script.
 */
export function execSteps(x: ExecAttrs | null | undefined): string {
  if (!x) return '';
  let out = '';
  const value = (v: number, unit: number) => (v === Number.POSITIVE_INFINITY ? 'unlimited' : String(v / unit));
  for (const l of x.rlimits) {
    const u = ULIMIT[l.name];
    if (!u) continue; // refused by checkJsExec
    // Both to the hard value first (lowering the hard one below the soft one alone is EINVAL), then the soft.
    out += `ulimit ${u.flag} ${value(l.hard, u.unit)} || exit 126; `;
    if (l.soft !== l.hard) out += `ulimit -S ${u.flag} ${value(l.soft, u.unit)} || exit 126; `;
  }
  if (x.oomScoreAdj !== null) out += `echo ${x.oomScoreAdj} >/proc/self/oom_score_adj || exit 126; `;
  if (x.umask !== null) out += `umask ${x.umask.toString(8).padStart(4, '0')} || exit 126; `;
  return out;
}
