/**
 * The addon's shape (native/*.cc) and its loader. Loading never throws: a
 * missing or broken addon yields the reason, and the js backend takes over.
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import * as path from 'node:path';
import { fileURLToPath } from 'node:url';
import type { StatFields } from '../process/proc.js';
import type { FileRead } from './types.js';

/**
 * [state, ppid, startTicks, uid, exeDev, exeIno, pidfsId, pidfd, session, pidNs, ...argv]; -1 for no exe / no
 * kept pidfd; pidNs is the inode of the namespace the process lives in, 0 for the /proc's own, -1 unknown.
 */
export type AddonInspect = [
  string,
  number,
  number,
  number,
  number,
  number,
  string | null,
  number,
  number,
  number,
  ...string[],
];

export interface NativeAddon {
  close(fd: number): void;
  flock(fd: number, operation: number): void;
  pipe(): [number, number];
  setChildSubreaper(on: boolean): void;
  getChildSubreaper(): boolean;
  probe(): { release?: string; pidfdOpen: string; pidfdSendSignal: string; waitidPidfd: string };
  pidfdOpen(pid: number, flags?: number): number;
  pidfdSendSignal(fd: number, signo: number): void;
  waitid(fd: number, options: number): { pid: number; code: number; status: number } | null;
  pidfdGetExitInfo(fd: number): number | null;
  pidfsId(fd: number): string | null;
  /**
   * Sets the environment's one exit dispatcher and returns the Int32Array it reads: after each batch,
   * dispatch(count) with count [id, code, status] triples at the array's start. code: the si_code of a
   * reaping watch's reaped child, 0 for nothing reaped, -errno when its waitid failed.
   */
  watchDispatch(dispatch: (count: number) => void): Int32Array;
  /** Watches a pidfd's exit, reported once to the dispatcher; `reap` reaps the child as it is reported. */
  watch(fd: number, reap: boolean): number;
  unwatch(id: number): void;
  watchRef(id: number, ref: boolean): void;
  parseStat(text: string): StatFields | null;
  inspect(pid: number, procRoot?: string, keepPidfd?: boolean): AddonInspect;
  /** inspect(pid, '/proc', true) of each pid on the threadpool: its array (pidfd handed over) or its errno Error. */
  inspectPinnedMany(pids: number[]): Promise<Array<AddonInspect | Error>>;
  /** <name>/<leaf> under dirFd for each name, on the threadpool: its bytes, its errno Error, what is there instead, or null (unread: the batch's 32 MiB were spent). */
  readFilesAt(dirFd: number, names: string[], leaf: string, maxBytes: number): Promise<Array<FileRead | null>>;
  readBootId(path?: string): string;
  /** The addon's lossless decoding of bytes (native/bytes.cc), for tests that compare it with src/bytes.ts. */
  decodeBytes(bytes: Buffer): string;
  /** The pids whose cmdline is exactly argv (bytes compared in the addon's worker). */
  /** The pids whose cmdline is argv; with shards, only those whose pid % shards is shard. */
  matchArgv(procRoot: string | undefined, argv: readonly string[], shard?: number, shards?: number): Promise<number[]>;
  /**
   * Per process: pid, ppid, pgrp, session, ownerUid, startTicks, state, argc, ...argv; with images (even
   * none), two more slots before argc: the index of the image the process's layout equals (or -1), and its
   * flags (field 9 of stat).
   */
  listProcesses(procRoot?: string, images?: readonly string[]): Promise<Array<string | number>>;
  /** [pid, session, ...] of every process, read on the threadpool. */
  listSessions(procRoot: string): Promise<Int32Array>;
  /**
   * pid * constants.SPAWN_PID_SCALE + pidfd (one number: an array costs three calls into the engine per
   * spawn; spawnedChild() takes it apart). stdio fds become 0..2 (-1: the addon's /dev/null); flags are
   * constants.SPAWN_*; cgroupProcs is an fd on a cgroup's cgroup.procs (O_WRONLY) the child writes itself
   * into before anything else, or -1. exec: the exec attributes (native-spawn.ts execArray), or null.
   */
  spawn(
    file: string,
    argv: Array<string | Buffer>,
    envp: string[] | null,
    cwd: string | null,
    stdin: number,
    stdout: number,
    stderr: number,
    flags: number,
    cgroupProcs: number,
    exec?: number[] | null,
  ): number;
  /** '' where clone3 knows CLONE_INTO_CGROUP, else the errno name it answered. */
  probeCloneIntoCgroup(): string;
  /**
   * sd_notify's socket (native/notify.cc), bound to an abstract name; one call per datagram:
   * [data, truncated, controlTruncated, fds, pid, uid, pidfd (null: none came; negative: -errno)].
   */
  notifyOpen(
    name: string,
    callback: (
      error: NodeJS.ErrnoException | null,
      datagram: [Buffer, boolean, boolean, number, number, number, number | null] | null,
    ) => void,
  ): { id: number; passPidfd: boolean };
  notifyClose(id: number): void;
  notifyUnref(id: number): void;
  /** '' when SO_PASSPIDFD works here (Linux 6.5), else its errno name. */
  notifyProbe(): string;
  constants: {
    LOCK_EX: number;
    LOCK_NB: number;
    WEXITED: number;
    WNOHANG: number;
    WNOWAIT: number;
    SPAWN_NEW_SESSION: number;
    SPAWN_NEW_GROUP: number;
    SPAWN_COPY_FD_TABLE: number;
    SPAWN_PID_SCALE: number;
    EXEC_UMASK: number;
    EXEC_OOM_SCORE_ADJ: number;
    EXEC_NO_NEW_PRIVS: number;
    EXEC_RUN_AS: number;
    RLIMIT_CPU: number;
    RLIMIT_FSIZE: number;
    RLIMIT_STACK: number;
    RLIMIT_CORE: number;
    RLIMIT_NPROC: number;
    RLIMIT_NOFILE: number;
    RLIMIT_MEMLOCK: number;
    RLIMIT_AS: number;
  };
  unsupported?: string;
}

