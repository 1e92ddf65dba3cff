/** src/process/signals.ts: names and numbers, and raw wait statuses as waitpid and PIDFD_INFO_EXIT give them. */
import { constants } from 'node:os';
import { describe, expect, it } from 'vitest';
import { decodeWaitStatus, signalName, signalNumber } from '../../src/process/signals.js';

describe('signals', () => {
  it('maps names and numbers both ways; 0 is the existence probe; unknown ones are refused with a code', () => {
    expect(signalNumber('SIGTERM')).toBe(constants.signals.SIGTERM);
    expect(signalNumber(9)).toBe(9);
    expect(signalNumber(0)).toBe(0);
    expect(signalName(constants.signals.SIGKILL)).toBe('SIGKILL');
    expect(() => signalNumber('SIGNOPE' as NodeJS.Signals)).toThrow(
      expect.objectContaining({ code: 'ERR_CUSTODY_INVALID_ARG' }),
    );
    expect(() => signalNumber(1000)).toThrow(expect.objectContaining({ code: 'ERR_CUSTODY_INVALID_ARG' }));
  });

  it('decodes wait statuses: exit codes, signals, and a signal with a core dump', () => {
    expect(decodeWaitStatus(3 << 8)).toEqual({ code: 3, signal: null });
    expect(decodeWaitStatus(0)).toEqual({ code: 0, signal: null });
    expect(decodeWaitStatus(constants.signals.SIGKILL)).toEqual({ code: null, signal: 'SIGKILL' });
    expect(decodeWaitStatus(constants.signals.SIGSEGV | 0x80)).toEqual({
      code: null,
      signal: 'SIGSEGV',
      coreDumped: true,
    });
  });
});
