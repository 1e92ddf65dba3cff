/**
 * `ready: 'notify'`: systemd's sd_notify protocol, as a Type=notify service
 * speaks it. custody binds a unix datagram socket to an abstract name (no
 * file, no 108-byte sun_path limit to mind), passes it as NOTIFY_SOCKET, and
 * reads what arrives on the loop with each sender's credentials.
 *
 * Anyone in the network namespace can send to an abstract socket, so a
 * datagram counts only when its sender is the instance's: the sender is read
 * under a pin and judged by the ownership rule (the target, our child, a
 * process in the session custody created, a descendant, or one with the
 * instance's marks). Where the kernel attaches a pidfd on the sender
 * (SO_PASSPIDFD, Linux 6.5) the pin is checked against it, so a sender that
 * exited and whose pid was taken by a member is not mistaken for it; without
 * it the window is the time between send and read. What counts:
 * - `READY=1`: ready;
 * - `STATUS=...`: a `status` event;
 * - `MAINPID=n`: n becomes the target only if it is a member of the instance
 *   (in its cgroup, a child of a pinned member, in the session custody
 *   created), token or not, as systemd takes a MAINPID= from its unit's
 *   cgroup (a launcher that forks the daemon and says `systemd-notify
 *   --ready --pid=$!`), or else passes the rule on its own marks, as a pid a
 *   launcher reports would; recorded from the inspection that judged it.
 *   The channel hands it to the launch (NotifyLaunch.handOff), which alone
 *   writes what its target is.
 * Everything else is ignored. So is a datagram whose control data did not
 * fit (MSG_CTRUNC: more fds than the few a barrier passes), whoever sent it;
 * custody keeps no fd a datagram brings (it has no FDSTORE), each is closed
 * once its datagram is handled (native/notify.cc). Before confirm, what a
 * sender not yet provable sends is held under its pin and judged again once
 * the target is known: the spawned child's descendants' datagrams are kept,
 * everyone else's share a few slots, the oldest dropped first.
 *
 * Once ready, the socket stays while the target runs and this supervisor
 * watches it (STATUS= keeps coming as status events; MAINPID= is no longer
 * followed); a supervisor that adopts the instance after a restart does not
 * bind it again, so notifications then go nowhere (sd_notify reports an
 * error the daemon may ignore).
 */
import { randomBytes } from 'node:crypto';
import { backend } from '../backend/index.js';
import type { NotifyDatagram, NotifyListener } from '../backend/types.js';
import { ReadyTimeoutError } from '../errors.js';
import type { Emit } from '../events.js';
import type { ProcessHandle } from '../process/handle.js';
import { type Claim, describeRejection, judge, type Members, type Rejection } from '../process/ownership.js';
import { pin } from '../process/pin.js';
import { isTargetPid } from './pidfile.js';
import { TIMED_OUT, within } from '../timing.js';
import type { ProcessIdentity } from '../types.js';

/** One notification's assignments (newline-separated KEY=VALUE, as sd_notify(3) sends them). */
export interface Notification {
  ready: boolean;
  status?: string;
  /** MAINPID's value as sent; check it with isTargetPid. */
  mainPid?: number;
  /** WATCHDOG=1 (a keep-alive ping) or WATCHDOG=trigger (fail now), for `watchdogMs`. */
  watchdog?: 'ping' | 'trigger';
  /** Every assignment, for diagnostics. */
  fields: Map<string, string>;
}

/** Parses one datagram. Pure: tested on fixtures. Lines without '=' are ignored, as systemd ignores them. */
export function parseNotification(data: Buffer): Notification {
  const fields = new Map<string, string>();
  for (const line of data.toString('utf8').split('\n')) {
    const eq = line.indexOf('=');
    if (eq <= 0) continue;
    fields.set(line.slice(0, eq), line.slice(eq + 1));
  }
  const n: Notification = { ready: fields.get('READY') === '1', fields };
  const status = fields.get('STATUS');
  if (status !== undefined) n.status = status;
  const watchdog = fields.get('WATCHDOG');
  if (watchdog === '1') n.watchdog = 'ping';
  else if (watchdog === 'trigger') n.watchdog = 'trigger';
  const main = fields.get('MAINPID');
  if (main !== undefined && /^[0-9]{1,10}$/.test(main)) n.mainPid = Number(main);
  else if (main !== undefined) n.mainPid = Number.NaN;
  return n;
}

