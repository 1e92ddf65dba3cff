// Faults on the state dir: ENOSPC, a torn write, a read-only dir, and an
// exhausted fd table. Each gives a clear error with a stable code, leaves no
// process unowned, and nothing half-written is ever read back as valid.
import { execFile, execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readdirSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { Supervisor } from '../../src/index.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { processesWithMarker } from '../helpers/leaks.js';
import { isRoot, MARKER, tmpDir } from '../helpers/procs.js';
import { PERL } from '../helpers/supervisor.js';

const cleanups = cleanupAfterEach({ marker: MARKER });

/** A tiny tmpfs of its own (root only): the real ENOSPC and EROFS. */
function tinyFs(sizeKiB = 256): string {
  const dir = tmpDir('custody-fs-');
  execFileSync('mount', ['-t', 'tmpfs', '-o', `size=${sizeKiB}k,mode=0700`, 'custody-test', dir.path]);
  cleanups.push(() => {
    execFileSync('umount', ['-l', dir.path]);
    dir.cleanup();
  });
  return dir.path;
}

function fill(dir: string): void {
  // Fill every block: the next write anywhere on this fs gets ENOSPC.
  try {
    execFileSync('dd', ['if=/dev/zero', `of=${join(dir, 'ballast')}`, 'bs=4k'], { stdio: 'ignore' });
  } catch {
    // dd ends with "No space left on device": that is the point
  }
}

const perlArgs = (t: string) => ['-e', 'sleep 300', t, MARKER];
const canMount = isRoot();
const MOUNT_NOTE = 'needs root: mounts a tiny tmpfs';

describe(`state faults (${backend.name})`, () => {
  it('ENOSPC before spawn: ERR_CUSTODY_STATE_IO, nothing spawned, no temp file left', async (ctx) => {
    ctx.skip(!canMount, MOUNT_NOTE);
    const fs = tinyFs();
    const { supervisor } = await Supervisor.open({ stateDir: join(fs, 'state'), onEvent: () => {} });
    cleanups.push(() => supervisor.close());
    fill(fs);
    const err = await supervisor.launch({ id: 'full', command: PERL, args: perlArgs }).catch((e) => e);
    expect(err).toMatchObject({ code: 'ERR_CUSTODY_STATE_IO' });
    expect(err.cause).toMatchObject({ code: 'ENOSPC' });
    expect(processesWithMarker(MARKER)).toEqual([]);
    const leftovers = existsSync(join(fs, 'state', 'full')) ? readdirSync(join(fs, 'state', 'full')) : [];
    expect(leftovers.filter((n) => n.endsWith('.tmp'))).toEqual([]);
    expect(supervisor.list()).toEqual([]);
  });

  it('ENOSPC when recording the identity: the confirmed process is abandoned, not left unowned', async (ctx) => {
    ctx.skip(!canMount, MOUNT_NOTE);
    const fs = tinyFs();
    let filled = false;
    const { supervisor } = await Supervisor.open({
      stateDir: join(fs, 'state'),
      // Fill the disk the moment exec is confirmed: the next write is the identity manifest.
      onEvent: (e) => {
        if (e.type === 'confirm' && !filled) {
          filled = true;
          fill(fs);
        }
      },
    });
    cleanups.push(() => supervisor.close());
    const err = await supervisor.launch({ id: 'late', command: PERL, args: perlArgs }).catch((e) => e);
    expect(err).toMatchObject({ code: 'ERR_CUSTODY_STATE_IO' });
    expect(err.cause).toMatchObject({ code: 'ENOSPC' });
    expect(processesWithMarker(MARKER)).toEqual([]);
    expect(supervisor.list()).toEqual([]);
    // The starting manifest went with the abandoned process (removal needs no space).
    expect(existsSync(join(fs, 'state', 'late'))).toBe(false);
  });

  it('a read-only state dir: a clear error at open; at launch, nothing spawned', async (ctx) => {
    ctx.skip(!canMount, MOUNT_NOTE);
    const fs = tinyFs();
    const stateDir = join(fs, 'state');
    mkdirSync(stateDir, { mode: 0o700 });
    const roView = tmpDir('custody-ro-');
    // A read-only bind of the same fs: EROFS for every write through it.
    execFileSync('mount', ['--bind', fs, roView.path]);
    execFileSync('mount', ['-o', 'remount,bind,ro', roView.path]);
    cleanups.push(() => {
      execFileSync('umount', ['-l', roView.path]);
      roView.cleanup();
    });
    const err = await Supervisor.open({ stateDir: join(roView.path, 'state'), onEvent: () => {} }).catch((e) => e);
    expect(err).toMatchObject({ code: 'ERR_CUSTODY_STATE_IO' });
    expect(err.cause).toMatchObject({ code: 'EROFS' });
    // An instance dir that is itself a read-only mount.
    const { supervisor } = await Supervisor.open({ stateDir, onEvent: () => {} });
    cleanups.push(() => supervisor.close());
    mkdirSync(join(stateDir, 'ro'), { mode: 0o700 });
    execFileSync('mount', ['--bind', '-o', 'ro', join(roView.path, 'state', 'ro'), join(stateDir, 'ro')]);
    cleanups.push(() => void execFileSync('umount', ['-l', join(stateDir, 'ro')]));
    const launchErr = await supervisor.launch({ id: 'ro', command: PERL, args: perlArgs }).catch((e) => e);
    expect(launchErr).toMatchObject({ code: 'ERR_CUSTODY_STATE_IO' });
    expect(launchErr.cause).toMatchObject({ code: 'EROFS' });
    expect(processesWithMarker(MARKER)).toEqual([]);
    expect(supervisor.list()).toEqual([]);
  });

  it('a torn write (temp file, no rename) is never read back as a manifest', async () => {
    const dir = tmpDir();
    cleanups.push(() => dir.cleanup());
    const stateDir = join(dir.path, 'state');
    mkdirSync(join(stateDir, 'torn'), { recursive: true, mode: 0o700 });
    // A state dir custody 0.1 left: its lock file beside the torn instance.
    writeFileSync(join(stateDir, '.lock'), '', { mode: 0o600 });
    writeFileSync(join(stateDir, 'torn', '.manifest.abcdef.tmp'), '{"version":1,"id":"torn","token":"', {
      mode: 0o600,
    });
    const { supervisor, report } = await Supervisor.open({ stateDir, onEvent: () => {} });
    cleanups.push(() => supervisor.close());
    expect(report.cleaned).toEqual([{ id: 'torn', reason: 'incomplete' }]);
    expect(report.quarantined).toEqual([]);
    expect(existsSync(join(stateDir, 'torn'))).toBe(false);
  });

  it('an exhausted fd table: EMFILE surfaces with its code and nothing is left running', async () => {
    // In a child whose RLIMIT_NOFILE is small and then used up, so this worker keeps its fds.
    const dir = tmpDir();
    cleanups.push(() => dir.cleanup());
    const dist = join(import.meta.dirname, '..', '..', 'dist', 'index.js');
    const script = `
      const { openSync, closeSync } = await import('node:fs');
      const { Supervisor, inspect } = await import(${JSON.stringify(dist)});
      const { supervisor } = await Supervisor.open({ stateDir: ${JSON.stringify(join(dir.path, 'state'))}, onEvent: () => {} });
      const hoard = [];
      try { for (;;) hoard.push(openSync('/dev/null', 'r')); } catch (e) { if (e.code !== 'EMFILE') throw e; }
      const out = {};
      try { inspect(process.ppid); } catch (e) { out.inspect = { code: e.code, syscall: e.syscall }; }
      try { await supervisor.launch({ id: 'nofd', command: ${JSON.stringify(PERL)}, args: (t) => ['-e', 'sleep 300', t, ${JSON.stringify(MARKER)}] }); } catch (e) { out.launch = { code: e.code, cause: e.cause?.code }; }
      for (const fd of hoard) closeSync(fd);
      out.list = supervisor.list();
      await supervisor.close();
      console.log(JSON.stringify(out));`;
    const { stdout } = await promisify(execFile)(
      'sh',
      ['-c', `ulimit -n 64 && exec "$0" --input-type=module -e "$1"`, process.execPath, script],
      {
        env: { ...process.env, CUSTODY_BACKEND: backend.name },
      },
    );
    const r = JSON.parse(stdout.trim());
    if (backend.name === 'native') expect(r.inspect).toEqual({ code: 'EMFILE', syscall: 'pidfd_open' });
    else expect(r.inspect.code).toBe('EMFILE');
    expect(r.launch.code === 'EMFILE' || r.launch.cause === 'EMFILE').toBe(true);
    expect(r.list).toEqual([]);
    expect(processesWithMarker(MARKER)).toEqual([]);
  });
});
