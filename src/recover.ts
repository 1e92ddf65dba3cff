/**
 * Recovery after a restart. Every manifest ends in exactly one of adopted,
 * repaired, cleaned or quarantined, with a reason and, where a field
 * decided, the field. Nothing unproven is ever signalled: quarantine only
 * records.
 */
import { statSync } from 'node:fs';
import { backend, capabilities } from './backend/index.js';
import { BadManifestError } from './errors.js';
import { ProcessHandle } from './handle.js';
import { isNoProcess, isTransient, toIdentity, verify } from './identity.js';
import { carries, tokenCarriers } from './launch.js';
import { removeDeclaredPaths } from './paths.js';
import { terminate } from './terminate.js';
import { IncompleteInstanceError, MANIFEST_VERSION, type Manifest } from './store.js';
import type { Supervisor } from './supervisor.js';
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

type Pinned = { identity: ProcessIdentity; handle: ProcessHandle };

function pin(pid: number): Pinned | null {
  try {
    const { raw, ref } = backend.inspectPinned(pid, { reapIfChild: true });
    return { identity: toIdentity(pid, raw, backend.bootId()), handle: new ProcessHandle(ref, { identity: null, spawned: false }) };
  } catch (err) {
    if (isNoProcess(err)) return null;
    throw err;
  }
}

/** What makes a live process provably this instance's, beyond its recorded identity. */
function ownershipProblem(m: Manifest, live: ProcessIdentity): { reason: string; field: string } | null {
  if (live.pid === 1 || live.pid === process.pid) return { reason: 'unprovable', field: 'pid' };
  const uid = process.getuid?.();
  if (uid !== undefined && live.uid !== uid) return { reason: 'unprovable', field: 'uid' };
  if (!live.argv.some((a) => a.includes(m.token))) return { reason: 'mismatch', field: 'token' };
  return null;
}

function exeMatches(m: Manifest, live: ProcessIdentity): boolean {
  if (!m.executable) return true;
  try {
    const st = statSync(m.executable);
    return live.exe !== null && live.exe.dev === st.dev && live.exe.ino === st.ino;
  } catch {
    return false;
  }
}

