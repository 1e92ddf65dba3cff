/**
 * Interrupted launches: a supervisor died mid-launch, before its process was
 * confirmed (a `starting` manifest with no identity). The target is found as
 * launch would have found it: from the pidfile (pidfile launches), else
 * among the token's carriers, judged by the same rule as confirm (a launcher
 * or its fork is never taken for its target; a carrier the rule rejects is
 * left alone). Carriers that never become a target within the confirm bound
 * (a launcher whose target never exec'd) are ended as abandon would have,
 * only where they are provably custody's launcher or target. Where its
 * cgroup is gone, whatever of it runs was moved out: its target, found by
 * its own marks, is quarantined with its pid, never signalled nor cleaned away.
 */
import { backend } from '../backend/index.js';
import { BadPidfileError } from '../errors.js';
import type { Emit } from '../events.js';
import { readPidfile } from '../lifecycle/pidfile.js';
import type { InstanceCgroup } from '../process/cgroup.js';
import { unitCgroupOf } from '../process/unit-cgroup.js';
import type { ProcessHandle } from '../process/handle.js';
import { type Claim, describeRejection, isMember, type Judgement, judge } from '../process/ownership.js';
import { terminateMembers } from '../process/tree.js';
import type { Manifest, RunningManifest, StartingManifest } from '../state/manifest.js';
import { backoff } from '../timing.js';
import { launcherClaim, targetClaim } from './claims.js';
import { decideStarting, LEFTOVER_GRACE_MS, STARTING_CONFIRM_MS, type StartingFacts } from './decide.js';
import type { Quarantined, RecoveryEffects } from './effects.js';
import { type Pinned, pin } from './pins.js';
import type { TokenScan } from './scan.js';

/**
 * A carrier of the instance's token that the rule rejects is left alone, and said so once: a warning naming
 * why (nothing for one that is gone, or the launcher). One whose environment may not be read is added to
 * `unreadable`, which may be the instance's and so proves nothing either way.
 */
export function rejectCarrier(emit: Emit, m: Manifest, pid: number, j: Judgement, unreadable: Set<number>): void {
  if (j.ours || j.why === 'gone' || j.why === 'launcher') return;
  if (j.why === 'environ') {
    // Said once per process: the wait for a target may ask again.
    if (unreadable.has(pid)) return;
    unreadable.add(pid);
  }
  emit('warning', { id: m.id, pid, reason: j.why, message: `recovery of ${m.id}: ${describeRejection(pid, j.why)}` });
}

/**
 * A launch cut off before confirm: the only kind judged here. One cut off after confirm (readiness pending)
 * carries its confirmed identity and is judged as a running instance is (running.ts), whatever became of
 * its cgroup: one judge, so a rule for a main process that left its cgroup holds for both.
 */
export type Interrupted = StartingManifest & { identity: null };

export function isInterrupted(m: Manifest): m is Interrupted {
  return m.state === 'starting' && m.identity === null;
}

export class InterruptedLaunches {
  readonly #fx: RecoveryEffects;
  readonly #scan: TokenScan;
  // One confirm bound for every interrupted launch, from the first one looked at: all were
  // interrupted by the same crash, and a bystander carrying each token (anyone may read one
  // in /proc) would otherwise hold open() for a bound per manifest.
  #deadline: number | undefined;
  // Per interrupted env-mode launch: the candidates whose environment may not be read.
  readonly #unreadableEnv = new Map<string, Set<number>>();

  constructor(fx: RecoveryEffects, scan: TokenScan) {
    this.#fx = fx;
    this.#scan = scan;
  }

