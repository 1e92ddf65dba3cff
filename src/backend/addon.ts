/**
 * The addon's shape (native/*.cc) and its loader. Loading never throws: a
 * missing or broken addon yields the reason, and the js backend takes over.
 */
import { createRequire } from 'node:module';
import { fileURLToPath } from 'node:url';
import type { StatFields } from '../proc.js';

/** [state, ppid, startTicks, uid, exeDev, exeIno, pidfsId, pidfd, session, ...argv]; -1 for no exe / no kept pidfd. */
export type AddonInspect = [string, number, number, number, number, number, string | null, number, number, ...string[]];

export interface NativeAddon {
  close(fd: number): void;
  flock(fd: number, operation: number): void;
  pipe(): [number, number];
  setChildSubreaper(on: boolean): void;
  getChildSubreaper(): boolean;
  probe(): { release?: string; pidfdOpen: string; pidfdSendSignal: string; waitidPidfd: string; closeRange: string };
  pidfdOpen(pid: number, flags?: number): number;
  pidfdSendSignal(fd: number, signo: number): void;
  waitid(fd: number, options: number): { pid: number; code: number; status: number } | null;
  pidfdGetExitInfo(fd: number): number | null;
  pidfsId(fd: number): string | null;
  watch(fd: number, callback: (error: string | null) => void): number;
  unwatch(id: number): void;
  watchRef(id: number, ref: boolean): void;
  parseStat(text: string): StatFields | null;
  inspect(pid: number, procRoot?: string, keepPidfd?: boolean): AddonInspect;
  readBootId(path?: string): string;
  /** The addon's lossless decoding of bytes (native/proc.cc), for tests that compare it with src/bytes.ts. */
  decodeBytes(bytes: Buffer): string;
  /** Per process: pid, ppid, pgrp, session, ownerUid, startTicks, state, argc, ...argv. */
  listProcesses(procRoot?: string): Promise<Array<string | number>>;
  spawn(
    file: string,
    argv: Array<string | Buffer>,
    envp: string[] | null,
    options: { cwd?: string; stdio: [number, number, number]; newSession: boolean; newGroup: boolean; copyFdTable?: boolean },
  ): { pid: number; pidfd: number };
  constants: {
    LOCK_EX: number;
    LOCK_SH: number;
    LOCK_UN: number;
    LOCK_NB: number;
    WEXITED: number;
    WNOHANG: number;
    WNOWAIT: number;
  };
  unsupported?: string;
}

/** The package root: this file sits in src/backend or dist/backend. */
export const packageRoot = fileURLToPath(new URL('../..', import.meta.url));

export function loadAddon(): { addon: NativeAddon } | { error: string } {
  if (process.env.CUSTODY_ADDON_PATH === '') return { error: 'CUSTODY_ADDON_PATH is empty (addon disabled)' };
  try {
    const require = createRequire(import.meta.url);
    const addon = (process.env.CUSTODY_ADDON_PATH
      ? require(process.env.CUSTODY_ADDON_PATH)
      : require('node-gyp-build')(packageRoot)) as NativeAddon;
    if (addon.unsupported) return { error: addon.unsupported };
    return { addon };
  } catch (err) {
    const message = err instanceof Error ? err.message.split('\n')[0] : String(err);
    return { error: `the native addon did not load: ${message}` };
  }
}
