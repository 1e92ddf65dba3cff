/**
 * Instance cgroups (cgroup v2). A supervisor given `cgroup: { root }` keeps
 * its instances in a sub-cgroup of the root named for its state dir (a root
 * may serve several supervisors; each touches only its own), one cgroup per
 * launch named `<id>.<token prefix>` (no cgroupfs file has such a name, and
 * no relaunch reuses one). Every child is placed there before it execs
 * (src/backend), so the cgroup is the instance: what it forks, double-forks
 * or setsids stays in it, and no bystander can be in it.
 *
 * This module owns the cgroupfs side: validating and creating the root,
 * limits, membership lists, cgroup.kill, cgroup.freeze, cgroup.events,
 * usage, removal; src/process/cgroup-tree.ts, that an instance cgroup is a
 * tree (membership below it, the bounded walk, removal children first). Who is signalled when is decided in src/process/tree.ts and
 * src/supervisor.ts; who is ours, in src/process/ownership.ts.
 */
import {
  accessSync,
  closeSync,
  constants as fsc,
  existsSync,
  lstatSync,
  mkdirSync,
  openSync,
  readdirSync,
  readFileSync,
  realpathSync,
  rmdirSync,
  statfsSync,
  statSync,
  writeSync,
} from 'node:fs';
import * as path from 'node:path';
import { backend, cgroupCapabilities } from '../backend/index.js';
import {
  CGROUP2_SUPER_MAGIC,
  cgroup2Mounts,
  cgroupFeatures,
  hierarchyPath,
  mountOf,
  readControllers,
  type MountEntry,
} from '../backend/cgroupv2.js';
import { BadCgroupError, CgroupTimeoutError, InvalidArgError, UnsupportedError } from '../errors.js';
import { backoff, pacedUntil } from '../timing.js';
import { type CgroupRecordFile, claimOwnCgroup, guardCgroup, ownCgroupName, recordedCgroup } from './cgroup-guard.js';
import { type CgroupLeftover, removeSubtree, subtree } from './cgroup-tree.js';
import type { CgroupCapabilities } from '../types.js';

/** Supervisor.open's `cgroup` option. */
export interface CgroupOptions {
  /** An absolute cgroup v2 directory the supervisor may create cgroups in; created if absent. */
  root: string;
}

/** Resource limits of one instance's cgroup (the root must offer the controller: memory, pids, cpu). */
export interface CgroupLimits {
  /** memory.max in bytes, or 'max'. */
  memoryMax?: number | 'max';
  /** pids.max: processes and threads, or 'max'. */
  pidsMax?: number | 'max';
  /** cpu.max: `quotaUsec` of CPU time per `periodUsec` (default 100000), or 'max'. */
  cpuMax?: { quotaUsec: number | 'max'; periodUsec?: number };
}

/** What `supervisor.usage(id)` reads from an instance's cgroup. */
export interface CgroupUsage {
  /** CPU time of every process the instance ever ran, in microseconds (cpu.stat usage_usec). */
  cpuUsec: number;
  /** memory.current; null where the memory controller is not on for instances. */
  memoryBytes: number | null;
  /** Processes in the cgroup now (cgroup.procs). */
  pids: number;
}

const LIMIT_CONTROLLER = { memoryMax: 'memory', pidsMax: 'pids', cpuMax: 'cpu' } as const;
/** Turned on at open where the root offers them: accounting only (no limit until one is asked for). */
const ACCOUNTING = ['memory', 'pids'];
const TOKEN_PREFIX = 12;

const code = (err: unknown) => (err as NodeJS.ErrnoException)?.code;

/** Writes one value to a cgroupfs file (no O_CREAT, no O_TRUNC: cgroupfs files are written, not replaced). */
function writeFile(file: string, text: string): void {
  const fd = openSync(file, fsc.O_WRONLY);
  try {
    writeSync(fd, text);
  } finally {
    closeSync(fd);
  }
}

