/**
 * Chooses the backend once, at load. CUSTODY_BACKEND=native|js forces one;
 * otherwise native where the addon loads and the kernel has pidfds, js
 * elsewhere, with the reason kept for capabilities().
 */
import { existsSync } from 'node:fs';
import { release as osRelease } from 'node:os';
import { InvalidArgError, UnsupportedError } from '../errors.js';
import type { Capabilities } from '../types.js';
import { loadAddon, type NativeAddon } from './addon.js';
import { probeCgroup } from './cgroupv2.js';
import { JS_EXEC_SUPPORT } from './js-exec.js';
import { JsBackend } from './js.js';
import { NativeBackend } from './native.js';
import { type Backend, RLIMIT_NAMES } from './types.js';

function kernelAtLeast(release: string | null, major: number, minor: number): boolean {
  const m = release ? /^(\d+)\.(\d+)/.exec(release) : null;
  if (!m) return false;
  const [maj, min] = [Number(m[1]), Number(m[2])];
  return maj > major || (maj === major && min >= minor);
}

function baseCaps(): Omit<Capabilities, 'backend' | 'probe' | 'exec'> {
  return {
    platform: process.platform,
    kernel: null,
    proc: process.platform === 'linux' && existsSync('/proc/self/stat'),
    pidfd: false,
    pidfsId: false,
    exitInfoOfNonChildren: false,
    raceFreeSignals: false,
    raceFreeIdentity: false,
    spawnWithPidfd: false,
    notify: false,
    notifyPidfd: false,
    coreDump: false,
  };
}

/** Probes the kernel through the addon; returns why native cannot serve, or its capabilities. */
function nativeCaps(addon: NativeAddon): Capabilities | { error: string } {
  const probe = addon.probe();
  for (const call of ['pidfdOpen', 'pidfdSendSignal', 'waitidPidfd'] as const) {
    if (probe[call]) return { error: `${call} unavailable on this kernel (${probe[call]}); pidfds need Linux >= 5.4` };
  }
  const release = probe.release ?? null;
  let pidfsId = false;
  let exitInfo = false;
  const self = addon.pidfdOpen(process.pid);
  try {
    pidfsId = addon.pidfsId(self) !== null;
    try {
      addon.pidfdGetExitInfo(self);
      // PIDFD_GET_INFO exists since 6.13, its exit field since 6.15.
      exitInfo = kernelAtLeast(release, 6, 15);
    } catch {
      exitInfo = false;
    }
  } finally {
    addon.close(self);
  }
  const { release: _r, ...calls } = probe;
  const soPassPidfd = addon.notifyProbe();
  return {
    ...baseCaps(),
    backend: 'native',
    kernel: release,
    pidfd: true,
    pidfsId,
    exitInfoOfNonChildren: exitInfo,
    raceFreeSignals: true,
    raceFreeIdentity: true,
    spawnWithPidfd: true,
    notify: true,
    notifyPidfd: soPassPidfd === '',
    coreDump: true,
    exec: { runAs: true, umask: true, oomScoreAdj: true, noNewPrivileges: true, rlimits: [...RLIMIT_NAMES] },
    probe: { ...calls, soPassPidfd },
  };
}

function jsCaps(reason: string): Capabilities {
  const exec = { ...JS_EXEC_SUPPORT, rlimits: [...JS_EXEC_SUPPORT.rlimits] };
  return { ...baseCaps(), backend: 'js', reason, kernel: osRelease(), probe: {}, exec };
}

export function selectBackend(env: NodeJS.ProcessEnv = process.env): Backend {
  const forced = env.CUSTODY_BACKEND;
  if (forced !== undefined && forced !== '' && forced !== 'native' && forced !== 'js') {
    throw new InvalidArgError(`CUSTODY_BACKEND must be "native" or "js", got ${JSON.stringify(forced)}`);
  }
  if (forced === 'js') return new JsBackend(jsCaps('CUSTODY_BACKEND=js forces the pure-JS backend'));
  let reason: string;
  if (process.platform !== 'linux') {
    reason = `${process.platform} has no pidfds or /proc; identities and signals are best effort`;
  } else {
    const loaded = loadAddon();
    if ('addon' in loaded) {
      const caps = nativeCaps(loaded.addon);
      if (!('error' in caps)) return new NativeBackend(loaded.addon, caps);
      reason = caps.error;
    } else {
      reason = loaded.error;
    }
  }
  if (forced === 'native') throw new UnsupportedError(`CUSTODY_BACKEND=native, but ${reason}`);
  return new JsBackend(jsCaps(reason));
}

export const backend: Backend = selectBackend();

let cgroupCaps: Pick<Capabilities, 'cgroup' | 'cgroupReason'> | undefined;

/** cgroup v2 on this host, probed once: where it is mounted, what the kernel offers, how this backend places children. */
export function cgroupCapabilities(): Pick<Capabilities, 'cgroup' | 'cgroupReason'> {
  if (!cgroupCaps) {
    const r = probeCgroup({
      platform: process.platform,
      mountinfo: () => backend.mountinfo(),
      ownCgroup: () => backend.cgroupOf(process.pid),
      cloneIntoCgroup: backend.probeCloneIntoCgroup(),
      placement: backend.cgroupPlacement,
      kernelAtLeast: (major, minor) => kernelAtLeast(osRelease(), major, minor),
    });
    cgroupCaps = r.cgroup ? { cgroup: r.cgroup } : { cgroup: null, cgroupReason: r.reason };
  }
  return cgroupCaps;
}

/** Which backend is in use, why, and which guarantees hold on this machine (cgroup v2 included). */
export function capabilities(): Capabilities {
  return { ...backend.capabilities(), ...cgroupCapabilities() };
}