/** Warnings about ignored senders per launch: a flood of strangers must not flood the sink. */
const MAX_WARNINGS = 5;
/**
 * Datagrams held, with their pinned senders, until the target is confirmed and they can be judged again:
 * those from processes outside the launch's tree share these slots, the oldest dropped first, so the
 * newest (a daemon's READY=1 after a stranger's flood) is never the one lost.
 */
const MAX_DEFERRED = 64;
/**
 * Those from the spawned child's descendants are kept whatever others send. Bounded all the same: each
 * holds a pin (an fd), and a runaway instance must not exhaust them; past it, their oldest goes.
 */
const MAX_DEFERRED_TREE = 256;
/** Parent links followed to find whether a sender descends from the spawned child. */
const MAX_TREE_DEPTH = 64;
/** Rejections that knowing the target cannot change. */
const FINAL = new Set<Rejection | 'unknown'>([
  'unknown',
  'gone',
  'init',
  'self',
  'ancestor',
  'uid',
  'namespace',
  'environ',
  'cgroup',
]);

/** `ppid`: the sender's parent, read under its pin (absent when it could not be read). */
type Sender = { ours: true; pid: number } | { ours: false; pid: number; why: Rejection | 'unknown'; ppid?: number };

/** A datagram held for the target; `tree`: its sender descended from the spawned child when it was read. */
interface Deferred {
  d: NotifyDatagram;
  tree: boolean;
}

/** A MAINPID= that passed the ownership rule, pinned by the inspection that accepted it. */
export interface MainPid {
  handle: ProcessHandle;
  identity: ProcessIdentity;
  /** The pid that sent it. */
  from: number;
  /** What proved it the instance's: membership (cgroup, descent, session) or its own marks (token). */
  by: 'cgroup' | 'descent' | 'session' | 'token';
}

/**
 * The launch a channel serves, as the channel sees it: it reads the launch through these and hands an
 * accepted MAINPID back, so that the launch alone decides (and records) what its target is.
 */
export interface NotifyLaunch {
  readonly id: string;
  /** The process spawned for the launch; null before the spawn. */
  child(): ProcessHandle | null;
  /** The confirmed target, pinned, and the identity recorded from the confirming inspection; null before confirm. */
  target(): { handle: ProcessHandle; identity: ProcessIdentity } | null;
  /** The session custody created for the launch, whose every process is its; null without one. */
  session(): number | null;
  /** What the launch's processes must show, for the ownership rule. */
  claim(): Claim;
  /**
   * An accepted MAINPID: the launch makes it the target (and records it, before the wait goes on), or closes
   * it if it names the target already.
   */
  handOff(next: MainPid): void | Promise<void>;
  /** What wait() fails with when the target exits before READY=1 (its status and stderr tail). */
  exitedError(target: ProcessHandle, signal?: AbortSignal): Promise<Error>;
}

export class NotifyChannel {
  /** NOTIFY_SOCKET's value. */
  readonly address: string;
  /** The name it was bound under (recorded in the manifest, bound again at adoption). */
  readonly name: string;
  readonly #listener: NotifyListener;
  readonly #launch: NotifyLaunch;
  readonly #emit: Emit;
  #ready = false;
  /** A MAINPID accepted and pinned, not yet made the target. */
  #mainPid: MainPid | null = null;
  #wake: (() => void) | null = null;
  #ignored = 0;
  #lastStatus: string | undefined;
  #error: Error | null = null;
  #closed = false;
  /** Rejected before confirm, sender pinned: judged again once the target is known, in the order sent. */
  #deferred: Deferred[] = [];
  /** Ready and running: only STATUS= (and barriers) count now. */
  #running = false;

  private constructor(launch: NotifyLaunch, emit: Emit, name: string) {
    this.#launch = launch;
    this.#emit = emit;
    this.name = name;
    this.#listener = backend.openNotify(name, (d, error) => this.#receive(d, error));
    this.address = this.#listener.address;
  }

