/**
 * A stop cut off halfway (the agent crashed, or ran out of fds, between
 * writing `stopping` and removing the state) is finished, never taken for
 * an instance that is gone or still to be adopted. With a cgroup, what is in
 * it is ended and the cgroup removed (the clean), and a main process its
 * pidfs id proves, that left the cgroup, is ended through its pin first. Without one: the recorded
 * main process, where it is still the one recorded and passes the ownership
 * rule, its descendants, the session custody made for it (once a pinned
 * member is read in it), and the token's carriers that the rule proves on
 * their own marks (its forks carry the launched argv): TERM, a bounded wait,
 * KILL. Then the declared paths and the state go, reported `cleaned`
 * (`stopped`). What cannot be proven is quarantined, never signalled.
 */
import { StopTimeoutError } from '../errors.js';
import type { ProcessHandle } from '../process/handle.js';
import { type Claim, judge } from '../process/ownership.js';
import { terminate } from '../process/terminate.js';
import { terminateMembers } from '../process/tree.js';
import { MANIFEST_VERSION, type StoppingManifest } from '../state/manifest.js';
import { targetClaim } from './claims.js';
import { decideStopping, LEFTOVER_GRACE_MS, type StoppingFacts } from './decide.js';
import type { RecoveryEffects } from './effects.js';
import { type PinsAhead, pin } from './pins.js';
import { RecordedProcess } from './running.js';
import type { TokenScan } from './scan.js';
import { rejectCarrier } from './starting.js';

export async function finishStop(
  fx: RecoveryEffects,
  ahead: PinsAhead,
  scan: TokenScan,
  m: StoppingManifest,
): Promise<void> {
  const f: StoppingFacts = {
    pid: m.identity.pid,
    selfPid: process.pid,
    current: m.version === MANIFEST_VERSION,
    paths: m.paths,
  };
  const rec = new RecordedProcess(fx, ahead, m);
  try {
    for (;;) {
      const step = decideStopping(f);
      if (step.do === 'read') await rec.read(step.what, f);
      else if (step.do === 'end-members') {
        const ended = await endMembers(fx, scan, m, step.main ? (rec.live?.handle ?? null) : null);
        if (ended === 'stuck') return;
        f.unreadable = ended.unreadable;
        f.ended = true;
      } else if (step.do === 'end-main') {
        if (!rec.live || (await endMain(fx, m, rec.live.handle)) === 'stuck') return;
        f.ended = true;
      } else return await fx.conclude(m, step, m.identity.pid);
    }
  } finally {
    rec.live?.handle.close();
  }
}

/** The main process, proven by its pidfs id outside its cgroup: TERM, a bounded wait, KILL through its pin. */
async function endMain(fx: RecoveryEffects, m: StoppingManifest, main: ProcessHandle): Promise<'ended' | 'stuck'> {
  fx.emit('warning', {
    id: m.id,
    pid: main.pid,
    message: `${m.id} (pid ${main.pid}) left its cgroup before its stop was cut off: ended through its pin`,
  });
  try {
    await terminate(main, { graceMs: LEFTOVER_GRACE_MS, onEscalate: escalated(fx, m) });
    return 'ended';
  } catch (err) {
    if (!(err instanceof StopTimeoutError)) throw err;
    fx.defer(m.id, err);
    return 'stuck';
  }
}

const escalated =
  (fx: RecoveryEffects, m: StoppingManifest) =>
  ({ pid }: { pid: number }) =>
    fx.emit('escalate', {
      id: m.id,
      pid,
      message: `pid ${pid} of ${m.id}, whose stop was cut off, ignored SIGTERM; sent SIGKILL`,
    });

/**
 * Ends the main process (where proven) and the token's carriers the rule proves, with everything that
 * descends from them and the instance's session; 'stuck' (deferred) where one would not die in the bound.
 */
async function endMembers(
  fx: RecoveryEffects,
  scan: TokenScan,
  m: StoppingManifest,
  main: ProcessHandle | null,
): Promise<{ unreadable: number } | 'stuck'> {
  // As an interrupted launch's carriers are judged: on their own marks, the launched program included.
  const claim: Claim = { ...targetClaim(m), cgroup: null };
  const unreadable = new Set<number>();
  const carriers: ProcessHandle[] = [];
  try {
    for (const pid of await scan.carriersOf(m)) {
      if (pid === main?.pid) continue;
      const p = pin(pid);
      if (!p) continue;
      const j = judge(claim, p.identity, undefined, false, p.environ);
      if (j.ours) carriers.push(p.handle);
      else {
        rejectCarrier(fx.emit, m, pid, j, unreadable);
        p.handle.close();
      }
    }
    const roots = main ? [main, ...carriers] : carriers;
    if (roots.length > 0) {
      await terminateMembers(roots, {
        session: m.session ?? null,
        graceMs: LEFTOVER_GRACE_MS,
        reapIfChild: true,
        onEscalate: escalated(fx, m),
      });
    }
  } catch (err) {
    // Something of the instance's would not die within the bound: nothing is removed, a later recover() decides.
    if (!(err instanceof StopTimeoutError)) throw err;
    fx.defer(m.id, err);
    return 'stuck';
  } finally {
    for (const h of carriers) h.close();
  }
  return { unreadable: unreadable.size };
}
