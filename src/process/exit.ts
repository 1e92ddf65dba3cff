import type { ExitStatus } from '../types.js';

/** For messages: "signal SIGTERM", "code 3", or "status unknown" (a non-child the kernel has no status for). */
export function describeExit(s: ExitStatus): string {
  return s.signal ? `signal ${s.signal}` : s.code !== null ? `code ${s.code}` : 'status unknown';
}
