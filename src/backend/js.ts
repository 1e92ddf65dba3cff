/**
 * The pure-JS backend: child_process for children, process.kill for
 * signals, fs reads of /proc for identities. It is the fallback where the
 * addon cannot load and the baseline every benchmark compares against.
 *
 * What it cannot promise: between the start-time check and process.kill a
 * pid can be reused (a window of microseconds), and inspect() re-reads the
 * start time to detect, not prevent, a mixed identity. capabilities() says so.
 *
 * This file is the Backend itself: inspection and the /proc scans. Its
 * /proc readers (js-proc.ts), exit poller and pins (js-exits.ts) and spawn
 * path (js-spawn.ts) each have a module of their own.
 */
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { encodeArg, splitCmdlineBytes } from '../bytes.js';
import { errnoError, NotAProcessError, UnsupportedError } from '../errors.js';
import { parseLayout, parseStat, parseStatusField, parseStatusUid } from '../process/proc.js';
import type { Capabilities } from '../types.js';
import { JsPidRef } from './js-exits.js';
import {
  esrch,
  isDead,
  liveThread,
  readExe,
  readPidNs,
  readProc,
  readProcString,
  readStat,
  vanished,
} from './js-proc.js';
import { checkJsExec } from './js-exec.js';
import { inheritableFds, PLACE_SHELL, shellUsable, spawnChild } from './js-spawn.js';
import { assertOwnProc, ProcReads, readProcBytes, readProcText } from './procview.js';
import type {
  Backend,
  ExecAttrs,
  NotifyListener,
  PidRef,
  ProcEntry,
  RawIdentity,
  SpawnedChild,
  SpawnRequest,
} from './types.js';

/** How often a read is repeated while an exec keeps moving under it (as native/identity.cc does). */
const EXEC_RETRIES = 8;

export class JsBackend extends ProcReads implements Backend {
  readonly name = 'js' as const;
  readonly cgroupPlacement: 'exec-wrapper' | null;
  readonly cgroupPlacementReason?: string;
  #caps: Capabilities;
  #bootId: string | undefined;
  /** The inheritable fds this process was started with, read at the first spawn (see inheritableFds). */
  #inherited: number[] | undefined;
  readonly #inheritedFds = () => (this.#inherited ??= inheritableFds());

  constructor(caps: Capabilities) {
    super();
    this.#caps = caps;
    this.cgroupPlacement = shellUsable() ? 'exec-wrapper' : null;
    if (!this.cgroupPlacement)
      this.cgroupPlacementReason = `the js backend places children through ${PLACE_SHELL}, which is not executable here`;
  }

  capabilities(): Capabilities {
    return this.#caps;
  }

  inspect(pid: number, procRoot = '/proc'): RawIdentity {
    assertOwnProc(procRoot);
    const dir = `${procRoot}/${pid}`;
    // Exec is a seam: cmdline and exe change together in the kernel, but a
    // reader can land between them. stat, cmdline, exe, status, cmdline
    // again, stat again; repeat while the cmdline or comm moved. Paths,
    // unlike the addon's dir fd, can cross a pid reuse: the start ticks of
    // both stats must agree (detection, not prevention: capabilities() says so).
    for (let attempt = 0; attempt < EXEC_RETRIES; attempt++) {
      const stat = readStat(`${dir}/stat`, pid);
      let state = stat.state;
      let src = dir;
      if (isDead(stat.state)) {
        const t = liveThread(dir, pid);
        if (t) [src, state] = [t.dir, t.state];
      }
      const cmdline = readProc(`${src}/cmdline`, pid);
      const exe = readExe(src);
      const status = readProcString(`${dir}/status`, pid);
      const tgid = parseStatusField(status, 'Tgid');
      if (tgid !== pid) throw new NotAProcessError(pid, tgid);
      const processPidNs = readPidNs(src, status);
      const again = readProc(`${src}/cmdline`, pid);
      const stat2 = readStat(`${dir}/stat`, pid);
      if (stat2.startTicks !== stat.startTicks) throw esrch(pid, 'read');
      if (!again.equals(cmdline) || stat2.comm !== stat.comm || isDead(stat2.state) !== isDead(stat.state)) continue;
      return {
        state,
        ppid: stat.ppid,
        session: stat.session,
        startTicks: stat.startTicks,
        argv: splitCmdlineBytes(cmdline),
        uid: parseStatusUid(status),
        exe,
        pidfsId: null,
        processPidNs,
      };
    }
    throw errnoError('EAGAIN', 'read', undefined, `pid ${pid} kept exec'ing during ${EXEC_RETRIES} reads`);
  }