/** `key value` lines (cgroup.events, cpu.stat) as a map. */
/**
 * The OOM kills a cgroup's memory.events counted (`oom_kill` + `oom_group_kill`; in it and below it). 0
 * where there is no memory.events: the memory controller is not enabled for it (as on a host whose cgroup
 * v2 has none), or it is gone. An instance cgroup is made for one launch, so every kill it counts is the
 * instance's.
 */
export function oomKillsIn(dir: string): number {
  let text: string;
  try {
    text = readFileSync(path.join(dir, 'memory.events'), 'latin1');
  } catch (err) {
    if (code(err) === 'ENOENT' || code(err) === 'ENODEV') return 0;
    throw err;
  }
  const events = parseKeyed(text);
  return (events.get('oom_kill') ?? 0) + (events.get('oom_group_kill') ?? 0);
}

export function parseKeyed(text: string): Map<string, number> {
  const out = new Map<string, number>();
  for (const line of text.split('\n')) {
    const [k, v] = line.trim().split(/\s+/);
    if (k && v !== undefined && /^\d+$/.test(v)) out.set(k, Number(v));
  }
  return out;
}

/** The instance cgroup name of a launch: `<id>.<first 12 hex digits of its token>`. */
export function cgroupName(id: string, token: string): string {
  return `${id}.${token.slice(0, TOKEN_PREFIX)}`;
}

/** Validates launch limits (shape and range); which controllers they need. */
export function validateLimits(limits: unknown): CgroupLimits | undefined {
  if (limits === undefined) return undefined;
  if (!limits || typeof limits !== 'object')
    throw new InvalidArgError('limits must be { memoryMax?, pidsMax?, cpuMax? }');
  const l = limits as Record<string, unknown>;
  for (const k of Object.keys(l))
    if (!(k in LIMIT_CONTROLLER)) throw new InvalidArgError(`unknown limit ${JSON.stringify(k)}`);
  const count = (v: unknown, what: string, min: number) => {
    if (v === undefined || v === 'max') return;
    if (typeof v !== 'number' || !Number.isSafeInteger(v) || v < min)
      throw new InvalidArgError(`${what} must be 'max' or an integer >= ${min}`);
  };
  count(l.memoryMax, 'limits.memoryMax', 1);
  count(l.pidsMax, 'limits.pidsMax', 1);
  if (l.cpuMax !== undefined) {
    const c = l.cpuMax as Record<string, unknown> | null;
    if (!c || typeof c !== 'object') throw new InvalidArgError('limits.cpuMax must be { quotaUsec, periodUsec? }');
    count(c.quotaUsec, 'limits.cpuMax.quotaUsec', 1000);
    if (c.quotaUsec === undefined) throw new InvalidArgError('limits.cpuMax needs quotaUsec');
    if (
      c.periodUsec !== undefined &&
      (typeof c.periodUsec !== 'number' ||
        !Number.isSafeInteger(c.periodUsec) ||
        c.periodUsec < 1000 ||
        c.periodUsec > 1_000_000)
    ) {
      throw new InvalidArgError('limits.cpuMax.periodUsec must be an integer from 1000 to 1000000');
    }
  }
  return l as CgroupLimits;
}

/** The nearest existing ancestor of an absolute path (itself if it exists). */
function nearestExisting(dir: string): string {
  let p = dir;
  while (!existsSync(p)) {
    const up = path.dirname(p);
    if (up === p) break;
    p = up;
  }
  return p;
}

/** An instance's cgroup: one directory, its processes, its files. */
export class InstanceCgroup {
  /** Absolute path of the directory. */
  readonly path: string;
  /** Its path in the hierarchy, as /proc/<pid>/cgroup names it (what membership is compared with). */
  readonly node: string;
  /** The cgroup id: the directory's inode number, which is the kernel's cgroup id (decimal: it is 64-bit). */
  readonly id: string;
  /**
   * A systemd unit's cgroup (src/process/unit-cgroup.ts): the instance's, killed through, but systemd's to
   * make and remove; custody never creates, chowns or removes it.
   */
  readonly unit: boolean;

