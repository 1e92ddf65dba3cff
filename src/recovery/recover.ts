/**
 * Recovery after a restart. Every manifest ends in exactly one of adopted,
 * repaired, cleaned, quarantined or deferred, with a reason and, where a
 * field decided, the field. Nothing unproven is ever signalled: quarantine
 * only records.
 *
 * This module orchestrates, top to bottom: every manifest is read first;
 * the read-ahead work starts off this thread (the one token scan,
 * scan.ts; the pins of the recorded pids, pins.ts); then each manifest is
 * decided (decide.ts) and carried out by kind: running.ts (a confirmed
 * process: running, or starting with its confirmed identity), starting.ts
 * (a launch interrupted before confirm), stopping.ts (a stop cut off);
 * effects.ts writes, removes, reports and tells the supervisor.
 *
 * Instance cgroups: an adopted instance gets its recorded cgroup back (the
 * same directory, the same cgroup id); an interrupted launch's candidates
 * are the members of its cgroup, never a token carrier outside it; the
 * leftovers of an instance whose main process is gone are ended with it. A
 * cgroup of this supervisor's that no manifest names is removed when empty,
 * and reported (never signalled) when something runs in it.
 */
import { backend } from '../backend/index.js';
import { ProcessHandle } from '../process/handle.js';
import type { Manifest, RunningManifest } from '../state/manifest.js';
import { decideFailure, decideManifest, decideUnreadable, provenLike } from './decide.js';
import { RecoveryEffects } from './effects.js';
import type { RecoveryHost, RecoveryReport } from './host.js';
import { PinsAhead } from './pins.js';
import { type Confirmed, recoverRunning } from './running.js';
import { TokenScan } from './scan.js';
import { InterruptedLaunches, isInterrupted } from './starting.js';
import { finishStop } from './stopping.js';

export { STARTING_CONFIRM_MS } from './decide.js';
// recover()'s signature types, reachable with it for its callers (the supervisor).
export type { RecoveryEntry, RecoveryHost, RecoveryReport } from './host.js';

export async function recover(host: RecoveryHost): Promise<RecoveryReport> {
  const fx = new RecoveryEffects(host);
  // Decide, then act: every manifest is read before anything is done. A read error propagates: open()
  // fails and the next open retries.
  const ids = host.store.ids().filter((id) => host.wants(id));
  const read = await host.store.readMany(ids);
  const manifests = ids.map((id, k) => ({ id, read: read[k] as Manifest | Error }));
  const readable = manifests.flatMap((e) => (e.read instanceof Error ? [] : [e.read]));
  // Found by token, in ONE scan: the interrupted launches, and the stops cut off (a cgroup, where there is
  // one, names their members instead, but which is this supervisor's is known only as each is judged).
  const scan = new TokenScan(readable.filter((m) => isInterrupted(m) || m.state === 'stopping'));
  // The recorded pids of the confirmed processes, pinned ahead in the order they come below.
  const ahead = new PinsAhead(fx.platform.provable ? readable.flatMap(recordedPidToJudge) : []);
  const launches = new InterruptedLaunches(fx, scan);
  try {
    for (const { id, read: m } of manifests) {
      try {
        if (m instanceof Error) await unreadable(fx, id, m);
        else await recoverOne(fx, ahead, scan, launches, m);
      } catch (e) {
        const o = decideFailure(e);
        if (o.do !== 'defer') throw e;
        fx.defer(id, o.error);
      }
    }
  } finally {
    await ahead.close();
    await fx.settle();
  }
  return fx.finish();
}

async function recoverOne(
  fx: RecoveryEffects,
  ahead: PinsAhead,
  scan: TokenScan,
  launches: InterruptedLaunches,
  m: Manifest,
): Promise<void> {
  if (m.state === 'backoff' || m.state === 'failed') return fx.adoptResting(m);
  const o = decideManifest(m, fx.platform);
  if (o.do === 'quarantine') {
    await fx.quarantine(m.id, m, o);
    return;
  }
  if (o.do === 'adopt' && isConfirmed(m)) return adoptUnproven(fx, m);
  if (isConfirmed(m)) return recoverRunning(fx, ahead, m);
  if (isInterrupted(m)) return launches.recover(m);
  if (m.state === 'stopping') return finishStop(fx, ahead, scan, m);
}

/** The recorded pid recovery will read: a confirmed process's, or a stop's without a cgroup (which names its members). */
function recordedPidToJudge(m: Manifest): number[] {
  if (isConfirmed(m)) return [m.identity.pid];
  return m.state === 'stopping' && !m.cgroup ? [m.identity.pid] : [];
}

function isConfirmed(m: Manifest): m is Confirmed {
  return provenLike(m);
}

/** Where identity cannot be proven at all, and the supervisor adopts without proof (allowUnprovable). */
function adoptUnproven(fx: RecoveryEffects, m: Confirmed): void {
  const { id } = m;
  const pid = m.identity.pid;
  const running: RunningManifest = m.state === 'starting' ? { ...m, state: 'running' } : m;
  fx.adopt(running, new ProcessHandle(backend.unproven(pid), { identity: null }), null, 'unprovable');
  fx.emit('warning', {
    id,
    pid,
    message: `${id} adopted without proof: this platform cannot verify process identity (allowUnprovable)`,
  });
}

/** A manifest that could not be read: quarantined, deferred, or (an interrupted first write) cleaned. */
async function unreadable(fx: RecoveryEffects, id: string, err: unknown): Promise<void> {
  const o = decideUnreadable(err);
  switch (o.do) {
    case 'rethrow':
      throw err;
    case 'defer':
      throw o.error;
    case 'quarantine': {
      // The decoder's message is the report's field only: the event and the table say the reason.
      const entry = await fx.quarantine(id, null, { ...o, field: undefined });
      entry.field = o.field;
      return;
    }
    case 'clean': {
      // Nothing of custody's there (files a user left): nothing to report.
      const { removed } = await fx.store.remove(id);
      fx.host.forget(id);
      if (!removed) return;
      fx.report.cleaned.push({ id, reason: 'incomplete' });
      fx.emit('clean', {
        id,
        reason: 'incomplete',
        message: `${id}: an interrupted first write left no manifest; nothing was ever spawned; cleaned`,
      });
      return;
    }
    default:
      throw new Error(`recovery cannot ${o.do} an unreadable manifest`);
  }
}
