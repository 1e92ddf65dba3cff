/**
 * One supervisor per state dir, on both backends, and against custody 0.1.
 *
 * What excludes everywhere is a chain of holder records, `.lock.<n>`: each
 * is written complete under a temp name and then linked into place, and
 * link(2) fails when the name exists, so each generation has one winner.
 * The holder is the highest generation. A newcomer takes n+1 only after
 * proving holder n released (its record emptied) or gone (boot id, pid and
 * start ticks), and only then removes the generations below its own: a
 * record that may be a live holder's is never deleted.
 *
 * For 0.1, which knew only `.lock`: on the native backend `.lock` is also
 * flocked, and on both it holds the holder's {pid, startTicks} as 0.1 wrote
 * it, so a 0.1 holder (native: flock and record; js: the record) keeps a new
 * supervisor out, and a new holder keeps a 0.1 one out.
 */
import {
  closeSync,
  constants as fsc,
  ftruncateSync,
  linkSync,
  openSync,
  readSync,
  unlinkSync,
  writeSync,
} from 'node:fs';
import { backend } from '../backend/index.js';
import { StateIOError, StateLockedError, UnsafePathError } from '../errors.js';
import { openRegular, type Opened } from './files.js';
import { processWide } from '../process/processwide.js';
import { errnoCode, LOCK, type StateDir } from './statedir.js';
import { sleep } from '../timing.js';

interface Holder {
  pid: number;
  /** -1 where /proc could not say (then liveness is all the record proves). */
  startTicks: number;
  bootId?: string | null;
  /** The inode of the holder's PID namespace: its pid means nothing in another one. */
  pidNs?: number | null;
}

type Reading = { holder: Holder } | { released: true } | { corrupt: true };

const GENERATION = /^\.lock\.(\d{1,15})$/;
const TEMP = /^\.lock\.tmp\.(\d+)\./;
const MAX_RECORD_BYTES = 512;
/** Rounds of list, judge, link before giving up under contention (each lost round means another opener won). */
const MAX_ROUNDS = 50;

/**
 * State dirs (dev:ino) this process holds: a second supervisor in it is
 * refused like one in another process. Process-wide: a second copy of
 * custody in this process shares our pid, so it would take our record for
 * that of a dead earlier owner of the pid. On the native backend the flock
 * excludes the copies as well; on js this is all that does.
 */
const lockedHere = processWide('lockedStateDirs', () => new Set<string>());
let tmpCounter = 0;

const sleepCell = new Int32Array(new SharedArrayBuffer(4));
const pause = (ms: number) => Atomics.wait(sleepCell, 0, 0, ms);

let own: Holder | undefined;
function ownRecord(): Holder {
  if (own) return own;
  let startTicks = -1;
  let bootId: string | null = null;
  try {
    startTicks = backend.inspect(process.pid).startTicks;
  } catch {
    // no /proc: liveness alone
  }
  try {
    bootId = backend.bootId();
  } catch {
    bootId = null;
  }
  own = { pid: process.pid, startTicks, bootId, pidNs: backend.ownPidNs() };
  return own;
}

function parseRecord(text: string): Reading {
  if (text === '') return { released: true };
  try {
    const v = JSON.parse(text) as Record<string, unknown>;
    const int = (x: unknown, min: number) => typeof x === 'number' && Number.isSafeInteger(x) && x >= min;
    if (!int(v?.pid, 1) || !int(v.startTicks, -1)) return { corrupt: true };
    if (v.bootId !== undefined && v.bootId !== null && typeof v.bootId !== 'string') return { corrupt: true };
    if (v.pidNs !== undefined && v.pidNs !== null && !int(v.pidNs, 0)) return { corrupt: true };
    return { holder: v as unknown as Holder };
  } catch {
    return { corrupt: true };
  }
}

function readRecordFd(fd: number): Reading {
  const buf = Buffer.alloc(MAX_RECORD_BYTES);
  const n = readSync(fd, buf, 0, buf.length, 0);
  return parseRecord(buf.subarray(0, n).toString('utf8'));
}

/** Whether the holder may still run. Only proof of the contrary (a reboot, no such process, another start) says no. */
function holderAlive(h: Holder): boolean {
  const me = ownRecord();
  if (h.bootId && me.bootId && h.bootId !== me.bootId) return false;
  // Its pid names another process here: nothing proves it gone.
  if (h.pidNs != null && me.pidNs !== null && h.pidNs !== me.pidNs) return true;
  // This process (every copy of custody in it) holds nothing it did not record in lockedHere; an earlier owner of our pid is gone.
  if (h.pid === process.pid) return false;
  if (h.startTicks < 0) {
    try {
      process.kill(h.pid, 0);
      return true;
    } catch (err) {
      return errnoCode(err) !== 'ESRCH';
    }
  }
  try {
    const raw = backend.inspect(h.pid);
    return raw.state !== 'Z' && raw.state !== 'X' && raw.startTicks === h.startTicks;
  } catch (err) {
    const code = errnoCode(err);
    return code !== 'ESRCH' && code !== 'ENOENT';
  }
}