  /**
   * Binds the socket (ERR_CUSTODY_UNSUPPORTED on the js backend). Open it before the spawn: nothing sent is
   * lost. `name`: the one an adopted instance was given (its NOTIFY_SOCKET), bound again; EADDRINUSE where
   * another process holds it now.
   */
  static open(
    launch: NotifyLaunch,
    emit: Emit,
    name = `custody/notify/${randomBytes(16).toString('hex')}`,
  ): NotifyChannel {
    return new NotifyChannel(launch, emit, name);
  }

  #receive(d: NotifyDatagram | null, error: Error | null): void {
    if (d) this.#take(d, this.#launch.target() === null);
    if (error) this.#error ??= error;
    this.#wake?.();
  }

  /** Handles one datagram; closes its sender's pin unless it is deferred (`mayDefer`: not yet confirmed). */
  #take(d: NotifyDatagram, mayDefer: boolean): void {
    let kept = false;
    try {
      kept = this.#onDatagram(d, mayDefer);
    } catch (err) {
      // The kernel could not answer (EMFILE...): the launch fails with it rather than guess.
      this.#error ??= err as Error;
    } finally {
      if (!kept && d.sender && d.sender !== 'gone') d.sender.close();
    }
  }

  /** Returns true when the datagram was deferred (its sender stays pinned). */
  #onDatagram(d: NotifyDatagram, mayDefer: boolean): boolean {
    if (this.#closed) return false;
    // custody takes no fds (no FDSTORE): more than a barrier's few means the kernel dropped some of what
    // was sent, so the datagram is not the one its sender wrote, whoever that is.
    if (d.controlTruncated) {
      this.#ignore(d.pid, `a datagram with more fds than a notification passes (${d.fds} arrived and were closed)`);
      return false;
    }
    if (d.truncated) {
      this.#ignore(d.pid, 'a notification longer than 4096 bytes');
      return false;
    }
    const n = parseNotification(d.data);
    if (!n.ready && n.status === undefined && n.mainPid === undefined && n.watchdog === undefined) return false;
    const sender = this.#judgeSender(d);
    if (!sender.ours) {
      // Before confirm the target is not known yet (a daemon can say READY=1 before its launcher's pidfile is
      // read): a sender the kernel pinned for us is judged again then, still under that pin.
      if (mayDefer && d.sender && d.sender !== 'gone' && !FINAL.has(sender.why)) {
        this.#defer({ d, tree: sender.ppid !== undefined && this.#descendsFromChild(sender.ppid) });
        return true;
      }
      const why = sender.why === 'unknown' ? 'the kernel named no sender' : describeRejection(sender.pid, sender.why);
      this.#ignore(d.pid, why);
      return false;
    }
    const id = this.#launch.id;
    if (n.status !== undefined) {
      this.#lastStatus = n.status;
      this.#emit('status', { id, pid: sender.pid, status: n.status, message: `STATUS=${n.status}` });
    }
    if (n.watchdog !== undefined && this.#running) this.#onWatchdog?.(n.watchdog);
    if (this.#running) {
      // The target was recorded at launch: a later MAINPID= would be a new one, unproven for recovery.
      if (n.mainPid !== undefined) this.#ignore(sender.pid, `MAINPID=${n.mainPid} once running is not followed`);
      return false;
    }
    if (n.mainPid !== undefined) this.#offerMainPid(n.mainPid, sender.pid);
    if (n.ready) this.#ready = true;
    return false;
  }

  /** Holds a datagram for the target; past its kind's slots, the oldest of that kind is dropped (a warning). */
  #defer(entry: Deferred): void {
    this.#deferred.push(entry);
    const kept = this.#deferred.filter((e) => e.tree === entry.tree).length;
    if (kept <= (entry.tree ? MAX_DEFERRED_TREE : MAX_DEFERRED)) return;
    const at = this.#deferred.findIndex((e) => e.tree === entry.tree);
    const [{ d: oldest }] = this.#deferred.splice(at, 1) as [Deferred];
    if (oldest.sender && oldest.sender !== 'gone') oldest.sender.close();
    const whose = entry.tree ? "the launch's own processes" : 'processes outside the launch';
    this.#ignore(oldest.pid, `held until the target is known, it was the oldest of too many from ${whose}`);
  }

  /**
   * Whether a sender whose parent is `ppid` (read under the sender's pin) descends from the spawned child,
   * by parent links read now. Not proof: a link's pid may change hands between reads. It only chooses which
   * held datagrams are kept; each is judged again, under its sender's pin, once the target is confirmed.
   */
  #descendsFromChild(ppid: number): boolean {
    const child = this.#launch.child();
    // Not yet reaped: its pid cannot be anyone else's.
    if (!child || child.hasExited) return false;
    let pid = ppid;
    for (let depth = 0; depth < MAX_TREE_DEPTH && pid > 1; depth++) {
      if (pid === child.pid) return true;
      const st = backend.stat(pid);
      if (!st) return false;
      pid = st.ppid;
    }
    return false;
  }

  #ignore(pid: number, why: string): void {
    this.#ignored++;
    if (this.#ignored > MAX_WARNINGS) return;
    const more = this.#ignored === MAX_WARNINGS ? ' (further ones are not reported)' : '';
    this.#emit('warning', {
      id: this.#launch.id,
      pid,
      message: `notification on ${this.address} ignored: ${why}${more}`,
    });
  }

  /**
   * Whether the sender is the instance's. Read under a pin of its own, checked against the kernel's pidfd
   * on the sender where there is one: alive after the read means the pid was still the sender's.
   */
  #judgeSender(d: NotifyDatagram): Sender {
    const pid = d.pid;
    // pid 1 is no target pid, but it is a sender (as root, systemd-notify --pid=1 sends as pid 1).
    if (!isTargetPid(pid)) return { ours: false, pid, why: pid === 1 ? 'init' : 'unknown' };
    // The kernel's pin names the sender exactly: the confirmed target is ours even if it exited since it sent
    // (a daemon's parent that says MAINPID= and READY=1, then exits).
    const target = this.#launch.target()?.identity;
    if (d.senderId !== null && target?.pidfsId && d.senderId === target.pidfsId && pid === target.pid)
      return { ours: true, pid };
    if (d.sender === 'gone') return { ours: false, pid, why: 'gone' };
    const pinned = pin(pid);
    if (!pinned) return { ours: false, pid, why: 'gone' };
    try {
      if (d.sender && !backend.pinnedAlive(d.sender)) return { ours: false, pid, why: 'gone' };
      const live = pinned.identity;
      if (this.#held(live)) return { ours: true, pid };
      const j = judge(this.#launch.claim(), live, this.#members(), false, pinned.environ);
      return j.ours ? { ours: true, pid } : { ours: false, pid, why: j.why, ppid: live.ppid };
    } finally {
      pinned.handle.close();
    }
  }

  /**
   * Who is the instance's now, for the descent rule: the pins still held (an exited launcher's pid may be
   * someone else's by now, and so its children), the session custody created, and the instance cgroup (the
   * claim's), which where there is one is all that counts.
   */
  #members(): Members {
    const launch = this.#launch;
    const held = [launch.child(), launch.target()?.handle].filter((h): h is ProcessHandle => !!h && !h.hasExited);
    return { pids: new Set(held.map((h) => h.pid)), session: launch.session(), cgroup: launch.claim().cgroup ?? null };
  }

  /** The live process is one custody already holds for the attempt: its own child (unreaped) or the confirmed target. */
  #held(live: ProcessIdentity): boolean {
    if (live.state === 'Z' || live.state === 'X') return false;
    const child = this.#launch.child();
    if (child && live.pid === child.pid && !child.exitStatus) return true;
    const target = this.#launch.target();
    if (!target) return false;
    const id = target.identity;
    return (
      live.pid === target.handle.pid &&
      live.startTicks === id.startTicks &&
      (!id.pidfsId || !live.pidfsId || id.pidfsId === live.pidfsId)
    );
  }

  /**
   * MAINPID=n from an accepted sender: pinned and judged with the instance's members, so a daemon its launcher
   * forked is taken without a token (it carries none: the launcher's argv has it); anything else only on its
   * own marks, as a pid a launcher reports. pid 1, ourselves and our ancestors never.
   */
  #offerMainPid(pid: number, from: number): void {
    if (pid === 1) {
      this.#ignore(from, `MAINPID=1: ${describeRejection(1, 'init')}`);
      return;
    }
    if (!isTargetPid(pid)) {
      this.#ignore(from, `MAINPID=${String(pid)} is not a pid`);
      return;
    }
    if (this.#launch.target()?.handle.pid === pid && !this.#mainPid) return;
    const pinned = pin(pid, { reapIfChild: true });
    if (!pinned) {
      this.#ignore(from, `MAINPID=${pid} names no process`);
      return;
    }
    const j = judge(this.#launch.claim(), pinned.identity, this.#members(), true, pinned.environ);
    if (!j.ours) {
      pinned.handle.close();
      this.#ignore(from, `MAINPID=${pid}: ${describeRejection(pid, j.why)}`);
      return;
    }
    this.#mainPid?.handle.close();
    this.#mainPid = { handle: pinned.handle, identity: pinned.identity, from, by: j.by };
  }

  /** Hands an accepted MAINPID to the launch, which makes it the target (recorded from the inspection that accepted it). */
  async #handOffMainPid(): Promise<void> {
    const next = this.#mainPid;
    if (!next) return;
    this.#mainPid = null;
    await this.#launch.handOff(next);
  }

  /**
   * After confirm: resolves once an accepted READY=1 has arrived (perhaps long before), applying MAINPID as it
   * comes. Fails the moment the target exits (with its status and stderr tail), at the deadline with
   * ERR_CUSTODY_READY_TIMEOUT, and on abort.
   */
  async wait(timeoutMs: number, signal?: AbortSignal): Promise<void> {
    const launch = this.#launch;
    const deadline = Date.now() + timeoutMs;
    // The target is confirmed now: what came from senders not provable before is judged again, in order.
    for (const { d } of this.#deferred.splice(0)) this.#take(d, false);
    for (;;) {
      if (this.#error) throw this.#error;
      await this.#handOffMainPid();
      if (this.#ready) return;
      const target = launch.target()?.handle;
      // wait() runs after confirm, which sets the target or fails the launch.
      if (!target) throw new Error('custody: notify wait() before the target was confirmed');
      const woken = new Promise<'woken'>((resolve) => (this.#wake = () => resolve('woken')));
      const died = target.gone.then(() => 'died' as const);
      let r: 'woken' | 'died' | typeof TIMED_OUT;
      try {
        r = await within(Promise.race([woken, died]), Math.max(0, deadline - Date.now()), signal);
      } finally {
        this.#wake = null;
      }
      if (r === TIMED_OUT) throw new ReadyTimeoutError(launch.id, timeoutMs, this.#detail());
      if (r !== 'died') continue;
      // A daemon that forks its main process sends MAINPID=, then exits: that datagram may be read in the
      // same turn of the loop as the exit is seen. One more turn, then the exit counts.
      await new Promise((resolve) => setImmediate(resolve));
      if (this.#mainPid || this.#ready || this.#error) continue;
      throw await launch.exitedError(target, signal);
    }
  }

  #detail(): string {
    const parts = [`no READY=1 from the instance on ${this.address}`];
    if (this.#lastStatus !== undefined)
      parts.push(`its last STATUS= was ${JSON.stringify(this.#lastStatus.slice(0, 200))}`);
    if (this.#ignored) parts.push(`${this.#ignored} notification(s) from processes not the instance's were ignored`);
    return parts.join('; ');
  }

  #onWatchdog: ((kind: 'ping' | 'trigger') => void) | undefined;

  /** Where WATCHDOG=1 and WATCHDOG=trigger from the instance's processes go once it runs (src/lifecycle/watchdog.ts). */
  onWatchdog(fn: (kind: 'ping' | 'trigger') => void): void {
    this.#onWatchdog = fn;
  }

  /**
   * Ready: the socket stays while the instance runs, for STATUS= updates (status events) and for barriers
   * (sd_notify_barrier(3): systemd-notify waits on one after its message and fails if nobody is there). It no
   * longer keeps the event loop alive, and closes when the target is gone or `close()` is called.
   */
  keep(): void {
    if (this.#closed) return;
    this.#running = true;
    this.#listener.unref();
    const target = this.#launch.target()?.handle;
    if (target) void target.gone.then(() => this.close());
    else this.close();
  }

  /** Closes the socket and any MAINPID pin not taken. Idempotent; every path of a launch ends here. */
  close(): void {
    if (this.#closed) return;
    this.#closed = true;
    this.#listener.close();
    for (const { d } of this.#deferred.splice(0)) if (d.sender && d.sender !== 'gone') d.sender.close();
    this.#mainPid?.handle.close();
    this.#mainPid = null;
    this.#wake?.();
  }
}
