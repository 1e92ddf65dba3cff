/**
 * The launch's side of `ready: 'notify'`: the view of an attempt its notify
 * channel reads, and the one place an accepted MAINPID becomes the
 * attempt's target. The channel (notify.ts) never sees the attempt itself.
 */
import type { Emit } from '../events.js';
import { type Attempt, claimOf, targetExitedError } from './launch.js';
import { type MainPid, NotifyChannel } from './notify.js';

/**
 * Binds the attempt's notify socket (ready: 'notify'). The channel reads the attempt through this view and
 * hands an accepted MAINPID back; confirm() and takeMainPid() are what write the attempt's target.
 */
export function openNotify(a: Attempt, emit: Emit, record: () => Promise<void>): NotifyChannel {
  return NotifyChannel.open(
    {
      id: a.id,
      child: () => a.child,
      target: () => (a.target && a.identity ? { handle: a.target, identity: a.identity } : null),
      session: () => a.session,
      claim: () => claimOf(a),
      handOff: async (next) => {
        // Recorded, fsync'd, before the wait goes on: an agent killed before READY=1 leaves the target's identity.
        if (takeMainPid(a, next, emit)) await record();
      },
      exitedError: (target, signal) => targetExitedError(a, target, signal),
    },
    emit,
  );
}

/** Makes an accepted MAINPID the target, its identity recorded from the inspection that accepted it; false if it was already. */
function takeMainPid(a: Attempt, next: MainPid, emit: Emit): boolean {
  const old = a.target;
  if (old && old.pid === next.identity.pid) {
    next.handle.close();
    return false;
  }
  a.target = next.handle;
  a.identity = next.identity;
  // The main process is the one named now, not one the launch confirmed: the records say so (settle, recovery).
  a.handedOff = true;
  if (old && old !== a.child) old.close();
  const proof = next.by === 'token' ? 'by its own marks' : `a member of the instance (by ${next.by})`;
  emit('confirm', {
    id: a.id,
    pid: next.identity.pid,
    identity: next.identity,
    message:
      `MAINPID=${next.identity.pid} (sent by pid ${next.from}) passed the ownership rule, ${proof}: the target now, ` +
      'its identity recorded from that inspection',
  });
  return true;
}