/** Whether a record is this very process's: our pid with our start ticks, boot and PID namespace. */
function isOwnRecord(h: Holder): boolean {
  const me = ownRecord();
  return h.pid === me.pid && h.startTicks === me.startTicks && (h.bootId ?? null) === (me.bootId ?? null);
}

function lockedBy(dir: StateDir, h: Holder): StateLockedError {
  const me = ownRecord();
  const elsewhere = h.pidNs != null && me.pidNs !== null && h.pidNs !== me.pidNs;
  return new StateLockedError(dir.path, h.pid, elsewhere ? `in another PID namespace, ${h.pidNs}` : undefined);
}

function unlinkQuiet(path: string): void {
  try {
    unlinkSync(path);
  } catch {
    // gone already: what we wanted
  }
}

/** `.lock`, opened only if it is a regular file (a device is refused unopened: opening one can act on it). */
function openLockFile(dir: StateDir): number {
  let opened: Opened;
  try {
    opened = openRegular(dir.at(LOCK), fsc.O_RDWR | fsc.O_CREAT);
  } catch (err) {
    throw new StateIOError(`cannot open ${dir.show(LOCK)}`, err);
  }
  if ('refused' in opened)
    throw new UnsafePathError(dir.show(LOCK), `${opened.refused}; custody's lock must be a regular file`);
  return opened.fd;
}

function generations(dir: StateDir): number[] {
  return dir
    .names()
    .map((n) => GENERATION.exec(n)?.[1])
    .filter((g): g is string => g !== undefined)
    .map(Number)
    .sort((a, b) => a - b);
}

/** A generation's record; a torn read (a release truncating it) is read again. */
function readGeneration(dir: StateDir, gen: number): Reading | 'vanished' {
  for (let tries = 0; ; tries++) {
    let opened: Opened;
    try {
      opened = openRegular(dir.at(`${LOCK}.${gen}`), fsc.O_RDONLY);
    } catch (err) {
      if (errnoCode(err) === 'ENOENT') return 'vanished';
      throw new StateIOError(`cannot read ${dir.show(`${LOCK}.${gen}`)}`, err);
    }
    if ('refused' in opened) return { corrupt: true };
    let r: Reading;
    try {
      r = readRecordFd(opened.fd);
    } finally {
      closeSync(opened.fd);
    }
    if (!('corrupt' in r) || tries >= 3) return r;
    pause(2);
  }
}

/** Takes the next generation or throws StateLockedError naming the live holder. Returns the fd of our record. */
function takeGeneration(dir: StateDir): number {
  const text = `${JSON.stringify(ownRecord())}\n`;
  for (let round = 0; round < MAX_ROUNDS; round++) {
    const gens = generations(dir);
    const top = gens.at(-1) ?? 0;
    if (top > 0) {
      const r = readGeneration(dir, top);
      if (r === 'vanished') continue;
      if ('corrupt' in r) {
        throw new StateLockedError(
          dir.path,
          null,
          `its holder record ${dir.show(`${LOCK}.${top}`)} is unreadable; remove it if no supervisor uses this dir`,
        );
      }
      if ('holder' in r && holderAlive(r.holder)) throw lockedBy(dir, r.holder);
    }
    const next = top + 1;
    const tmp = dir.at(`${LOCK}.tmp.${process.pid}.${++tmpCounter}`);
    let fd: number;
    try {
      fd = openSync(tmp, fsc.O_RDWR | fsc.O_CREAT | fsc.O_EXCL | fsc.O_NOFOLLOW, 0o600);
    } catch (err) {
      throw new StateIOError(`cannot write a lock record in ${dir.path}`, err);
    }
    let won = false;
    try {
      writeSync(fd, text, 0);
      linkSync(tmp, dir.at(`${LOCK}.${next}`));
      won = true;
    } catch (err) {
      if (errnoCode(err) !== 'EEXIST') {
        closeSync(fd);
        throw new StateIOError(`cannot write a lock record in ${dir.path}`, err);
      }
    } finally {
      unlinkQuiet(tmp);
    }
    if (!won) {
      // Another opener took `next` first: judge its record in the next round.
      closeSync(fd);
      continue;
    }
    // A name below the top that a newer holder had already removed: ours is not the top, so it is nobody's.
    if (generations(dir).some((g) => g > next)) {
      unlinkQuiet(dir.at(`${LOCK}.${next}`));
      closeSync(fd);
      continue;
    }
    for (const g of gens) unlinkQuiet(dir.at(`${LOCK}.${g}`));
    removeDeadTemps(dir);
    return fd;
  }
  throw new StateLockedError(dir.path, null, `${MAX_ROUNDS} rounds lost to other openers`);
}

