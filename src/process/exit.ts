import type { ExitResult, ExitStatus } from '../types.js';

/**
 * Why a process ended, as systemd's Result= says it. An end by SIGKILL (or one whose status is unknown) in an
 * instance cgroup that counted an OOM kill is `oom-kill`; stop() says `stopped` itself.
 */
export function resultOf(s: ExitStatus, oomKills = 0): ExitResult {
  if (oomKills > 0 && (s.signal === 'SIGKILL' || (s.signal === null && s.code === null))) return 'oom-kill';
  if (s.code === 0) return 'success';
  if (s.code !== null) return 'exit-code';
  if (s.signal === null) return 'unknown';
  return s.coreDumped ? 'core-dump' : 'signal';
}

/** For messages: "signal SIGTERM", "code 3", or "status unknown" (a non-child the kernel has no status for). */
export function describeExit(s: ExitStatus): string {
  return s.signal ? `signal ${s.signal}` : s.code !== null ? `code ${s.code}` : 'status unknown';
}