  constructor(dir: string, node: string, id: string, unit = false) {
    this.path = dir;
    this.node = node;
    this.id = id;
    this.unit = unit;
  }

  /**
   * The cgroup a manifest recorded, by its path and id, whatever root (or
   * none) this supervisor has: 'gone' where no directory is there; throws
   * UnsafePathError where one is there that custody may not act through.
   */
  static recorded(recorded: { path: string; id: string; unit?: boolean }): InstanceCgroup | 'gone' {
    const place = recordedCgroup(recorded);
    return place === 'gone' ? 'gone' : new InstanceCgroup(place.path, place.node, place.id, recorded.unit === true);
  }

  #read(file: string): string {
    return readFileSync(path.join(this.path, file), 'latin1');
  }

  /** Whether the directory is still this cgroup (same id); a removed one is not. */
  exists(): boolean {
    try {
      return String(statSync(this.path, { bigint: true }).ino) === this.id;
    } catch (err) {
      if (code(err) === 'ENOENT') return false;
      throw err;
    }
  }

  #events(): Map<string, number> {
    return parseKeyed(this.#read('cgroup.events'));
  }

  /** `populated` of cgroup.events: some process (of it or a descendant cgroup) is alive. A removed cgroup is empty. */
  populated(): boolean {
    try {
      return this.#events().get('populated') === 1;
    } catch (err) {
      if (code(err) === 'ENOENT' || code(err) === 'ENODEV') return false;
      throw err;
    }
  }

  /** OOM kills counted in it (oomKillsIn): read once its main process ended, before it is removed. */
  oomKills(): number {
    return oomKillsIn(this.path);
  }

  /** Whether cgroup.events says frozen. */
  frozen(): boolean {
    try {
      return this.#events().get('frozen') === 1;
    } catch (err) {
      if (code(err) === 'ENOENT') return false;
      throw err;
    }
  }

  /**
   * The pids in it and in every cgroup below it now (a member may make a cgroup of its own inside and move
   * into it: it is still the instance's). A listing, not proof: a pid is pinned and re-checked before it is
   * signalled.
   */
  procs(): number[] {
    const pids: number[] = [];
    for (const dir of subtree(this.path).dirs) {
      try {
        pids.push(...readFileSync(path.join(dir, 'cgroup.procs'), 'latin1').split('\n').filter(Boolean).map(Number));
      } catch (err) {
        if (code(err) !== 'ENOENT' && code(err) !== 'ENODEV') throw err;
      }
    }
    return pids;
  }

  /**
   * cgroup.kill (Linux 5.14): SIGKILL to every process in it and below,
   * atomically against forks. false where the kernel lacks it.
   */
  kill(): boolean {
    guardCgroup(this);
    try {
      writeFile(path.join(this.path, 'cgroup.kill'), '1');
      return true;
    } catch (err) {
      if (code(err) === 'ENOENT' && this.exists()) return false;
      if (code(err) === 'ENOENT') return true;
      throw err;
    }
  }

  /**
   * Waits until cgroup.events says `populated 0`: the proof that every
   * process of the instance is gone. Polled on the loop (a read of a few
   * bytes), bounded by ms and the abort signal; true once empty.
   */
  async waitEmpty(ms: number, signal?: AbortSignal): Promise<boolean> {
    // Paced with every other wait (thousands of stops poll at once), and read once more, fresh, at the bound.
    return pacedUntil(() => !this.populated(), ms, signal);
  }

  /** cgroup.freeze (Linux 5.2), then waits (bounded) for `frozen 1`: every process stopped where it was. */
  async freeze(ms = 5000): Promise<void> {
    await this.#setFrozen(true, ms);
  }

  /** Undoes freeze(): waits (bounded) for `frozen 0`. */
  async thaw(ms = 5000): Promise<void> {
    await this.#setFrozen(false, ms);
  }

  async #setFrozen(on: boolean, ms: number): Promise<void> {
    guardCgroup(this);
    try {
      writeFile(path.join(this.path, 'cgroup.freeze'), on ? '1' : '0');
    } catch (err) {
      if (code(err) === 'ENOENT' && this.exists())
        throw new UnsupportedError(`cgroup.freeze needs Linux >= 5.2 (${this.path} has none)`);
      throw err;
    }
    if (!(await pacedUntil(() => this.frozen() === on, ms)))
      throw new CgroupTimeoutError(this.path, on ? 'frozen' : 'thawed', ms);
  }

  /** Whether freeze was asked for (cgroup.freeze reads 1), whether or not every process has stopped yet. */
  freezeRequested(): boolean {
    try {
      return this.#read('cgroup.freeze').trim() === '1';
    } catch {
      return false;
    }
  }

  usage(): CgroupUsage {
    const cpu = parseKeyed(this.#read('cpu.stat')).get('usage_usec') ?? 0;
    let memoryBytes: number | null = null;
    try {
      memoryBytes = Number(this.#read('memory.current').trim());
    } catch (err) {
      if (code(err) !== 'ENOENT') throw err;
    }
    return { cpuUsec: cpu, memoryBytes, pids: this.procs().length };
  }

  /** Writes the limits into the cgroup's files (its parent must have the controllers on). */
  applyLimits(limits: CgroupLimits): void {
    const v = (x: number | 'max') => String(x);
    if (limits.memoryMax !== undefined) writeFile(path.join(this.path, 'memory.max'), v(limits.memoryMax));
    if (limits.pidsMax !== undefined) writeFile(path.join(this.path, 'pids.max'), v(limits.pidsMax));
    if (limits.cpuMax !== undefined) {
      writeFile(
        path.join(this.path, 'cpu.max'),
        `${v(limits.cpuMax.quotaUsec)} ${limits.cpuMax.periodUsec ?? 100_000}`,
      );
    }
  }

  /**
   * Removes it with every cgroup a member made below it, children before parents, once `populated 0`
   * (which covers the whole subtree) proves no process is left in any; a populated one is left untouched.
   * rmdir is refused (EBUSY) while a process is in a cgroup; the kernel can report `populated 0` a moment
   * before it lets the directory go, so EBUSY is retried for up to `ms`. Gone already is success. Never
   * throws: what could not be removed is returned, each with why, for the caller to warn of (the processes
   * are proven gone; an empty directory left behind is no reason to fail a stop, an abandon or an open).
   */
  async remove(ms = 1000): Promise<CgroupLeftover[]> {
    // A unit's cgroup is systemd's: it removes it once the unit is done.
    if (this.unit) return [];
    // Only through a cgroup that is still the one recorded, and no other uid's to swap.
    guardCgroup(this);
    try {
      if (this.populated()) return [{ path: this.path, why: 'processes are still in it' }];
    } catch (err) {
      return [{ path: this.path, why: `cgroup.events unreadable (${code(err) ?? String(err)})` }];
    }
    let left: CgroupLeftover[] = [];
    for await (const _ of backoff({ maxMs: 50, timeoutMs: ms })) {
      left = removeSubtree(this.path);
      if (left.length === 0 || left.some((l) => l.why !== 'EBUSY')) break;
    }
    return left;
  }
}

/**
 * The cgroup root of one supervisor: the root directory, and the supervisor's
 * own sub-cgroup in it, under which its instances' cgroups live.
 */
export class CgroupRoot {
  /** The root as given (normalized, symlinks resolved). */
  readonly root: string;
  /** This supervisor's sub-cgroup: `<root>/custody-<hash of the state dir>`. */
  readonly dir: string;
  readonly #mount: MountEntry;
  #enabled: string[] = [];
  #offered: string[] = [];
  #features = { kill: false, freeze: false };
  /** The sub-cgroup's id (its inode), as claimed at open. */
  #id = '';

  private constructor(root: string, dir: string, mount: MountEntry) {
    this.root = root;
    this.dir = dir;
    this.#mount = mount;
  }

  /**
   * Checks a root without touching anything: an absolute path on a cgroup
   * v2 mount (read from /proc/self/mountinfo, confirmed by statfs), a
   * directory that is a cgroup if it exists, writable (or creatable) by us.
   * Throws BadCgroupError (ERR_CUSTODY_BAD_CGROUP) saying which.
   */
  static validate(options: unknown): { root: string; mount: MountEntry } {
    if (!options || typeof options !== 'object') throw new InvalidArgError('cgroup must be { root }');
    const given = (options as CgroupOptions).root;
    if (typeof given !== 'string' || given === '' || given.includes('\0'))
      throw new InvalidArgError('cgroup.root must be a non-empty path');
    if (!path.isAbsolute(given)) throw new BadCgroupError(given, 'not an absolute path');
    const caps = cgroupCapabilities();
    if (!caps.cgroup) throw new BadCgroupError(given, `no cgroup v2 here: ${caps.cgroupReason}`);
    const normal = path.resolve(given);
    const existing = nearestExisting(normal);
    const real = path.join(realpathSync(existing), path.relative(existing, normal));
    const mount = mountOf(real, cgroup2Mounts(backend.mountinfo()));
    const fsType = statfsSync(existing).type;
    if (!mount || fsType !== CGROUP2_SUPER_MAGIC) {
      throw new BadCgroupError(
        given,
        `not on a cgroup v2 mount (cgroup v2 is mounted at ${caps.cgroup.mount}; ` +
          `${existing} has filesystem type 0x${fsType.toString(16)})`,
      );
    }
    if (mount.readOnly) throw new BadCgroupError(given, `its cgroup v2 mount ${mount.mountPoint} is read-only`);
    if (existing === normal) {
      const st = lstatSync(real);
      if (!st.isDirectory()) throw new BadCgroupError(given, 'not a directory (a cgroup is one)');
    }
    try {
      accessSync(existing, fsc.W_OK);
    } catch (err) {
      throw new BadCgroupError(
        given,
        `${existing} is not writable by this process (${code(err)}); delegate the subtree to it`,
        { cause: err },
      );
    }
    return { root: real, mount };
  }

  /**
   * Creates the root (if absent) and this supervisor's sub-cgroup, and turns
   * on the accounting controllers the root offers. `warn` receives what
   * could not be turned on (a root with processes of its own cannot enable
   * controllers for its children: cgroup v2's no-internal-process rule).
   */
  static open(
    options: CgroupOptions,
    stateDir: string,
    warn: (message: string) => void,
    record: CgroupRecordFile | null = null,
  ): CgroupRoot {
    const { root, mount } = CgroupRoot.validate(options);
    const r = new CgroupRoot(root, path.join(root, ownCgroupName(stateDir)), mount);
    // Checked up to the mount, made or reused as recorded: ERR_CUSTODY_UNSAFE_PATH before any instance is touched.
    r.#id = claimOwnCgroup({ root, dir: r.dir, mount, record, warn });
    r.#offered = readControllers(root);
    r.#features = cgroupFeatures(r.dir);
    const wanted = ACCOUNTING.filter((c) => r.#offered.includes(c));
    const failed = r.#enable(wanted);
    if (failed) warn(failed);
    return r;
  }

  /** Turns controllers on in the root's and the sub-cgroup's subtree_control; the message of what failed, or null. */
  #enable(controllers: string[]): string | null {
    const missing = controllers.filter((c) => !this.#enabled.includes(c));
    if (missing.length === 0) return null;
    const line = missing.map((c) => `+${c}`).join(' ');
    for (const dir of [this.root, this.dir]) {
      try {
        writeFile(path.join(dir, 'cgroup.subtree_control'), line);
      } catch (err) {
        const why =
          code(err) === 'EBUSY'
            ? `${dir} has processes of its own (move them into a leaf cgroup first)`
            : `${code(err)}`;
        this.#enabled = readControllers(this.dir, 'cgroup.subtree_control');
        return `cgroup controllers ${missing.join(', ')} could not be turned on for instances: ${why}`;
      }
    }
    this.#enabled = readControllers(this.dir, 'cgroup.subtree_control');
    return null;
  }

  /** What holds for this root: the mount, the kernel's features, placement, the controllers offered and on. */
  capabilities(): CgroupCapabilities {
    const { cgroup: host, cgroupReason } = cgroupCapabilities();
    // A root is opened only where the probe found cgroup v2 usable; the probe's verdict is cached.
    if (!host) throw new UnsupportedError(`cgroup v2 is not usable here: ${cgroupReason ?? 'unknown'}`);
    return {
      ...host,
      root: this.root,
      readOnly: false,
      ...this.#features,
      controllers: [...this.#offered],
      enabled: [...this.#enabled],
    };
  }

  /**
   * Refuses limits whose controller the root does not offer
   * (ERR_CUSTODY_UNSUPPORTED), else turns it on. Before anything is made.
   */
  prepareLimits(limits: CgroupLimits | undefined): void {
    if (!limits) return;
    const needed = (Object.keys(limits) as Array<keyof CgroupLimits>)
      .filter((k) => limits[k] !== undefined)
      .map((k) => LIMIT_CONTROLLER[k]);
    const absent = needed.filter((c) => !this.#offered.includes(c));
    if (absent.length) {
      throw new UnsupportedError(
        `limits need the ${absent.join(', ')} controller(s), which cgroup root ${this.root} does not offer ` +
          `(its cgroup.controllers: ${this.#offered.join(' ') || 'none'})`,
      );
    }
    const failed = this.#enable(needed);
    if (failed) throw new UnsupportedError(failed);
  }

  /** Creates the cgroup of one launch, with its limits. A leftover of that name (never expected) is an error, never reused. */
  create(id: string, token: string, limits?: CgroupLimits): InstanceCgroup {
    const dir = path.join(this.dir, cgroupName(id, token));
    try {
      // Its owner's alone whatever the umask: the guard refuses a cgroup others could write.
      mkdirSync(dir, { mode: 0o755 });
    } catch (err) {
      throw new BadCgroupError(dir, `could not create the instance cgroup (${code(err)})`, { cause: err });
    }
    const cg = this.#at(dir);
    try {
      if (limits) cg.applyLimits(limits);
    } catch (err) {
      rmdirSync(dir);
      throw new BadCgroupError(dir, `could not set its limits (${code(err)})`, { cause: err });
    }
    return cg;
  }

  #at(dir: string): InstanceCgroup {
    return new InstanceCgroup(dir, hierarchyPath(dir, this.#mount), String(statSync(dir, { bigint: true }).ino));
  }

  /** Every instance cgroup in this supervisor's sub-cgroup, by name. */
  list(): InstanceCgroup[] {
    let names: string[];
    try {
      names = readdirSync(this.dir, { withFileTypes: true })
        .filter((d) => d.isDirectory())
        .map((d) => d.name);
    } catch (err) {
      if (code(err) === 'ENOENT') return [];
      throw err;
    }
    return names.flatMap((n) => {
      try {
        return [this.#at(path.join(this.dir, n))];
      } catch {
        return [];
      }
    });
  }

  /**
   * On close: the sub-cgroup goes when no instance cgroup is left in it.
   * The root is the operator's (and maybe other supervisors'): it stays.
   */
  close(): void {
    try {
      guardCgroup({ path: this.dir, id: this.#id });
      rmdirSync(this.dir);
    } catch {
      // instances still run in it (they outlive the supervisor), or it is no longer the one custody made
    }
  }
}
