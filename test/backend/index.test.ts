// Backend selection (src/backend/index.ts): chosen once from CUSTODY_BACKEND
// and what this machine has; a wrong value is an error with a stable code,
// never a silent fallback; what capabilities() reports is what the kernel was
// probed to have (this host: Linux >= 6.9, so pidfs ids and race-free signals).
import { readFileSync } from 'node:fs';
import { release } from 'node:os';
import { describe, expect, it } from 'vitest';
import { loadAddon } from '../../src/backend/addon.js';
import { backend, capabilities, selectBackend } from '../../src/backend/index.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { MARKER } from '../helpers/procs.js';

cleanupAfterEach({ marker: MARKER });
// The js project's worker has not loaded the addon yet: loaded before the leak check's first look (it
// keeps fds of its own for the life of the process).
const addonLoaded = 'addon' in loadAddon();

const [major = 0, minor = 0] = release().split('.').map(Number);
const atLeast = (maj: number, min: number) => major > maj || (major === maj && minor >= min);

describe(`backend selection (${backend.name})`, () => {
  it('is the one the project asked for, and says so in capabilities()', () => {
    expect(backend.name).toBe(process.env.CUSTODY_BACKEND);
    const caps = capabilities();
    expect(caps.backend).toBe(backend.name);
    expect(caps.kernel).toBe(release());
    if (backend.name === 'js') {
      expect(caps).toMatchObject({ raceFreeSignals: false, raceFreeIdentity: false, pidfd: false });
      expect(caps.reason).toBe('CUSTODY_BACKEND=js forces the pure-JS backend');
    } else {
      expect(caps).toMatchObject({ raceFreeSignals: true, raceFreeIdentity: true, pidfd: true, spawnWithPidfd: true });
      expect(caps.pidfsId).toBe(atLeast(6, 9));
      expect(caps.exitInfoOfNonChildren).toBe(atLeast(6, 15));
    }
  });

  it('finds cgroup v2 where mountinfo says it is mounted', () => {
    const mountinfo = readFileSync('/proc/self/mountinfo', 'utf8');
    const line = mountinfo.split('\n').find((l) => l.split(' - ')[1]?.startsWith('cgroup2 '));
    const caps = capabilities();
    if (!line) {
      expect(caps.cgroup).toBeNull();
      expect(caps.cgroupReason).toMatch(/cgroup/);
    } else {
      expect(caps.cgroup?.mount).toBe(line.split(' ')[4]);
    }
  });

  it('an unknown CUSTODY_BACKEND is refused with its value; an empty one chooses as unset does', () => {
    expect(() => selectBackend({ CUSTODY_BACKEND: 'fast' })).toThrow(
      expect.objectContaining({ code: 'ERR_CUSTODY_INVALID_ARG', message: expect.stringContaining('"fast"') }),
    );
    expect(selectBackend({ CUSTODY_BACKEND: 'js' }).name).toBe('js');
    const chosen = selectBackend({ CUSTODY_BACKEND: '' });
    expect(chosen.name).toBe(addonLoaded ? 'native' : 'js');
    expect(selectBackend({}).name).toBe(chosen.name);
  });
});