  spawnedHere(): boolean {
    // child_process owns (and reaps) every child this backend spawns.
    return true;
  }

  reapZombie(): boolean {
    return false;
  }

  pidfsIdOf(): null {
    return null;
  }

  childSubreaper(): null {
    return null;
  }

  setChildSubreaper(): boolean {
    return false;
  }

  inspectPinned(pid: number): { raw: RawIdentity; ref: PidRef } {
    const raw = this.inspect(pid);
    return { raw, ref: new JsPidRef(pid, raw.startTicks) };
  }

  probeCloneIntoCgroup(): null {
    return null;
  }

  bootId(): string {
    this.#bootId ??= readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
    return this.#bootId;
  }

  async matchArgv(argv: readonly string[], procRoot = '/proc'): Promise<number[]> {
    assertOwnProc(procRoot);
    const want = Buffer.concat(argv.flatMap((a) => [encodeArg(a), Buffer.of(0)]));
    const out: number[] = [];
    for (const name of readdirSync(procRoot)) {
      if (name.charCodeAt(0) < 49 || name.charCodeAt(0) > 57) continue;
      try {
        let raw = readProcBytes(`${procRoot}/${name}/cmdline`);
        if (raw.length === 0) {
          const st = parseStat(readProcText(`${procRoot}/${name}/stat`));
          const t = st && isDead(st.state) ? liveThread(`${procRoot}/${name}`, st.pid) : null;
          if (t) raw = readProcBytes(`${t.dir}/cmdline`);
        }
        if (raw.length && raw[raw.length - 1] !== 0) raw = Buffer.concat([raw, Buffer.of(0)]);
        if (raw.equals(want)) out.push(Number(name));
      } catch (err) {
        if (!vanished(err)) throw err;
      }
    }
    return out;
  }

  async listProcesses(procRoot = '/proc', images?: readonly string[]): Promise<ProcEntry[]> {
    assertOwnProc(procRoot);
    const wanted = images ? new Set(images) : null;
    const out: ProcEntry[] = [];
    for (const name of readdirSync(procRoot)) {
      if (name.charCodeAt(0) < 49 || name.charCodeAt(0) > 57) continue;
      const dir = `${procRoot}/${name}`;
      // A process that vanished mid-scan is skipped; any other failure
      // (EMFILE, ENOMEM) is thrown: skipping would report a live process as absent.
      try {
        const text = readProcText(`${dir}/stat`);
        const stat = parseStat(text);
        if (!stat) continue;
        const layout = wanted ? parseLayout(text) : null;
        let state = stat.state;
        let src = dir;
        if (isDead(state)) {
          const t = liveThread(dir, stat.pid);
          if (t) [src, state] = [t.dir, t.state];
        }
        const argv = splitCmdlineBytes(readProcBytes(`${src}/cmdline`));
        // The directory's owner, as the native scan reads it: a hint only.
        const uid = statSync(dir).uid;
        const row: ProcEntry = {
          pid: stat.pid,
          ppid: stat.ppid,
          pgrp: stat.pgrp,
          session: stat.session,
          uid,
          state,
          startTicks: stat.startTicks,
          argv,
        };
        if (layout?.image && wanted?.has(layout.image)) row.image = layout.image;
        if (layout?.kernelThread) row.kernelThread = true;
        out.push(row);
      } catch (err) {
        if (!vanished(err)) throw err;
      }
    }
    return out;
  }

  openNotify(): NotifyListener {
    // Node has no unix datagram sockets, nor a way to receive SCM_CREDENTIALS.
    throw new UnsupportedError(
      "ready: 'notify' needs the native backend: receiving sd_notify datagrams with their senders' credentials " +
        `takes a unix datagram socket with SO_PASSCRED, which Node cannot open (${this.#caps.reason ?? 'js backend'})`,
    );
  }

  tryLock(): 'unsupported' {
    return 'unsupported';
  }

  spawn(req: SpawnRequest): SpawnedChild {
    return spawnChild(req, this.#inheritedFds);
  }

  checkExec(exec: ExecAttrs, cgroup: boolean): void {
    checkJsExec(exec, cgroup);
  }
}
