/**
 * What a confirmed target has become by the time it is running. Between
 * confirm and ready a daemon may drop privileges (QEMU `-runas`, dnsmasq
 * dropping to nobody) or rewrite its title (redis): the same process, by
 * the kernel's word, under another uid or argv. The running manifest
 * records what it is now, so a restarted agent judges it by what it will
 * find, not by what it was for a moment after its exec.
 *
 * "The same process" is the pidfs id (unique per boot) with the start
 * ticks; where there is no pidfs id (the js backend, kernels before 6.9),
 * the start ticks of our own unreaped child, whose pid nobody else can
 * take. Anything else keeps the confirmed identity as it was.
 */
import { sameExe } from '../process/identity.js';
import { pin } from '../process/pin.js';
import type { ProcessIdentity } from '../types.js';

export interface Settled {
  identity: ProcessIdentity;
  /** The fields that changed since confirm ('uid', 'argv'), for a warning. */
  changed: Array<'uid' | 'argv'>;
  /** Why it could not be looked at again (EMFILE...): the confirmed identity stands. */
  error?: Error;
}

export function settle(confirmed: ProcessIdentity, isChild: boolean): Settled {
  const unchanged: Settled = { identity: confirmed, changed: [] };
  let now: ProcessIdentity;
  try {
    const p = pin(confirmed.pid);
    if (!p) return unchanged;
    now = p.identity;
    p.handle.close();
  } catch (err) {
    return { ...unchanged, error: err as Error };
  }
  if (now.startTicks !== confirmed.startTicks || now.state === 'Z') return unchanged;
  // Exiting, not yet a zombie: its address space is gone, so /proc shows no argv and no exe. That is its end,
  // not what it became (a crash-looping instance is read so now and then).
  if ((now.argv.length === 0 && confirmed.argv.length > 0) || (now.exe == null && confirmed.exe != null))
    return unchanged;
  // Another executable since confirm is no title or uid change: the confirmed record stands, and recovery's
  // mismatch rule judges it.
  if (!sameExe(now.exe, confirmed.exe)) return unchanged;
  const byPidfs = confirmed.pidfsId != null && now.pidfsId === confirmed.pidfsId;
  const byChild = confirmed.pidfsId == null && now.pidfsId == null && isChild;
  if (!byPidfs && !byChild) return unchanged;
  const changed: Settled['changed'] = [];
  if (now.uid !== confirmed.uid) changed.push('uid');
  if (now.argv.length !== confirmed.argv.length || now.argv.some((a, i) => a !== confirmed.argv[i]))
    changed.push('argv');
  if (changed.length === 0) return unchanged;
  return { identity: { ...confirmed, uid: now.uid, argv: now.argv }, changed };
}