/** Temp records of processes that died between write and link. */
function removeDeadTemps(dir: StateDir): void {
  for (const name of dir.names()) {
    const pid = Number(TEMP.exec(name)?.[1] ?? 0);
    if (!pid || pid === process.pid) continue;
    try {
      process.kill(pid, 0);
    } catch (err) {
      if (errnoCode(err) === 'ESRCH') unlinkQuiet(dir.at(name));
    }
  }
}

export class StateLock {
  #lockFd: number;
  #genFd: number;
  #key: string;
  #held = true;

  private constructor(lockFd: number, genFd: number, key: string) {
    this.#lockFd = lockFd;
    this.#genFd = genFd;
    this.#key = key;
  }

  /** Takes the dir's lock or throws StateLockedError naming the holder. */
  static async acquire(dir: StateDir): Promise<StateLock> {
    const key = `${dir.dev}:${dir.ino}`;
    if (lockedHere.has(key)) throw new StateLockedError(dir.path, process.pid, 'this process');
    // Claimed before anything can wait: a second open in this process meanwhile is refused, not let in behind.
    lockedHere.add(key);
    let lockFd = -1;
    let genFd = -1;
    try {
      lockFd = openLockFile(dir);
      const legacy = readRecordFd(lockFd);
      if ('holder' in legacy && holderAlive(legacy.holder)) throw lockedBy(dir, legacy.holder);
      genFd = takeGeneration(dir);
      if (tryFlock(dir, lockFd) === false) await flockInherited(dir, lockFd);
      ftruncateSync(lockFd, 0);
      writeSync(lockFd, `${JSON.stringify(ownRecord())}\n`, 0);
    } catch (err) {
      lockedHere.delete(key);
      if (genFd >= 0) {
        empty(genFd);
        closeSync(genFd);
      }
      if (lockFd >= 0) closeSync(lockFd);
      throw err;
    }
    return new StateLock(lockFd, genFd, key);
  }

  /** Empties both records (ours: anyone may take over) and closes the fds, which drops the flock. */
  release(): void {
    if (!this.#held) return;
    this.#held = false;
    lockedHere.delete(this.#key);
    let failure: unknown;
    for (const fd of [this.#lockFd, this.#genFd]) {
      try {
        empty(fd);
      } catch (err) {
        failure ??= err;
      }
      closeSync(fd);
    }
    // Until this process exits, a record it could not empty still names it as the holder.
    if (failure) throw new StateIOError('cannot empty the lock record', failure);
  }
}

/**
 * How long a newcomer waits for a flock that no live holder has: a fork of
 * the holder, cut off before its exec, shares or copies the holder's fds (the
 * lock's among them) until it closes them. As long as recovery waits for
 * such a fork to exec.
 */
const INHERITED_FLOCK_WAIT_MS = 3000;

/**
 * The flock on .lock is held, though every holder record says its holder
 * is gone: by a process that inherited a holder's fd (its fork before the
 * exec), or by a 0.1 holder between its flock and its record. Waited for,
 * bounded: taken once released; refused the moment a live holder is recorded.
 * The wait is on timers, so the embedding process goes on meanwhile.
 */
async function flockInherited(dir: StateDir, lockFd: number): Promise<void> {
  const deadline = Date.now() + INHERITED_FLOCK_WAIT_MS;
  let ms = 2;
  for (;;) {
    const r = readRecordFd(lockFd);
    if ('holder' in r && holderAlive(r.holder)) throw lockedBy(dir, r.holder);
    // Another copy of custody in this process holds it (holderAlive takes our own pid for an earlier owner's).
    if ('holder' in r && isOwnRecord(r.holder)) throw new StateLockedError(dir.path, process.pid, 'this process');
    if (Date.now() >= deadline) {
      const was = 'holder' in r ? `pid ${r.holder.pid}, which is gone` : 'no live holder';
      throw new StateLockedError(
        dir.path,
        null,
        `a process holds the flock on .lock that it inherited from ${was}: a fork that has not exec'd, or a process passed the fd`,
      );
    }
    await sleep(ms);
    ms = Math.min(ms * 2, 50);
    if (tryFlock(dir, lockFd) !== false) return;
  }
}

/** flock(LOCK_EX | LOCK_NB) on .lock: false while another open file holds it; 'unsupported' on the js backend. */
function tryFlock(dir: StateDir, lockFd: number): boolean | 'unsupported' {
  try {
    return backend.tryLock(lockFd);
  } catch (err) {
    throw new StateIOError(`cannot lock ${dir.show(LOCK)}`, err);
  }
}

/** Truncation to nothing needs no free block: an empty record is a released lock, even on a full disk. */
function empty(fd: number): void {
  ftruncateSync(fd, 0);
}