export async function recover(sup: Supervisor): Promise<RecoveryReport> {
  const report: RecoveryReport = { adopted: [], repaired: [], cleaned: [], quarantined: [], deferred: [] };
  // A read error propagates: open() fails and the next open retries.
  const ids = sup.store.ids();
  const provable = capabilities().proc;
  const emit = sup.emit;

  const quarantine = async (id: string, m: Manifest | null, reason: string, field?: string, persist = true) => {
    const pid = m?.identity?.pid;
    if (m && persist && m.state !== 'quarantined') {
      const q: Manifest = { ...m, state: 'quarantined', quarantine: { reason, ...(field ? { field } : {}), at: new Date().toISOString() }, updatedAt: new Date().toISOString() };
      try {
        await sup.store.write(q);
        m = q;
      } catch (err) {
        emit('warning', { id, message: `could not persist the quarantine of ${id}: ${(err as Error).message}` });
      }
    }
    sup.quarantine(id, m, reason, field);
    const entry: RecoveryEntry = { id, ...(pid ? { pid } : {}), reason, ...(field ? { field } : {}) };
    report.quarantined.push(entry);
    emit('quarantine', { ...entry, message: `${id} quarantined: ${reason}${field ? ` (${field})` : ''}; it will not be signalled` });
  };

  const clean = async (m: Manifest, reason: string, pid?: number) => {
    removeDeclaredPaths(m.paths, emit, m.id);
    await sup.store.remove(m.id);
    const entry: RecoveryEntry = { id: m.id, ...(pid ? { pid } : {}), reason };
    report.cleaned.push(entry);
    emit('clean', { ...entry, message: `${m.id}: ${reason}; state cleaned, nothing signalled` });
  };

  for (const id of ids) {
    const known = sup.table.get(id);
    if (known && known.status !== 'deferred') continue;
    try {
      await recoverOne(id);
    } catch (err) {
      if (!isTransient(err)) throw err;
      // The kernel could not answer (EMFILE, ENOMEM...): that is no verdict.
      // Nothing was signalled or removed; a later recover() decides.
      sup.defer(id, err as Error);
      const entry = { id, reason: (err as NodeJS.ErrnoException).code ?? 'transient', error: err as Error };
      report.deferred.push(entry);
      emit('warning', { id, reason: entry.reason, message: `${id}: recovery deferred (${(err as Error).message}); call recover() again` });
    }
  }
  return report;

  async function recoverOne(id: string): Promise<void> {
    let m: Manifest;
    try {
      m = sup.store.read(id);
    } catch (err) {
      if (err instanceof IncompleteInstanceError) {
        // Never launched: only temp files, which must not be read as valid.
        // Nothing of custody's there (files a user left): nothing to report.
        if (!(await sup.store.remove(id)).removed) return;
        report.cleaned.push({ id, reason: 'incomplete' });
        emit('clean', { id, reason: 'incomplete', message: `${id}: an interrupted first write left no manifest; nothing was ever spawned; cleaned` });
        return;
      }
      if (!(err instanceof BadManifestError)) throw err;
      // EMFILE opening a manifest says nothing about the manifest.
      if (isTransient(err.cause)) throw err.cause;
      // Kept on disk for the operator; never deleted, never fatal to the others.
      await quarantine(id, null, 'bad-manifest', undefined, false);
      report.quarantined[report.quarantined.length - 1]!.field = err.message;
      return;
    }
    if (m.state === 'quarantined') {
      await quarantine(id, m, m.quarantine?.reason ?? 'quarantined', m.quarantine?.field);
      return;
    }
    if (!provable) {
      if (!sup.options.allowUnprovable || m.state !== 'running') {
        await quarantine(id, m, 'unprovable');
        return;
      }
      const handle = unprovenHandle(m.identity!.pid);
      sup.track(m, handle);
      report.adopted.push({ id, pid: m.identity!.pid, reason: 'unprovable' });
      emit('warning', { id, pid: m.identity!.pid, message: `${id} adopted without proof: this platform cannot verify process identity (allowUnprovable)` });
      return;
    }
    if (m.state === 'starting') {
      await recoverStarting(sup, m, report, clean);
      return;
    }
    const recorded = m.identity!;
    const live = recorded.pid === process.pid ? null : pin(recorded.pid);
    if (recorded.pid === process.pid) {
      await quarantine(id, m, 'unprovable', 'pid');
      return;
    }
    const v = verify(recorded, live?.identity ?? null);
    switch (v.verdict) {
      case 'gone':
      case 'rebooted':
        live?.handle.close();
        await clean(m, v.verdict, recorded.pid);
        break;
      case 'unprovable':
        // Recorded in another pid namespace: its pid names some other
        // process here. Quarantined in memory only, so a supervisor back in
        // that namespace can still adopt it; release() is the operator's way out.
        live?.handle.close();
        await quarantine(id, m, 'unprovable', v.field, false);
        break;
      case 'unrecorded':
      case 'reused':
        live?.handle.close();
        await quarantine(id, m, v.verdict, v.field);
        break;
      case 'mismatch': {
        const l = live!;
        const problem = ownershipProblem(m, l.identity);
        const provenByArgv = problem === null && m.paths.every((p) => l.identity.argv.some((a) => a.includes(p))) && exeMatches(m, l.identity);
        if (!provenByArgv) {
          l.handle.close();
          await quarantine(id, m, 'mismatch', v.field);
          break;
        }
        // Same start ticks, the token and the declared paths in its argv: ours.
        const repaired: Manifest = { ...m, identity: { ...l.identity, startTicks: recorded.startTicks }, updatedAt: new Date().toISOString() };
        await sup.store.write(repaired);
        sup.track(repaired, l.handle);
        report.repaired.push({ id, pid: recorded.pid, reason: 'mismatch', field: v.field });
        emit('repair', { id, pid: recorded.pid, field: v.field, message: `${id}: recorded ${v.field} disagreed with the live process; re-proved by its token and paths and rewritten` });
        break;
      }
      case 'ok': {
        const l = live!;
        const problem = ownershipProblem(m, l.identity);
        if (problem) {
          l.handle.close();
          await quarantine(id, m, problem.reason, problem.field);
          break;
        }
        // Proven: an older format is rewritten in the current one.
        if (m.version !== MANIFEST_VERSION) {
          await sup.store.write(m).catch((err: unknown) => emit('warning', { id, message: `could not rewrite ${id}'s manifest in the current format: ${(err as Error).message}` }));
        }
        sup.track(m, l.handle);
        report.adopted.push({ id, pid: recorded.pid });
        emit('adopt', { id, pid: recorded.pid, message: `${id} (pid ${recorded.pid}) adopted: identity verified` });
        break;
      }
    }
  }
}

