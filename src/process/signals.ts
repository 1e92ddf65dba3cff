import { constants } from 'node:os';
import { InvalidArgError } from '../errors.js';
import type { ExitStatus } from '../types.js';

const byNumber = new Map<number, NodeJS.Signals>();
for (const [name, num] of Object.entries(constants.signals)) {
  if (!byNumber.has(num)) byNumber.set(num, name as NodeJS.Signals);
}

/** 'SIGTERM' or 15 -> 15; 0 is the existence probe. Unknown names are ERR_CUSTODY_INVALID_ARG. */
export function signalNumber(sig: NodeJS.Signals | number): number {
  if (typeof sig === 'number') {
    if (sig === 0 || byNumber.has(sig)) return sig;
  } else if (typeof sig === 'string') {
    const n = (constants.signals as Record<string, number>)[sig];
    if (n !== undefined) return n;
  }
  throw new InvalidArgError(`unknown signal ${String(sig)}`);
}

export function signalName(num: number): NodeJS.Signals | null {
  return byNumber.get(num) ?? null;
}

/** Decodes a raw wait status (as waitpid or PIDFD_INFO_EXIT give it); bit 0x80 is WCOREDUMP. */
export function decodeWaitStatus(status: number): ExitStatus {
  const termsig = status & 0x7f;
  if (termsig === 0) return { code: (status >> 8) & 0xff, signal: null };
  const signal = signalName(termsig) ?? (`SIG${termsig}` as NodeJS.Signals);
  return status & 0x80 ? { code: null, signal, coreDumped: true } : { code: null, signal };
}

export const UNKNOWN_EXIT: ExitStatus = Object.freeze({ code: null, signal: null }) as ExitStatus;
