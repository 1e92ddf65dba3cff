/**
 * Recovery after a restart. Every manifest ends in exactly one of adopted,
 * repaired, cleaned, quarantined or deferred, with a reason and, where a
 * field decided, the field. Nothing unproven is ever signalled: quarantine
 * only records.
 *
 * Cost: the manifests are read once; interrupted launches are found by
 * token in ONE process-table scan per recover(), indexed by token, and only
 * candidates are inspected (under a pin) after it. An env-mode launch's
 * token is in environments: from the same scan, only the processes whose
 * argv fits the launch have theirs read. Ownership is decided by the
 * ownership module, as at launch.
 *
 * Instance cgroups: an adopted instance gets its recorded cgroup back (the
 * same directory, the same cgroup id); an interrupted launch's candidates
 * are the members of its cgroup, never a token carrier outside it; the
 * leftovers of an instance whose main process is gone are ended with it. A
 * cgroup of this supervisor's that no manifest names is removed when empty,
 * and reported (never signalled) when something runs in it.
 */
import { statSync } from 'node:fs';
import { backend, capabilities } from './backend/index.js';
import type { ProcEntry } from './backend/types.js';
import type { CgroupRoot, InstanceCgroup } from './cgroup.js';
import { BadManifestError } from './errors.js';
import type { Emit } from './events.js';
import { ProcessHandle, resolveExecutable } from './handle.js';
import { isNoProcess, isTransient, toIdentity, verify } from './identity.js';
import { environOf } from './launch.js';
import {
  describeRejection,
  envToken,
  indexByToken,
  isMember,
  judge,
  mayCarryEnvToken,
  type Claim,
  type DevIno,
  type Judgement,
} from './ownership.js';
import { removeDeclaredPaths } from './paths.js';
import { readPidfile } from './pidfile.js';
import { IncompleteInstanceError, MANIFEST_VERSION, type Manifest, type StateStore } from './store.js';
import { terminateCgroup, terminateMembers } from './tree.js';
import type { ProcessIdentity } from './types.js';

export interface RecoveryEntry {
  id: string;
  pid?: number;
  reason?: string;
  field?: string;
}

export interface RecoveryReport {
  adopted: RecoveryEntry[];
  repaired: RecoveryEntry[];
  cleaned: RecoveryEntry[];
  quarantined: RecoveryEntry[];
  /** Not decided now (the kernel could not answer: EMFILE, ENOMEM, EIO...); a later recover() decides them. */
  deferred: Array<RecoveryEntry & { error: Error }>;
}

/** The few things recovery needs from its supervisor: no more. */
export interface RecoveryHost {
  readonly store: StateStore;
  readonly emit: Emit;
  /** Adopt without proof where the platform cannot prove identity (a warning each time). */
  readonly allowUnprovable: boolean;
  /** The supervisor's cgroup root, where it has one. */
  readonly cgroups: CgroupRoot | null;
  /** Whether a cgroup (by path) belongs to an instance the supervisor tracks or is launching right now. */
  usesCgroup(path: string): boolean;
  /** Whether recovery should (re)consider this id: not tracked, or deferred earlier. */
  wants(id: string): boolean;
  adopt(manifest: Manifest, handle: ProcessHandle, cgroup: InstanceCgroup | null): void;
  quarantine(id: string, manifest: Manifest | null, reason: string, field?: string): void;
  defer(id: string, error: Error): void;
}

/** A process read under a pin; `environ` reads its environment under the same pin. */
type Pinned = { identity: ProcessIdentity; handle: ProcessHandle; environ: () => Buffer };

function pin(pid: number): Pinned | null {
  try {
    const { raw, ref } = backend.inspectPinned(pid, { reapIfChild: true });
    const identity = toIdentity(pid, raw, backend.bootId());
    return { identity, handle: new ProcessHandle(ref, { identity, spawned: false }), environ: environOf(ref) };
  } catch (err) {
    if (isNoProcess(err)) return null;
    throw err;
  }
}

function fileId(path: string | null, env: NodeJS.ProcessEnv = process.env): DevIno | null {
  if (!path) return null;
  try {
    const st = statSync(path.includes('/') ? path : resolveExecutable(path, env));
    return { dev: st.dev, ino: st.ino };
  } catch {
    return null;
  }
}

