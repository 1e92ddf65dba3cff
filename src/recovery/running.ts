/**
 * A manifest whose process was confirmed: running, or starting with the
 * identity its launch confirmed (the agent died while readiness was
 * pending). Its recorded process is pinned, verified, its cgroup and the
 * ownership rule checked, in the order decideRunning asks; then adopted
 * (rewritten as a running manifest of the current version), repaired,
 * cleaned or quarantined.
 */
import type { InstanceCgroup } from '../process/cgroup.js';
import { verify } from '../process/identity.js';
import { expectedUid, judge } from '../process/ownership.js';
import {
  MANIFEST_VERSION,
  type RunningManifest,
  type StartingManifest,
  type StoppingManifest,
} from '../state/manifest.js';
import type { ProcessIdentity } from '../types.js';
import { recordedClaim } from './claims.js';
import { decideRunning, type Outcome, type RunningFacts } from './decide.js';
import type { RecoveryEffects } from './effects.js';
import { type Pinned, type PinsAhead, pin } from './pins.js';

/** A manifest decideRunning judges: its identity recorded. */
export type Confirmed = RunningManifest | (StartingManifest & { identity: ProcessIdentity });

/** The recorded process pinned (from the pins taken ahead where there is one), or null where none lives at the pid. */
async function pinRecorded(ahead: PinsAhead, pid: number): Promise<Pinned | null> {
  const early = await ahead.take(pid);
  return early === undefined ? pin(pid) : early;
}

/**
 * The facts decideRunning asks for about a manifest's recorded process, read
 * in the order asked: the process (pinned), its cgroup, the ownership rule.
 * The caller owns the pin (`live`) once read.
 */
export class RecordedProcess {
  live: Pinned | null = null;
  cgroup: InstanceCgroup | null = null;
  readonly #fx: RecoveryEffects;
  readonly #ahead: PinsAhead;
  readonly #m: Confirmed | StoppingManifest;

  constructor(fx: RecoveryEffects, ahead: PinsAhead, m: Confirmed | StoppingManifest) {
    this.#fx = fx;
    this.#ahead = ahead;
    this.#m = m;
  }

  async read(what: 'process' | 'cgroup' | 'ownership', f: RunningFacts): Promise<void> {
    const m = this.#m;
    if (what === 'process') {
      this.live = await pinRecorded(this.#ahead, m.identity.pid);
      f.verdict = verify(m.identity, this.live?.identity ?? null);
      f.tokenMode = m.tokenMode ?? 'argv';
      f.recordedTitle = f.tokenMode === 'argv' && !m.identity.argv.some((a) => a.includes(m.token));
      f.pidfsId = !!m.identity.pidfsId && !!this.live?.identity.pidfsId;
      f.handedOff = m.handedOff === true;
    } else if (what === 'cgroup') {
      const c = this.#fx.cgroupOf(m);
      this.cgroup = c === 'gone' ? null : c;
      f.cgroup = c === 'gone' ? 'gone' : c ? 'same' : 'none';
    } else {
      const live = this.live;
      if (!live) throw new Error(`recovery of ${m.id}: ownership asked for without a live process`);
      // The recorded identity is the launch's own record of the pid: as good as a pid it was handed. A uid the
      // target dropped to after its exec was recorded at running as the instance's uid (the claim's).
      const claim = recordedClaim(m, this.cgroup?.node ?? null);
      f.judgement = judge(claim, live.identity, undefined, true, live.environ);
      f.foreignUid = !expectedUid(claim, live.identity.uid);
      f.liveArgv = live.identity.argv;
    }
  }
}

export async function recoverRunning(fx: RecoveryEffects, ahead: PinsAhead, m: Confirmed): Promise<void> {
  const f: RunningFacts = {
    pid: m.identity.pid,
    selfPid: process.pid,
    current: m.version === MANIFEST_VERSION,
    starting: m.state === 'starting',
    paths: m.paths,
  };
  const rec = new RecordedProcess(fx, ahead, m);
  let kept = false;
  try {
    for (;;) {
      const step = decideRunning(f);
      if (step.do === 'read') {
        await rec.read(step.what, f);
        continue;
      }
      if (step.do !== 'adopt' && step.do !== 'repair') return await fx.conclude(m, step, m.identity.pid);
      const live = rec.live;
      if (!live) throw new Error(`recovery of ${m.id} cannot ${step.do} without a live process`);
      kept = true;
      await keep(fx, m, step, live, rec.cgroup).catch((err: unknown) => {
        kept = false;
        throw err;
      });
      return;
    }
  } finally {
    if (!kept) rec.live?.handle.close();
  }
}

/** Adopted or repaired: the supervisor takes the pin. A failed write of a repair fails it (the pin is closed by the caller). */
async function keep(
  fx: RecoveryEffects,
  m: Confirmed,
  o: Extract<Outcome, { do: 'adopt' | 'repair' }>,
  live: Pinned,
  cg: InstanceCgroup | null,
): Promise<void> {
  const { id } = m;
  const pid = m.identity.pid;
  if (o.do === 'adopt') {
    // Proven: an older format, or a launch cut off before readiness, is rewritten as the running manifest it is.
    const running: RunningManifest = m.state === 'starting' ? { ...m, state: 'running', updatedAt: now() } : m;
    if (o.rewrite) await fx.rewrite(running);
    fx.adopt(running, live.handle, cg, o.why === 'starting' ? 'starting' : o.leftCgroup ? 'left-cgroup' : undefined);
    if (o.leftCgroup) {
      fx.emit('warning', {
        id,
        pid,
        cgroup: cg?.path,
        message: `${id} (pid ${pid}) left its cgroup ${cg?.path}: adopted by its pidfs id; its stop ends it through its pin`,
      });
    }
    fx.emit('adopt', {
      id,
      pid,
      message:
        o.why === 'starting'
          ? `${id} (pid ${pid}) adopted: its launch was cut off before it was ready; identity verified`
          : `${id} (pid ${pid}) adopted: identity verified`,
    });
    return;
  }
  const repaired: RunningManifest = {
    ...m,
    state: 'running',
    identity: { ...live.identity, startTicks: m.identity.startTicks },
    updatedAt: now(),
  };
  await fx.store.write(repaired);
  fx.host.adopt(repaired, live.handle, cg);
  fx.report.repaired.push({ id, pid, reason: o.reason, field: o.field });
  fx.emit('repair', {
    id,
    pid,
    field: o.field,
    reason: o.reason,
    message:
      o.reason === 'renamed'
        ? `${id}: pid ${pid} ${o.field === 'exe' ? "exec'd since it was recorded" : `rewrote its ${o.field}`} (now ${JSON.stringify(live.identity.argv.join(' ').slice(0, 120))}); the kernel proves it is the process ${m.handedOff ? 'MAINPID= named' : 'launched'}, so the record is rewritten`
        : `${id}: recorded ${o.field} disagreed with the live process; re-proved by its token and paths and rewritten`,
  });
}

const now = () => new Date().toISOString();
