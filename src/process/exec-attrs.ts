/**
 * Exec attributes: what a service manager sets on a daemon between fork and
 * exec (systemd's User=, Group=, SupplementaryGroups=, LimitNOFILE=,
 * OOMScoreAdjust=, UMask=, NoNewPrivileges=). Their shapes and their checks,
 * one place for spawn() and LaunchSpec; the backends apply them, the native
 * child by raw syscalls (native/child.cc), the js backend where
 * child_process and its exec wrapper can (src/backend/js-exec.ts).
 */
import { type ExecAttrs, RLIMIT_NAMES, type RlimitName } from '../backend/types.js';
import { InvalidArgError } from '../errors.js';
import { assertKnownKeys, describe } from '../validate.js';

/** The credentials the program runs with: setgroups(groups), setresgid(gid), setresuid(uid), in that order. */
export interface RunAs {
  /** The real, effective and saved uid (0 to 4294967294). */
  uid: number;
  /** The real, effective and saved gid (0 to 4294967294). */
  gid: number;
  /** Supplementary groups; none by default (a service manager's initgroups is the caller's to do). */
  groups?: number[];
}

/** One limit: soft and hard alike, or [soft, hard]. `Infinity` is unlimited (RLIM_INFINITY). */
export type RlimitValue = number | [soft: number, hard: number];

/** Resource limits by name (RLIMIT_NOFILE is `nofile`); bytes for memlock, core, as, fsize and stack, seconds for cpu. */
export type Rlimits = Partial<Record<RlimitName, RlimitValue>>;

/** What a spawn (and a LaunchSpec) may give the program besides its argv, environment and stdio. */
export interface ExecAttributes {
  /** The uid, gid and supplementary groups it runs as (needs CAP_SETUID and CAP_SETGID). */
  runAs?: RunAs;
  /** Its umask, 0 to 0o777. */
  umask?: number;
  /** Its resource limits; one above the hard limit needs CAP_SYS_RESOURCE. */
  rlimits?: Rlimits;
  /** Written whenever given (-1000 to 1000), so the agent's own never reaches the program; lowering needs CAP_SYS_RESOURCE. */
  oomScoreAdj?: number;
  /** prctl(PR_SET_NO_NEW_PRIVS): no exec it makes can gain privileges (setuid bits, file capabilities). */
  noNewPrivileges?: boolean;
}

/** The keys of ExecAttributes, for the option checks of spawn() and LaunchSpec. */
export const EXEC_ATTRIBUTE_KEYS: Record<keyof ExecAttributes, true> = {
  runAs: true,
  umask: true,
  rlimits: true,
  oomScoreAdj: true,
  noNewPrivileges: true,
};
const RUN_AS_KEYS: Record<keyof RunAs, true> = { uid: true, gid: true, groups: true };
const RLIMIT_KEYS = Object.fromEntries(RLIMIT_NAMES.map((n) => [n, true])) as Record<RlimitName, true>;

/** The largest uid or gid: (uid_t)-1 means "unchanged" to setresuid. */
const MAX_ID = 2 ** 32 - 2;
/** NGROUPS_MAX of the kernel. */
const MAX_GROUPS = 65536;

const isId = (v: unknown): v is number => Number.isSafeInteger(v) && (v as number) >= 0 && (v as number) <= MAX_ID;
const isLimit = (v: unknown): v is number =>
  v === Number.POSITIVE_INFINITY || (Number.isSafeInteger(v) && (v as number) >= 0);

/**
 * The exec attributes of `o` checked and put in the backends' form; null when none is given. Any bad field is
 * ERR_CUSTODY_INVALID_ARG naming it (`<where>.rlimits.nofile`), before anything exists.
 */
export function execAttrs(o: ExecAttributes, where: string): ExecAttrs | null {
  if (
    o.runAs === undefined &&
    o.umask === undefined &&
    o.rlimits === undefined &&
    o.oomScoreAdj === undefined &&
    o.noNewPrivileges === undefined
  ) {
    return null;
  }
  const bad = (field: string, must: string, v: unknown) =>
    new InvalidArgError(`${where}.${field} must be ${must}, got ${describe(v)}`);
  let runAs: ExecAttrs['runAs'] = null;
  if (o.runAs !== undefined) {
    const r = o.runAs;
    if (!r || typeof r !== 'object') throw bad('runAs', 'an object { uid, gid, groups? }', r);
    assertKnownKeys(r, RUN_AS_KEYS, `${where}.runAs`);
    if (!isId(r.uid)) throw bad('runAs.uid', `an integer from 0 to ${MAX_ID}`, r.uid);
    if (!isId(r.gid)) throw bad('runAs.gid', `an integer from 0 to ${MAX_ID}`, r.gid);
    const groups = r.groups ?? [];
    if (!Array.isArray(groups) || groups.length > MAX_GROUPS || !groups.every(isId)) {
      throw bad('runAs.groups', `an array of at most ${MAX_GROUPS} gids (0 to ${MAX_ID})`, r.groups);
    }
    runAs = { uid: r.uid, gid: r.gid, groups: [...groups] };
  }
  if (o.umask !== undefined && !(Number.isInteger(o.umask) && o.umask >= 0 && o.umask <= 0o777)) {
    throw bad('umask', 'an integer from 0 to 0o777', o.umask);
  }
  if (
    o.oomScoreAdj !== undefined &&
    !(Number.isInteger(o.oomScoreAdj) && o.oomScoreAdj >= -1000 && o.oomScoreAdj <= 1000)
  ) {
    throw bad('oomScoreAdj', 'an integer from -1000 to 1000', o.oomScoreAdj);
  }
  if (o.noNewPrivileges !== undefined && typeof o.noNewPrivileges !== 'boolean') {
    throw bad('noNewPrivileges', 'a boolean', o.noNewPrivileges);
  }
  const rlimits: Array<ExecAttrs['rlimits'][number]> = [];
  if (o.rlimits !== undefined) {
    const l = o.rlimits;
    if (!l || typeof l !== 'object' || Array.isArray(l)) throw bad('rlimits', 'an object of limits by name', l);
    assertKnownKeys(l, RLIMIT_KEYS, `${where}.rlimits`);
    for (const name of RLIMIT_NAMES) {
      const v = l[name];
      if (v === undefined) continue;
      const [soft, hard] = Array.isArray(v) && v.length === 2 ? v : [v, v];
      const must = 'a limit (an integer from 0, or Infinity) or [soft, hard] with soft <= hard';
      if (!isLimit(soft) || !isLimit(hard) || soft > hard) throw bad(`rlimits.${name}`, must, v);
      rlimits.push({ name, soft, hard });
    }
  }
  return {
    runAs,
    umask: o.umask ?? null,
    rlimits,
    oomScoreAdj: o.oomScoreAdj ?? null,
    noNewPrivileges: o.noNewPrivileges === true,
  };
}