/** What the manifest's target must show: as the launch judged it (src/launch.ts claimOf). */
function targetClaim(m: Manifest): Claim {
  const exe = fileId(m.executable);
  return {
    token: m.token,
    expect: m.expect,
    program: exe ? { exe } : m.pidSource === 'child' ? { argv: [m.command, ...m.args] } : null,
    launcherExe: m.pidSource === 'child' ? null : fileId(m.command),
    uid: m.uid ?? null,
    tokenMode: m.tokenMode ?? 'argv',
  };
}

/** The launcher custody spawned (or its fork before exec): exactly the recorded argv. */
function launcherClaim(m: Manifest): Claim {
  const tokenMode = m.tokenMode ?? 'argv';
  const program = { argv: [m.command, ...m.args] };
  return { token: m.token, expect: [], program, launcherExe: null, uid: m.uid ?? null, tokenMode };
}

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

/** How long recovery gives an interrupted launch to exec into its expected argv (the launch's own confirm bound). */
export const STARTING_CONFIRM_MS = 3000;

export async function recover(host: RecoveryHost): Promise<RecoveryReport> {
  const report: RecoveryReport = { adopted: [], repaired: [], cleaned: [], quarantined: [], deferred: [] };
  // A read error propagates: open() fails and the next open retries.
  const { emit, store } = host;
  const provable = capabilities().proc;

  const quarantine = async (id: string, m: Manifest | null, reason: string, field?: string, persist = true) => {
    const pid = m?.identity?.pid;
    if (m && persist && m.state !== 'quarantined') {
      const at = new Date().toISOString();
      const q: Manifest = {
        ...m,
        state: 'quarantined',
        quarantine: { reason, ...(field ? { field } : {}), at },
        updatedAt: at,
      };
      try {
        await store.write(q);
        m = q;
      } catch (err) {
        emit('warning', { id, message: `could not persist the quarantine of ${id}: ${(err as Error).message}` });
      }
    }
    host.quarantine(id, m, reason, field);
    const entry: RecoveryEntry = { id, ...(pid ? { pid } : {}), reason, ...(field ? { field } : {}) };
    report.quarantined.push(entry);
    emit('quarantine', {
      ...entry,
      message: `${id} quarantined: ${reason}${field ? ` (${field})` : ''}; it will not be signalled`,
    });
  };

  // Cleaned instances share one fsync of the state dir, at the end.
  let unsynced = false;
  const clean = async (m: Manifest, reason: string, pid?: number, graceMs = 0) => {
    // Whatever is left in its cgroup is provably the instance's, which is over: ended first, then the cgroup goes.
    await endCgroup(m, graceMs);
    removeDeclaredPaths(m.paths, emit, m.id);
    await store.remove(m.id, { sync: false });
    unsynced = true;
    const entry: RecoveryEntry = { id: m.id, ...(pid ? { pid } : {}), reason };
    report.cleaned.push(entry);
    emit('clean', { ...entry, message: `${m.id}: ${reason}; state cleaned, nothing signalled` });
  };

  const adopt = (m: Manifest, handle: ProcessHandle, cg: InstanceCgroup | null, reason?: string) => {
    host.adopt(m, handle, cg);
    report.adopted.push({ id: m.id, pid: handle.pid, ...(reason ? { reason } : {}) });
  };

  // Decide, then act: every manifest is read before anything is done.
  const manifests: Array<{ id: string; m?: Manifest; err?: unknown }> = [];
  for (const id of store.ids()) {
    if (!host.wants(id)) continue;
    try {
      manifests.push({ id, m: store.read(id) });
    } catch (err) {
      manifests.push({ id, err });
    }
  }
  // One scan for all interrupted launches, indexed by their tokens: argv tokens from the argv of every
  // process; env tokens from the environments of the processes that fit an env-mode launch, each read once.
  const starting = manifests.flatMap((e) => (e.m?.state === 'starting' ? [e.m] : []));
  const startingTokens = new Set(starting.flatMap((m) => (m.tokenMode === 'env' ? [] : [m.token])));
  const envLaunches = starting.filter((m) => m.tokenMode === 'env');
  let scan: Promise<{ index: Map<string, ProcEntry[]>; env: EnvIndex }> | undefined;
  const carriersOf = async (m: Manifest): Promise<number[]> => {
    scan ??= backend
      .listProcesses()
      .then((rows) => ({ index: indexByToken(rows, startingTokens), env: envIndex(rows, envLaunches) }));
    const { index, env } = await scan;
    if (m.tokenMode !== 'env') return (index.get(m.token) ?? []).map((p) => p.pid);
    // An environment that cannot be read may be this launch's: the rule decides (unprovable), never the scan.
    const launched = [m.command, ...m.args];
    const unreadable = env.unreadable.filter((p) => mayCarryEnvToken(p.argv, launched, m.executable)).map((p) => p.pid);
    return [...(env.byToken.get(m.token) ?? []), ...unreadable];
  };

  // Per interrupted env-mode launch: the candidates whose environment may not be read.
  const unreadableEnv = new Map<string, Set<number>>();
  const unreadableOf = (m: Manifest) => {
    let set = unreadableEnv.get(m.id);
    if (!set) unreadableEnv.set(m.id, (set = new Set()));
    return set;
  };

  for (const { id, m, err } of manifests) {
    try {
      if (err !== undefined) await unreadable(id, err);
      else await recoverOne(m!);
    } catch (e) {
      if (!isTransient(e)) throw e;
      // The kernel could not answer (EMFILE, ENOMEM...): that is no verdict.
      // Nothing was signalled or removed; a later recover() decides.
      host.defer(id, e as Error);
      const entry = { id, reason: (e as NodeJS.ErrnoException).code ?? 'transient', error: e as Error };
      report.deferred.push(entry);
      emit('warning', {
        id,
        reason: entry.reason,
        message: `${id}: recovery deferred (${(e as Error).message}); call recover() again`,
      });
    }
  }
  if (unsynced) await store.syncDir();
  if (host.cgroups) await unnamedCgroups(host.cgroups);
  return report;

  /**
   * The recorded cgroup as this supervisor can judge by it: the same
   * directory with the same id; 'gone' where it is no more (nothing can run
   * outside a cgroup it was placed in, and a populated cgroup cannot be
   * removed); null where there is none to judge by: none was recorded, or it
   * is not this supervisor's root's (opened without one, or with another).
   */
  function cgroupOf(m: Manifest): InstanceCgroup | 'gone' | null {
    if (!m.cgroup) return null;
    const root = host.cgroups;
    if (!root || !root.owns(m.cgroup.path)) {
      emit('warning', {
        id: m.id,
        message: `${m.id}: its cgroup ${m.cgroup.path} is not under this supervisor's cgroup root; judged without it`,
      });
      return null;
    }
    return root.find(m.cgroup) ?? 'gone';
  }

  /** Ends what is in an instance's cgroup (SIGTERM and graceMs first, where given) and removes it. */
  async function endCgroup(m: Manifest, graceMs: number): Promise<void> {
    const cg = m.cgroup && host.cgroups?.owns(m.cgroup.path) ? host.cgroups.find(m.cgroup) : null;
    if (!cg) return;
    const left = cg.procs();
    if (cg.populated()) {
      const roots = graceMs > 0 ? left.flatMap((pid) => memberPin(pid, cg)) : [];
      try {
        await terminateCgroup(cg, roots, {
          graceMs,
          onEscalate: ({ pid }) =>
            emit('escalate', {
              id: m.id,
              pid,
              message: `pid ${pid} in the cgroup of ${m.id} ignored SIGTERM; cgroup.kill`,
            }),
        });
      } finally {
        for (const h of roots) h.close();
      }
      emit('warning', {
        id: m.id,
        pids: left,
        message: `${m.id}: ${left.length} process(es) left in its cgroup were ended with it`,
      });
    }
    await cg.remove();
  }

  /** A pin on a pid proven (under the pin) to be in the cgroup; [] when it is not, or gone. */
  function memberPin(pid: number, cg: InstanceCgroup): ProcessHandle[] {
    const p = pin(pid);
    if (p && isMember(p.identity, { pids: new Set(), cgroup: cg.node })) return [p.handle];
    p?.handle.close();
    return [];
  }

  /**
   * Cgroups of this supervisor's that no manifest names (one deleted by
   * hand, or a crash between creating a cgroup and writing its manifest):
   * removed when empty; reported, and left alone, when something runs in it.
   */
  async function unnamedCgroups(root: CgroupRoot): Promise<void> {
    const named = new Set<string>();
    for (const id of store.ids()) {
      try {
        const m = store.read(id);
        if (m.cgroup) named.add(m.cgroup.path);
      } catch {
        // an unreadable manifest names nothing: its cgroup, if populated, is reported below
      }
    }
    for (const cg of root.list()) {
      if (named.has(cg.path) || host.usesCgroup(cg.path)) continue;
      if (!cg.populated()) {
        await cg.remove(0).catch(() => {});
        continue;
      }
      emit('warning', {
        pids: cg.procs(),
        cgroup: cg.path,
        message: `cgroup ${cg.path} holds processes but no manifest names it: left alone, nothing signalled`,
      });
    }
  }

  async function unreadable(id: string, err: unknown): Promise<void> {
    if (err instanceof IncompleteInstanceError) {
      // Never launched: only temp files, which must not be read as valid.
      // Nothing of custody's there (files a user left): nothing to report.
      if (!(await store.remove(id)).removed) return;
      report.cleaned.push({ id, reason: 'incomplete' });
      emit('clean', {
        id,
        reason: 'incomplete',
        message: `${id}: an interrupted first write left no manifest; nothing was ever spawned; cleaned`,
      });
      return;
    }
    if (!(err instanceof BadManifestError)) throw err;
    // EMFILE opening a manifest says nothing about the manifest.
    if (isTransient(err.cause)) throw err.cause;
    // Kept on disk for the operator; never deleted, never fatal to the others.
    await quarantine(id, null, 'bad-manifest', undefined, false);
    report.quarantined[report.quarantined.length - 1]!.field = err.message;
  }

  async function recoverOne(m: Manifest): Promise<void> {
    const id = m.id;
    if (m.state === 'quarantined') {
      await quarantine(id, m, m.quarantine?.reason ?? 'quarantined', m.quarantine?.field);
      return;
    }
    if (!provable) {
      if (!host.allowUnprovable || m.state !== 'running') {
        await quarantine(id, m, 'unprovable');
        return;
      }
      const pid = m.identity!.pid;
      adopt(m, new ProcessHandle(backend.unproven(pid), { identity: null, spawned: false }), null, 'unprovable');
      emit('warning', {
        id,
        pid,
        message: `${id} adopted without proof: this platform cannot verify process identity (allowUnprovable)`,
      });
      return;
    }
    if (m.state === 'starting') {
      await recoverStarting(m);
      return;
    }
    await recoverRunning(m);
  }

  async function recoverRunning(m: Manifest): Promise<void> {
    const id = m.id;
    const recorded = m.identity!;
    if (recorded.pid === process.pid) {
      await quarantine(id, m, 'unprovable', 'pid');
      return;
    }
    const live = pin(recorded.pid);
    const v = verify(recorded, live?.identity ?? null);
    const release = () => live?.handle.close();
    switch (v.verdict) {
      case 'gone':
      case 'rebooted':
        release();
        await clean(m, v.verdict, recorded.pid);
        return;
      case 'unprovable':
        // Recorded in another pid namespace: its pid names some other
        // process here. Quarantined in memory only, so a supervisor back in
        // that namespace can still adopt it; release() is the operator's way out.
        release();
        await quarantine(id, m, 'unprovable', v.field, false);
        return;
      case 'unrecorded':
      case 'reused':
        release();
        await quarantine(id, m, v.verdict, v.field);
        return;
    }
    const l = live!;
    // Its cgroup first: an instance recorded in one must be in it (the same cgroup, by id).
    const cg = cgroupOf(m);
    if (cg === 'gone') {
      l.handle.close();
      await quarantine(id, m, 'mismatch', 'cgroup');
      return;
    }
    // Verified (or a mismatch of exe/argv with equal start ticks): it must
    // still pass the ownership rule on its own marks (token, uid, not pid 1,
    // not us or an ancestor). A mismatch is re-proved by the token and the
    // declared paths in its live argv and the executable; start ticks are never repaired.
    const program = fileId(m.executable) ? { exe: fileId(m.executable)! } : null;
    const claim: Claim = { ...targetClaim(m), program, launcherExe: null, cgroup: cg?.node ?? null };
    // The recorded identity is the launch's own record of the pid: as good as a pid it was handed.
    const j = judge(claim, l.identity, undefined, true, l.environ);
    if (!j.ours) {
      l.handle.close();
      // An environment that may not be read proves nothing: unprovable (field environ), never "no token".
      const reason =
        j.why === 'token' || j.why === 'expect' || j.why === 'exe' || j.why === 'cgroup' ? 'mismatch' : 'unprovable';
      const field = j.why === 'init' || j.why === 'self' || j.why === 'ancestor' ? 'pid' : j.why;
      await quarantine(id, m, reason, v.verdict === 'mismatch' && reason === 'mismatch' ? v.field : field);
      return;
    }
    if (v.verdict === 'ok') {
      // Proven: an older format is rewritten in the current one.
      if (m.version !== MANIFEST_VERSION) {
        await store.write(m).catch((err: unknown) =>
          emit('warning', {
            id,
            message: `could not rewrite ${id}'s manifest in the current format: ${(err as Error).message}`,
          }),
        );
      }
      adopt(m, l.handle, cg);
      emit('adopt', { id, pid: recorded.pid, message: `${id} (pid ${recorded.pid}) adopted: identity verified` });
      return;
    }
    const provenByArgv = m.paths.every((p) => l.identity.argv.some((a) => a.includes(p)));
    if (!provenByArgv) {
      l.handle.close();
      await quarantine(id, m, 'mismatch', v.field);
      return;
    }
    const repaired: Manifest = {
      ...m,
      identity: { ...l.identity, startTicks: recorded.startTicks },
      updatedAt: new Date().toISOString(),
    };
    await store.write(repaired);
    adopt(repaired, l.handle, cg);
    report.adopted.pop();
    report.repaired.push({ id, pid: recorded.pid, reason: 'mismatch', field: v.field });
    emit('repair', {
      id,
      pid: recorded.pid,
      field: v.field,
      message: `${id}: recorded ${v.field} disagreed with the live process; re-proved by its token and paths and rewritten`,
    });
  }

  /**
   * A supervisor died mid-launch. The target is found as launch would have
   * found it: from the pidfile (pidfile launches), else among the token's
   * carriers, judged by the same rule as confirm (a launcher or its fork is
   * never taken for its target; a carrier the rule rejects is left alone).
   * Carriers that never become a target within the confirm bound (a
   * launcher whose target never exec'd) are ended as abandon would have,
   * only where they are provably custody's launcher or target.
   */
  async function recoverStarting(m: Manifest): Promise<void> {
    const cg = cgroupOf(m);
    // Placed before exec, nothing of the launch ran outside its cgroup, and
    // a cgroup with a process in it cannot be removed: none is left. (A pid
    // function's target may live elsewhere: it is looked for as without one.)
    if (cg === 'gone' && m.pidSource !== 'function') return clean(m, 'gone');
    const group = cg === 'gone' ? null : cg;
    const inside = m.pidSource !== 'function' ? group : null;
    const target: Claim = { ...targetClaim(m), cgroup: inside?.node ?? null };
    const launcher = launcherClaim(m);
    if (m.pidSource === 'function' && !m.executable) {
      // The pid came from a function recovery cannot call again, and nothing
      // else names the target's program: no carrier can be proven the target.
      const carriers = await carriersOf(m);
      if (carriers.length === 0) return clean(m, 'gone', undefined, 2000);
      return quarantine(m.id, m, 'unprovable', 'executable');
    }
    const deadline = Date.now() + STARTING_CONFIRM_MS;
    // With a cgroup the candidates are its members: a token carrier outside it is a bystander, never one.
    let candidates = inside ? inside.procs() : await carriersOf(m);
    for (let delay = 5; ; delay = Math.min(delay * 2, 100)) {
      const chosen = await findTarget(m, target, candidates, inside !== null);
      if (chosen) {
        const kept = group && isMember(chosen.identity, { pids: new Set(), cgroup: group.node }) ? group : null;
        const running: Manifest = {
          ...m,
          state: 'running',
          identity: chosen.identity,
          cgroup: kept ? m.cgroup : null,
          updatedAt: new Date().toISOString(),
        };
        await store.write(running);
        adopt(running, chosen.handle, kept, 'starting');
        emit('adopt', {
          id: m.id,
          pid: chosen.identity.pid,
          message: `${m.id}: a launch interrupted mid-way was found and adopted`,
        });
        return;
      }
      if (inside) {
        candidates = inside.procs();
        if (candidates.length === 0 || Date.now() >= deadline) break;
      } else {
        // Only the candidates (and what they forked since) are looked at again, never the whole table.
        const live = candidates.filter((pid) => backend.stat(pid) !== null);
        candidates = [...new Set([...live, ...live.flatMap((pid) => backend.children(pid))])];
        // An environment that may not be read stays so: waiting cannot prove those.
        const waitable = live.filter((pid) => !unreadableOf(m).has(pid));
        if (waitable.length === 0 || Date.now() >= deadline) break;
      }
      await new Promise((r) => setTimeout(r, delay));
    }
    if (!inside) await endOurs(m, [target, launcher], candidates);
    // A process whose environment may not be read may be the launch's: unprovable, never "gone".
    if (unreadableOf(m).size > 0) return quarantine(m.id, m, 'unprovable', 'environ');
    // Its cgroup's members, if any, get SIGTERM, a grace, then cgroup.kill.
    await clean(m, 'gone', undefined, 2000);
  }

  /** The interrupted launch's target among the candidates, pinned; null when there is none (yet). Members of its cgroup that are not it are not reported. */
  async function findTarget(m: Manifest, claim: Claim, candidates: number[], members: boolean): Promise<Pinned | null> {
    if (m.pidSource === 'file' && m.pidFile) {
      // As launch does: the pidfile names the target (a -daemonize parent has its exe and argv too).
      const pid = readPidfile(m.pidFile);
      if (pid === null) return null;
      const p = pin(pid);
      const j = p && judge(claim, p.identity, undefined, true, p.environ);
      if (p && j?.ours) return p;
      if (j && !j.ours && j.why === 'environ') unreadableOf(m).add(pid);
      p?.handle.close();
      return null;
    }
    const ours: Pinned[] = [];
    for (const pid of candidates) {
      const p = pin(pid);
      if (!p) continue;
      const j = judge(claim, p.identity, undefined, false, p.environ);
      if (j.ours) ours.push(p);
      else {
        if (!members) reject(m, p.identity.pid, j);
        p.handle.close();
      }
    }
    // A process and its own fork may both qualify: the target is the one that is no other's parent.
    const parents = new Set(ours.map((c) => c.identity.ppid));
    // An env-mode token is inherited by every process the launch starts (a launcher's `sleep 0.6` too), and
    // the child custody spawned is never the child of another carrier: the target is one whose parent is not.
    const spawnedChild = (c: Pinned) =>
      m.tokenMode !== 'env' || m.pidSource !== 'child' || !candidates.includes(c.identity.ppid);
    const chosen = ours.find((c) => !parents.has(c.identity.pid) && spawnedChild(c)) ?? null;
    for (const c of ours) if (c !== chosen) c.handle.close();
    return chosen;
  }

  function reject(m: Manifest, pid: number, j: Judgement): void {
    if (j.ours || j.why === 'gone' || j.why === 'launcher') return;
    if (j.why === 'environ') {
      // Said once per process: the wait for a target may ask again.
      if (unreadableOf(m).has(pid)) return;
      unreadableOf(m).add(pid);
    }
    emit('warning', { id: m.id, pid, reason: j.why, message: `recovery of ${m.id}: ${describeRejection(pid, j.why)}` });
  }

  /** Ends every candidate that is provably this launch's (target or launcher), with what descends from it. */
  async function endOurs(m: Manifest, claims: Claim[], candidates: number[]): Promise<void> {
    const roots: ProcessHandle[] = [];
    for (const pid of candidates) {
      const p = pin(pid);
      if (!p) continue;
      const verdicts = claims.map((c) => judge(c, p.identity, undefined, false, p.environ));
      if (verdicts.some((v) => v.ours)) roots.push(p.handle);
      else {
        reject(m, pid, verdicts[0]!);
        p.handle.close();
      }
    }
    if (roots.length === 0) return;
    try {
      await terminateMembers(roots, {
        session: m.session ?? null,
        graceMs: 2000,
        reapIfChild: true,
        onEscalate: ({ pid }) =>
          emit('escalate', {
            id: m.id,
            pid,
            message: `pid ${pid} of an interrupted launch ignored SIGTERM; sent SIGKILL`,
          }),
      });
    } finally {
      for (const h of roots) h.close();
    }
  }
}
