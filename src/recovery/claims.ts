/**
 * What recovery asks a process to show before it counts as an instance's:
 * the claims the launch judged by (src/lifecycle/launch.ts claimOf), rebuilt
 * from the manifest.
 */
import { statSync } from 'node:fs';
import { fsPath } from '../bytes.js';
import { resolveExecutable } from '../process/handle.js';
import type { Claim, DevIno } from '../process/ownership.js';
import type { Manifest } from '../state/manifest.js';

export function fileId(path: string | null, env: NodeJS.ProcessEnv = process.env): DevIno | null {
  if (!path) return null;
  try {
    const st = statSync(fsPath(path.includes('/') ? path : resolveExecutable(path, env)));
    return { dev: st.dev, ino: st.ino };
  } catch {
    return null;
  }
}

/** What the manifest's target must show: as the launch judged it (src/lifecycle/launch.ts claimOf). */
export function targetClaim(m: Manifest): Claim {
  const exe = fileId(m.executable);
  return {
    token: m.token,
    expect: m.expect,
    program: exe ? { exe } : m.pidSource === 'child' ? { argv: [m.command, ...m.args] } : null,
    launcherExe: m.pidSource === 'child' ? null : fileId(m.command),
    uid: m.uid ?? null,
    runAsUid: m.runAs?.uid ?? null,
    tokenMode: m.tokenMode ?? 'argv',
  };
}

/** The launcher custody spawned (or its fork before exec): exactly the recorded argv. */
export function launcherClaim(m: Manifest): Claim {
  const tokenMode = m.tokenMode ?? 'argv';
  const program = { argv: [m.command, ...m.args] };
  const uids = { uid: m.uid ?? null, runAsUid: m.runAs?.uid ?? null };
  return { token: m.token, expect: [], program, launcherExe: null, ...uids, tokenMode };
}

/**
 * What the process a manifest recorded must show now: the recorded
 * executable, not the launch's argv (a repaired argv is re-proved by the
 * token and the declared paths), and, where it has one, its cgroup.
 */
export function recordedClaim(m: Manifest, cgroup: Claim['cgroup']): Claim {
  const exe = fileId(m.executable);
  return { ...targetClaim(m), program: exe ? { exe } : null, launcherExe: null, cgroup };
}
