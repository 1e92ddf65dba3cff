// Its own file: being a subreaper is process-wide, and only this worker
// should be one. The reaper (src/process/reaper.ts) reaps or pins what is
// re-parented to us only when it is in the session of an instance a
// registered supervisor names: an orphan of anyone else's session is never
// touched, a zombie is reaped, a live orphan is pinned so its exit is reaped
// and a stop can find it (orphansInSession).
import { spawn as cpSpawn } from 'node:child_process';
import { writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { addReaperSource, orphansInSession, reapMembers, removeReaperSource } from '../../src/process/reaper.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { processesWithMarker } from '../helpers/leaks.js';
import { killAndWait, killOwn, MARKER, procStat, tmpDir, waitFor } from '../helpers/procs.js';
import { PERL } from '../helpers/supervisor.js';

const cleanups = cleanupAfterEach({ marker: MARKER });

/**
 * A session leader (a child_process child, detached) whose child forks `script` as a grandchild and exits:
 * the grandchild is re-parented to us, in the leader's session. Resolves with both pids once it is ours.
 */
async function orphanIn(name: string, script: string) {
  const prog = `my $c = fork; if (!$c) { exec($^X, '-e', $ARGV[2], '--', $ARGV[1], $ARGV[0]) if !fork; exit 0 } waitpid($c, 0); sleep 60`;
  const leader = cpSpawn(PERL, ['-e', prog, MARKER, name, script], { stdio: 'ignore', detached: true });
  cleanups.push(() => killAndWait(leader));
  const orphan = await waitFor(
    () =>
      processesWithMarker(MARKER).find(
        (p) => p.pid !== leader.pid && p.cmd.includes(` ${name} `) && p.ppid === process.pid,
      ),
    5000,
    `${name} to be re-parented to us`,
  );
  return { session: leader.pid!, pid: orphan.pid };
}

const ourZombie = (pid: number) => {
  const st = procStat(pid);
  return st?.[0] === 'Z' && st[1] === String(process.pid);
};

describe(`the subreaper's reaping (${backend.name})`, () => {
  it.skipIf(backend.name !== 'js')('the js backend cannot be a subreaper, and says so', () => {
    expect(backend.setChildSubreaper(true)).toBe(false);
    expect(backend.childSubreaper()).toBeNull();
  });

  it.skipIf(backend.name !== 'native')("reaps and pins only what is in a registered instance's session", async () => {
    expect(backend.setChildSubreaper(true)).toBe(true);
    cleanups.push(() => void backend.setChildSubreaper(false));
    // Exits once the gate exists: found (by its argv) while alive, then a zombie of ours.
    const dir = tmpDir('custody-reaper-');
    cleanups.push(dir.cleanup);
    const gate = join(dir.path, 'gate');
    const untilGate = `select(undef, undef, undef, 0.02) until -e '${gate}'`;
    const ownZombie = await orphanIn('own-zombie', untilGate);
    const strangerZombie = await orphanIn('stranger-zombie', untilGate);
    const ownLive = await orphanIn('own-live', 'sleep 60');
    cleanups.push(() => void killOwn(ownLive.pid));
    writeFileSync(gate, '');
    await waitFor(() => ourZombie(ownZombie.pid) && ourZombie(strangerZombie.pid), 5000, 'the zombies');
    // Nobody registered: nothing is ours to reap.
    expect(reapMembers()).toEqual([]);
    const sessions = [ownZombie.session, ownLive.session];
    // As a supervisor does: the instances' sessions, and their main processes, which it watches itself.
    const source = () => ({ sessions, pids: [ownZombie.session, ownLive.session, strangerZombie.session] });
    addReaperSource(source);
    cleanups.push(async () => {
      // Whatever a failed test left: ended and reaped while still registered, then unregistered.
      killOwn(ownLive.pid);
      sessions.push(strangerZombie.session);
      await waitFor(
        () => (reapMembers(), [ownLive.pid, strangerZombie.pid].every((pid) => !procStat(pid))),
        5000,
        'the orphans to be reaped',
      );
      removeReaperSource(source);
    });
    expect(reapMembers()).toEqual([ownZombie.pid]);
    expect(procStat(ownZombie.pid)).toBeNull();
    expect(ourZombie(strangerZombie.pid)).toBe(true);
    // The live one is pinned: a stop finds it by its session, and its exit is reaped.
    const pinned = orphansInSession(ownLive.session);
    expect(pinned.map((h) => h.pid)).toEqual([ownLive.pid]);
    expect(orphansInSession(strangerZombie.session)).toEqual([]);
    pinned[0]!.signal('SIGKILL');
    await waitFor(() => procStat(ownLive.pid) === null, 5000, 'the pinned orphan to be reaped');
    // Registered now, the other session's zombie is reaped like any member.
    sessions.push(strangerZombie.session);
    expect(reapMembers()).toEqual([strangerZombie.pid]);
  });
});
