/**
 * Recovery's read-ahead scan: ONE process-table scan per recover(), indexed
 * by the tokens of the manifests whose processes must be found by token (the
 * interrupted launches, the stops cut off without a cgroup), read off this
 * thread while the manifests are judged. The same scan marks the forks of
 * the supervisors that wrote interrupted launches (by address-space layout)
 * and the processes caught inside an execve. Afterwards only candidates are
 * inspected again; a fork that exec'd or exited costs one more scan.
 */
import { backend } from '../backend/index.js';
import { startedAtMs } from '../process/proc.js';
import type { ProcEntry } from '../backend/types.js';
import { isNoProcess } from '../process/identity.js';
import { envToken, indexByToken, mayCarryEnvToken } from '../process/ownership.js';
import type { Manifest } from '../state/manifest.js';
import { pin } from './pins.js';

/**
 * What of a scan may be a fork of a supervisor that has not become its program yet: by image, the
 * processes that showed one of the images asked for (never this process); and every process caught
 * inside an execve, which shows no argv and no layout at all, so whose fork it was cannot be told.
 */
interface Forks {
  byImage: Map<string, number[]>;
  inExec: ProcEntry[];
}

function forksOf(rows: ProcEntry[]): Forks {
  const out: Forks = { byImage: new Map(), inExec: [] };
  for (const row of rows) {
    if (row.pid === process.pid || row.kernelThread) continue;
    if (row.image !== undefined) out.byImage.set(row.image, [...(out.byImage.get(row.image) ?? []), row.pid]);
    else if (inExec(row)) out.inExec.push(row);
  }
  return out;
}

/** The most layouts one scan compares (native/proc.cc kMaxImages). */
const MAX_SCAN_IMAGES = 1 << 16;

/** How much earlier than its manifest's createdAt a launch's child may seem to start: btime is whole seconds. */
const START_SLACK_MS = 2000;

/**
 * Whether a process caught inside an execve may be this launch's child: it
 * runs as we do (a fork has its supervisor's uid until its exec), or as the
 * launch's uid or its runAs uid (set just before the exec), and started no earlier than the launch did. A process of
 * another uid, or an old one that lost its argv for good (stuck in its exit,
 * one that unmapped it), is no launch's child and holds nothing up.
 */
function mayBeChildOf(row: ProcEntry, m: Manifest, bootMs: number | null): boolean {
  if (row.uid !== process.geteuid?.() && row.uid !== m.uid && row.uid !== m.runAs?.uid) return false;
  return bootMs === null || startedAtMs(row.startTicks, bootMs) >= Date.parse(m.createdAt) - START_SLACK_MS;
}

/** No argv while alive, and no kernel thread: inside an execve (or an exit) for now. */
const inExec = (row: ProcEntry) =>
  row.argv.length === 0 && row.state !== 'Z' && row.state !== 'X' && row.kernelThread !== true;

/** Env tokens found in one scan: CUSTODY_TOKEN's value -> pids, and the processes whose environment may not be read. */
interface EnvIndex {
  byToken: Map<string, number[]>;
  unreadable: ProcEntry[];
}

/**
 * Reads, under a pin, the environment of each scanned process that fits one of the env-mode launches (its
 * argv is the launch's, or its argv[0] names the executable), once however many launches it fits; every
 * other process's environment is never read.
 */
function envIndex(rows: ProcEntry[], launches: Manifest[]): EnvIndex {
  const out: EnvIndex = { byToken: new Map(), unreadable: [] };
  if (launches.length === 0) return out;
  const fits = launches.map((m) => ({ launched: [m.command, ...m.args], executable: m.executable }));
  for (const row of rows) {
    if (!fits.some((f) => mayCarryEnvToken(row.argv, f.launched, f.executable))) continue;
    const p = pin(row.pid);
    if (!p) continue;
    try {
      const token = envToken(p.environ());
      if (token !== null) out.byToken.set(token, [...(out.byToken.get(token) ?? []), row.pid]);
    } catch (err) {
      const code = (err as NodeJS.ErrnoException).code;
      if (code === 'EACCES' || code === 'EPERM') out.unreadable.push(row);
      else if (!isNoProcess(err)) throw err;
    } finally {
      p.handle.close();
    }
  }
  return out;
}