/** How long recovery gives an interrupted launch to exec into its expected argv (the launch's own confirm bound). */
export const STARTING_CONFIRM_MS = 3000;

/**
 * A supervisor died mid-launch. The process table is searched for the
 * token: a process that carries it with the expected argv (and executable)
 * is adopted. Carriers that never get there within the confirm bound (a
 * launcher whose target never exec'd) are provably ours and are ended, as
 * abandon would have; then the state is cleaned.
 */
async function recoverStarting(sup: Supervisor, m: Manifest, report: RecoveryReport, clean: (m: Manifest, reason: string) => Promise<void>): Promise<void> {
  const deadline = Date.now() + STARTING_CONFIRM_MS;
  for (let delay = 5; ; delay = Math.min(delay * 2, 100)) {
    const carriers = await tokenCarriers(m.token);
    const candidates: Pinned[] = [];
    for (const pid of carriers) {
      const p = pin(pid);
      if (!p) continue;
      if (p.identity.state !== 'Z' && carries(p.identity.argv, m.token, m.expect) && exeMatches(m, p.identity) && !ownershipProblem(m, p.identity)) {
        candidates.push(p);
      } else {
        p.handle.close();
      }
    }
    // A launcher and its target may both qualify: the target is the one
    // that is not the parent of another candidate.
    const parents = new Set(candidates.map((c) => c.identity.ppid));
    const chosen = candidates.find((c) => !parents.has(c.identity.pid));
    for (const c of candidates) if (c !== chosen) c.handle.close();
    if (chosen) {
      const running: Manifest = { ...m, state: 'running', identity: chosen.identity, updatedAt: new Date().toISOString() };
      await sup.store.write(running);
      sup.track(running, chosen.handle);
      report.adopted.push({ id: m.id, pid: chosen.identity.pid, reason: 'starting' });
      sup.emit('adopt', { id: m.id, pid: chosen.identity.pid, message: `${m.id}: a launch interrupted mid-way was found by its token and adopted` });
      return;
    }
    if (carriers.length === 0) break;
    if (Date.now() >= deadline) {
      await endCarriers(sup, m);
      break;
    }
    await new Promise((r) => setTimeout(r, delay));
  }
  await clean(m, 'gone');
}

/** Ends every live process that carries the token, each re-checked under its pidfd first. */
async function endCarriers(sup: Supervisor, m: Manifest): Promise<void> {
  const handles: ProcessHandle[] = [];
  for (const pid of await tokenCarriers(m.token)) {
    const p = pin(pid);
    if (p && p.identity.state !== 'Z' && p.identity.argv.some((a) => a.includes(m.token)) && !ownershipProblem(m, p.identity)) handles.push(p.handle);
    else p?.handle.close();
  }
  await Promise.all(
    handles.map(async (h) => {
      try {
        await terminate(h, {
          graceMs: 2000,
          onEscalate: ({ pid }) => sup.emit('escalate', { id: m.id, pid, message: `pid ${pid} of an interrupted launch ignored SIGTERM; sent SIGKILL` }),
        });
      } finally {
        h.close();
      }
    }),
  );
}

/** Off Linux: a handle that can only use process.kill (allowUnprovable). */
function unprovenHandle(pid: number): ProcessHandle {
  let status: { code: null; signal: null } | undefined;
  const ref = {
    pid,
    signal(signo: number) {
      try {
        process.kill(pid, signo);
        return true;
      } catch {
        return false;
      }
    },
    exited: new Promise<{ code: null; signal: null }>(() => {}),
    gone: new Promise<void>(() => {}),
    hasExited: false,
    get exitStatus() {
      return status;
    },
    ref() {},
    unref() {},
    close() {},
  };
  return new ProcessHandle(ref, { identity: null, spawned: false });
}
