// The addon's loader and its one packed number (src/backend/addon.ts): the
// loader says why there is no addon instead of throwing, and spawnedChild()
// takes addon.spawn()'s pid * SPAWN_PID_SCALE + pidfd apart into the pid of
// the child and a pidfd that is that child's. Loaded in both projects: the js
// backend does not use it, but the loader must answer the same there.
import { readFileSync, readlinkSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadAddon, type NativeAddon, packageRoot, spawnedChild } from '../../src/backend/addon.js';
import { backend } from '../../src/backend/index.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { MARKER, waitFor } from '../helpers/procs.js';

const cleanups = cleanupAfterEach({ marker: MARKER });

/** Runs loadAddon() with CUSTODY_ADDON_PATH set to `value` (undefined: unset), restoring it after. */
function loadWith(value: string | undefined) {
  const before = process.env.CUSTODY_ADDON_PATH;
  if (value === undefined) delete process.env.CUSTODY_ADDON_PATH;
  else process.env.CUSTODY_ADDON_PATH = value;
  try {
    return loadAddon();
  } finally {
    if (before === undefined) delete process.env.CUSTODY_ADDON_PATH;
    else process.env.CUSTODY_ADDON_PATH = before;
  }
}

// Loaded once before the leak check's first look: the addon keeps fds of its own (its /dev/null) for the
// life of the process, which the js backend's worker would otherwise first open inside a test. The one the
// package root gives is loaded too: where CUSTODY_ADDON_PATH names another build (the sanitizer's), the
// first test loads that second copy, with fds of its own.
const firstLoad = loadAddon();
loadWith(undefined);

describe(`the addon (${backend.name})`, () => {
  it('is found from the package root, and a missing or disabled one is a reason, not a throw', () => {
    expect(JSON.parse(readFileSync(join(packageRoot, 'package.json'), 'utf8')).name).toBe('custody');
    expect('addon' in loadWith(undefined)).toBe(true);
    expect(loadWith('')).toEqual({ error: 'CUSTODY_ADDON_PATH is empty (addon disabled)' });
    const missing = loadWith('/nonexistent/custody.node');
    expect(missing).toEqual({
      error: expect.stringMatching(
        /^the native addon did not load from CUSTODY_ADDON_PATH=\/nonexistent\/custody\.node: /,
      ),
    });
  });

  it("spawnedChild() gives the child's pid and a pidfd on that very child", async () => {
    if (!('addon' in firstLoad)) throw new Error(firstLoad.error);
    const addon: NativeAddon = firstLoad.addon;
    const packed = addon.spawn('/bin/sh', ['sh', '-c', 'read x; exit 5', MARKER], null, null, -1, -1, -1, 0, -1);
    const { pid, pidfd } = spawnedChild(addon, packed);
    cleanups.push(() => addon.close(pidfd));
    // The kernel's own account of the fd: a pidfd, and of this pid.
    expect(readlinkSync(`/proc/self/fd/${pidfd}`)).toBe('anon_inode:[pidfd]');
    expect(readFileSync(`/proc/self/fdinfo/${pidfd}`, 'utf8')).toMatch(new RegExp(`^Pid:\\s+${pid}$`, 'm'));
    expect(readFileSync(`/proc/${pid}/stat`, 'utf8')).toMatch(new RegExp(`^${pid} \\(sh\\) \\S+ ${process.pid} `));
    // stdin is the addon's /dev/null: read gets EOF, and the exit is waited for through the pidfd.
    const status = await waitFor(
      () => addon.waitid(pidfd, addon.constants.WEXITED | addon.constants.WNOHANG),
      5000,
      'the exit',
    );
    expect(status).toMatchObject({ pid, status: 5 });
  });
});