interface Scanned {
  index: Map<string, ProcEntry[]>;
  env: EnvIndex;
  forks: Forks;
}

export class TokenScan {
  readonly #tokens: Set<string>;
  readonly #envLaunches: Manifest[];
  readonly #images: string[];
  #scan: Promise<Scanned> | undefined;
  // Forks are taken from the first scan only (a later scan of a busy host would catch new execs), and
  // each one's exec or exit costs one more scan, whichever launches follow it.
  #firstScan: Promise<Scanned> | undefined;
  readonly #settledForks = new Set<number>();
  readonly #exitedCandidates = new Set<number>();
  // Read once a recover(): a clock stepped since an earlier one moves it.
  #bootMs: number | null | undefined;

  /** `sought`: the manifests whose processes are found by token; the interrupted launches among them have forks. */
  constructor(sought: Manifest[]) {
    this.#tokens = new Set(sought.flatMap((m) => (m.tokenMode === 'env' ? [] : [m.token])));
    this.#envLaunches = sought.filter((m) => m.tokenMode === 'env');
    // At most as many layouts as a scan compares (one per dead supervisor): past that, only the in-exec rule holds.
    const images = sought.flatMap((m) => (m.state === 'starting' && m.forkImage ? [m.forkImage] : []));
    this.#images = [...new Set(images)].slice(0, MAX_SCAN_IMAGES);
    // Off this thread from here on, while the manifests before them are judged.
    if (sought.length > 0) this.#scanned().catch(() => {});
  }

  #scanned(): Promise<Scanned> {
    this.#scan ??= backend.listProcesses(undefined, this.#images).then((rows) => ({
      index: indexByToken(rows, this.#tokens),
      env: envIndex(rows, this.#envLaunches),
      forks: forksOf(rows),
    }));
    return this.#scan;
  }

  /** The pids that carry m's token (an env-mode token: also those whose environment may not be read). */
  async carriersOf(m: Manifest): Promise<number[]> {
    const { index, env } = await this.#scanned();
    if (m.tokenMode !== 'env') return (index.get(m.token) ?? []).map((p) => p.pid);
    // An environment that cannot be read may be this launch's: the rule decides (unprovable), never the scan.
    const launched = [m.command, ...m.args];
    const unreadable = env.unreadable.filter((p) => mayCarryEnvToken(p.argv, launched, m.executable)).map((p) => p.pid);
    return [...(env.byToken.get(m.token) ?? []), ...unreadable];
  }

  /** What may be the launch's child short of its exec at the first scan: a fork of the supervisor that wrote it, or one of ours inside an execve. */
  async unexecd(m: Manifest): Promise<Set<number>> {
    this.#firstScan ??= this.#scanned();
    const { forks } = await this.#firstScan;
    // The supervisor that wrote it, if it still runs, shows its own layout: it is no fork of itself.
    const byImage = ((m.forkImage && forks.byImage.get(m.forkImage)) || []).filter((pid) => pid !== m.supervisorPid);
    this.#bootMs ??= backend.bootTimeMs();
    const bootMs = this.#bootMs;
    const inExec = forks.inExec.filter((row) => mayBeChildOf(row, m, bootMs)).map((row) => row.pid);
    return new Set([...byImage, ...inExec]);
  }

  /**
   * Forks seen past their exec, or gone (what one exec'd into may have forked the target and exited): the
   * scan predates them, so the carriers are read again, once per fork, by whichever launch asks next.
   */
  settled(pids: number[]): void {
    this.#rescanFor(this.#settledForks, pids);
  }

  /**
   * Candidates that exited since they were listed (a launcher that started the target and exited: the
   * target, re-parented away, is no candidate's child): the carriers are read again, once per pid.
   */
  exited(pids: number[]): void {
    this.#rescanFor(this.#exitedCandidates, pids);
  }

  #rescanFor(seen: Set<number>, pids: number[]): void {
    let rescan = false;
    for (const pid of pids) {
      if (seen.has(pid)) continue;
      seen.add(pid);
      rescan = true;
    }
    if (rescan) this.#scan = undefined;
  }
}