  #unreadableOf(m: Manifest): Set<number> {
    let set = this.#unreadableEnv.get(m.id);
    if (!set) {
      set = new Set();
      this.#unreadableEnv.set(m.id, set);
    }
    return set;
  }

  async recover(m: Interrupted): Promise<void> {
    const fx = this.#fx;
    const c = fx.cgroupOf(m);
    const group = c === 'gone' ? null : c;
    const inside = m.pidSource !== 'function' ? group : null;
    const target: Claim = { ...targetClaim(m), cgroup: inside?.node ?? null };
    const f: StartingFacts = {
      pidSource: m.pidSource,
      executable: !!m.executable,
      cgroup: c === 'gone' ? 'gone' : c ? 'same' : 'none',
      unreadable: 0,
    };
    this.#deadline ??= Date.now() + STARTING_CONFIRM_MS;
    const deadline = this.#deadline;
    const waits = backoff({ firstMs: 5, maxMs: 100, deadline });
    await waits.next();
    // With a cgroup the candidates are its members: a token carrier outside it is a bystander, never one.
    let candidates: number[] | null = null;
    let chosen: Pinned | null = null;
    let forks: Set<number> | null = null;
    // Which of them were seen past their exec, still running.
    const execd = new Set<number>();
    // Which of those were found the target once, and are looked at again before they are taken.
    const relooked = new Set<number>();
    try {
      for (;;) {
        f.unreadable = this.#unreadableOf(m).size;
        const step = decideStarting(f);
        switch (step.do) {
          case 'count-carriers':
            f.carriers = (await this.#scan.carriersOf(m)).length;
            break;
          case 'look-forks': {
            forks ??= await this.#scan.unexecd(m);
            const image = m.forkImage ?? '';
            const settled: number[] = [];
            for (const pid of [...forks]) {
              const stage = backend.execStage(pid, image);
              if (stage === 'fork' || stage === 'exec') continue;
              forks.delete(pid);
              if (stage === 'done') execd.add(pid);
              settled.push(pid);
            }
            this.#scan.settled(settled);
            f.preExec = forks.size;
            f.timedOut = Date.now() >= deadline;
            break;
          }
          case 'look': {
            const looked: number[] = candidates ?? (inside ? inside.procs() : await this.#scan.carriersOf(m));
            try {
              chosen = await this.#findTarget(m, target, looked, inside !== null);
            } catch (err) {
              // Launch would have failed on it; recovery cannot tell what it named: kept, never signalled.
              if (!(err instanceof BadPidfileError)) throw err;
              f.pidfileRefused = true;
              break;
            }
            // The fork itself, found the target just past its exec, may be a launcher that is the expected
            // program too and forks the target and exits at once: taken only if a later look finds it again.
            if (chosen && execd.has(chosen.identity.pid) && !relooked.has(chosen.identity.pid)) {
              relooked.add(chosen.identity.pid);
              chosen.handle.close();
              chosen = null;
            }
            f.found = chosen !== null;
            if (chosen) break;
            if (inside) {
              candidates = inside.procs();
              f.waitable = candidates.length;
            } else {
              // Only the candidates (and what they forked since) are looked at again, never the whole table,
              // unless one exited since it was listed: it may have started the target first (a launcher that
              // runs it in the background and exits), which, re-parented away, is no candidate's child. A zombie
              // has exited (what it forked is re-parented already), however long its reaper takes.
              const live = looked.filter((pid) => !['Z', 'X', undefined].includes(backend.stat(pid)?.state));
              // So has a fork seen past its exec that the listing does not show as a carrier and that runs its
              // argv no more: the listing (its pids read first, each process after) caught it in its exit, and
              // the target it forked just before may be missing from it. Counted once.
              const image = m.forkImage ?? '';
              const left = [...execd].filter(
                (pid) => !looked.includes(pid) && backend.execStage(pid, image) !== 'done',
              );
              for (const pid of left) execd.delete(pid);
              const exited = [...looked.filter((pid) => !live.includes(pid)), ...left];
              if (exited.length > 0) this.#scan.exited(exited);
              candidates =
                exited.length > 0 ? null : [...new Set([...live, ...live.flatMap((pid) => backend.children(pid))])];
              // An environment that may not be read stays so: waiting cannot prove those.
              const unreadable = this.#unreadableOf(m);
              f.waitable = live.filter((pid) => !unreadable.has(pid)).length + exited.length;
            }
            // A fork that exec'd while recovery waited, and is this launch's (a carrier, or a candidate now).
            f.forkExecd = [...execd].some((pid) => looked.includes(pid) || candidates?.includes(pid));
            f.timedOut = Date.now() >= deadline;
            break;
          }
          case 'wait':
            if ((await waits.next()).done) f.timedOut = true;
            else {
              f.found = undefined;
              f.preExec = undefined;
            }
            break;
          case 'end-carriers':
            await this.#endOurs(m, [target, launcherClaim(m)], candidates ?? []);
            f.ended = true;
            break;
          case 'adopt': {
            if (!chosen) throw new Error(`recovery of ${m.id}: adopt without a target`);
            const p = chosen;
            chosen = null;
            return await this.#adopt(m, p, group);
          }
          case 'quarantine':
            if (chosen) return await this.#movedOut(m, chosen, step);
            return await fx.conclude(m, step);
          default:
            return await fx.conclude(m, step);
        }
      }
    } finally {
      chosen?.handle.close();
      await waits.return();
    }
  }

  async #adopt(m: StartingManifest, chosen: Pinned, group: InstanceCgroup | null): Promise<void> {
    const inside = group && isMember(chosen.identity, { pids: new Set(), cgroup: group.node }) ? group : null;
    // A pid function's target in a systemd unit of the launch's is in the instance's cgroup, as launch finds it.
    const kept = inside ?? (m.pidSource === 'function' ? unitCgroupOf(chosen.identity, m.token) : null);
    const recorded = kept?.unit ? { path: kept.path, id: kept.id, unit: true as const } : kept ? m.cgroup : null;
    const running: RunningManifest = {
      ...m,
      state: 'running',
      identity: chosen.identity,
      cgroup: recorded,
      updatedAt: new Date().toISOString(),
    };
    try {
      await this.#fx.store.write(running);
    } catch (err) {
      chosen.handle.close();
      throw err;
    }
    this.#fx.adopt(running, chosen.handle, kept, 'starting');
    this.#fx.emit('adopt', {
      id: m.id,
      pid: chosen.identity.pid,
      message: `${m.id}: a launch interrupted mid-way was found and adopted`,
    });
  }

  /** Its target, found by its own marks outside the cgroup that was removed: recorded for the operator, never signalled. */
  async #movedOut(m: Interrupted, found: Pinned, o: Quarantined): Promise<void> {
    const { pid } = found.identity;
    this.#fx.emit('warning', {
      id: m.id,
      pid,
      message: `recovery of ${m.id}: pid ${pid} shows its launch's marks in cgroup ${backend.cgroupOf(pid)}, and its own cgroup ${m.cgroup?.path} is gone: moved out, so not signalled; quarantined for the operator`,
    });
    const entry = await this.#fx.quarantine(m.id, m, o);
    entry.pid = pid;
  }

  /** The interrupted launch's target among the candidates, pinned; null when there is none (yet). Members of its cgroup that are not it are not reported. */
  async #findTarget(m: Manifest, claim: Claim, candidates: number[], members: boolean): Promise<Pinned | null> {
    if (m.pidSource === 'file' && m.pidFile) {
      // As launch does: the pidfile names the target (a -daemonize parent has its exe and argv too).
      const pid = readPidfile(m.pidFile);
      if (pid === null) return null;
      const p = pin(pid);
      const j = p && judge(claim, p.identity, undefined, true, p.environ);
      if (p && j?.ours) return p;
      if (j && !j.ours && j.why === 'environ') this.#unreadableOf(m).add(pid);
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
        if (!members) rejectCarrier(this.#fx.emit, m, p.identity.pid, j, this.#unreadableOf(m));
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

  /** Ends every candidate that is provably this launch's (target or launcher), with what descends from it. */
  async #endOurs(m: Manifest, claims: Claim[], candidates: number[]): Promise<void> {
    const roots: ProcessHandle[] = [];
    for (const pid of candidates) {
      const p = pin(pid);
      if (!p) continue;
      const verdicts = claims.map((c) => judge(c, p.identity, undefined, false, p.environ));
      const first = verdicts[0];
      if (verdicts.some((v) => v.ours)) roots.push(p.handle);
      else {
        if (first) rejectCarrier(this.#fx.emit, m, pid, first, this.#unreadableOf(m));
        p.handle.close();
      }
    }
    if (roots.length === 0) return;
    try {
      await terminateMembers(roots, {
        session: m.session ?? null,
        graceMs: LEFTOVER_GRACE_MS,
        reapIfChild: true,
        onEscalate: ({ pid }) =>
          this.#fx.emit('escalate', {
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