/** The pid and pidfd of addon.spawn()'s number: pid * SPAWN_PID_SCALE + pidfd, both exact below 2^53. */
export function spawnedChild(addon: NativeAddon, packed: number): { pid: number; pidfd: number } {
  const scale = addon.constants.SPAWN_PID_SCALE;
  return { pid: Math.floor(packed / scale), pidfd: packed % scale };
}

/** The package root: this file sits in src/backend or dist/backend. */
export const packageRoot = fileURLToPath(new URL('../..', import.meta.url));

/** The one fix for every missing or broken addon: build it here (scripts/install.cjs runs node-gyp when no prebuild loads). */
const FIX = 'Fix: install a C++ toolchain (g++, make, python3), then run `npm rebuild custody`';

/** Written by scripts/install.cjs when its source build failed: why, in one line. */
const INSTALL_ERROR_FILE = path.join('build', 'custody-install-error.txt');

const firstLine = (err: unknown): string =>
  (err instanceof Error ? err.message : String(err)).split('\n')[0]?.trim() ?? '';

/**
 * Why node-gyp-build found nothing to load: which prebuild it looked for, which
 * ones the package holds, and what became of the install-time source build.
 */
function notFound(): string {
  // The names node-gyp-build matches on: prebuilds/<platform>-<arch>/<name>.<libc>.node (musl on Alpine).
  const libc = process.env.LIBC || (existsSync('/etc/alpine-release') ? 'musl' : 'glibc');
  const target = `${process.platform}-${process.arch}-${libc}`;
  const runtime = `node ${process.versions.node}, abi ${process.versions.modules}, napi ${process.versions.napi}`;
  const dir = path.join(packageRoot, 'prebuilds');
  const shipped = existsSync(dir)
    ? readdirSync(dir).flatMap((d) => {
        try {
          return readdirSync(path.join(dir, d))
            .filter((f) => f.endsWith('.node'))
            .map((f) => `${d}/${f}`);
        } catch {
          return [];
        }
      })
    : [];
  const has = shipped.length ? `the package has ${shipped.join(', ')}` : 'the package has none';
  const build =
    installFailure() ??
    'no source build in build/Release (none was made at install time: no compiler was available, ' +
      'or install scripts did not run)';
  return `no native addon for ${target} (${runtime}): no prebuild for it in prebuilds/ (${has}), and ${build}. ${FIX}`;
}

/** What scripts/install.cjs recorded when its source build failed, if it did. */
function installFailure(): string | null {
  try {
    const why = readFileSync(path.join(packageRoot, INSTALL_ERROR_FILE), 'utf8').trim();
    return `the install-time source build failed (${why})`;
  } catch {
    return null;
  }
}

export function loadAddon(): { addon: NativeAddon } | { error: string } {
  const override = process.env.CUSTODY_ADDON_PATH;
  if (override === '') return { error: 'CUSTODY_ADDON_PATH is empty (addon disabled)' };
  const require = createRequire(import.meta.url);
  let file: string;
  if (override) {
    file = override;
  } else {
    try {
      file = (require('node-gyp-build') as { path(dir: string): string }).path(packageRoot);
    } catch {
      return { error: notFound() };
    }
  }
  let addon: NativeAddon;
  try {
    addon = require(file) as NativeAddon;
  } catch (err) {
    const from = override ? `CUSTODY_ADDON_PATH=${override}` : path.relative(packageRoot, file);
    const error = `the native addon did not load from ${from}: ${firstLine(err)}`;
    if (override) return { error };
    const build = installFailure();
    return { error: `${error}${build ? `, and ${build}` : ''}. ${FIX}` };
  }
  if (addon.unsupported) return { error: addon.unsupported };
  return { addon };
}
