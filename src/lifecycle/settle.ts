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
 *
 * A main process handed off by MAINPID= (ready: 'notify') may have been
 * named before its exec (a launcher's `cmd & systemd-notify --pid=$!` names
 * its fork): there a new executable is what it became too, recorded where
 * the pidfs id proves it the process named.
 */
import { sameExe } from '../process/identity.js';
import { pin } from '../process/pin.js';
import type { ProcessIdentity } from '../types.js';

export interface Settled {
  identity: ProcessIdentity;
  /** The fields that changed since confirm ('uid', 'argv'; 'exe' only for a hand-off), for a warning. */
  changed: Array<'uid' | 'argv' | 'exe'>;
  /** Why it could not be looked at again (EMFILE...): the confirmed identity stands. */
  error?: Error;
}

export function settle(confirmed: ProcessIdentity, isChild: boolean, handedOff = false): Settled {
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
  const byPidfs = confirmed.pidfsId != null && now.pidfsId === confirmed.pidfsId;
  const exec = !sameExe(now.exe, confirmed.exe);
  // Another executable since confirm is no title or uid change: the confirmed record stands, and recovery's
  // mismatch rule judges it. Unless the process was handed off, and the kernel names it the one handed.
  if (exec && !(handedOff && byPidfs)) return unchanged;
  const byChild = confirmed.pidfsId == null && now.pidfsId == null && isChild;
  if (!byPidfs && !byChild) return unchanged;
  const changed: Settled['changed'] = [];
  if (now.uid !== confirmed.uid) changed.push('uid');
  if (now.argv.length !== confirmed.argv.length || now.argv.some((a, i) => a !== confirmed.argv[i]))
    changed.push('argv');
  if (exec) changed.push('exe');
  if (changed.length === 0) return unchanged;
  return { identity: { ...confirmed, uid: now.uid, argv: now.argv, exe: now.exe }, changed };
}
