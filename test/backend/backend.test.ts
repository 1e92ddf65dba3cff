import { execFileSync, spawn as cpSpawn } from 'node:child_process';
import {
  closeSync,
  constants as fsc,
  mkdirSync,
  mkdtempSync,
  openSync,
  readdirSync,
  rmSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Worker } from 'node:worker_threads';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import type { NativeBackend } from '../../src/backend/native.js';
import { capabilities } from '../../src/index.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { killAndWait, MARKER, unusedPid, waitFor } from '../helpers/procs.js';
import { PERL as PERL_BIN } from '../helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });

const root = join(import.meta.dirname, '..', '..');
const dist = join(root, 'dist', 'index.js');

/** Loads the built package in a fresh node with the given env; returns capabilities() or the load error. */
function loadWith(env: Record<string, string>): {
  caps?: Record<string, unknown>;
  error?: { code: string; message: string };
} {
  const script = `import(${JSON.stringify(dist)}).then((c) => console.log(JSON.stringify({ caps: c.capabilities() })), (e) => console.log(JSON.stringify({ error: { code: e.code, message: e.message } })))`;
  const out = execFileSync(process.execPath, ['-e', script], { env: { ...process.env, ...env }, encoding: 'utf8' });
  return JSON.parse(out);
}

describe(`backend selection (${backend.name})`, () => {
  it('uses the backend CUSTODY_BACKEND names, and native by default on Linux', () => {
    expect(capabilities().backend).toBe(backend.name);
    if (process.platform === 'linux') {
      // This repository's CI builds the addon: a silent fallback here would hide a broken build.
      const def = loadWith({ CUSTODY_BACKEND: '' });
      expect(def.caps?.backend, String(def.caps?.reason)).toBe('native');
    }
  });

  it('says which guarantees hold on each backend', () => {
    const caps = capabilities();
    if (caps.backend === 'native') {
      expect(caps).toMatchObject({
        pidfd: true,
        raceFreeSignals: true,
        raceFreeIdentity: true,
        spawnWithPidfd: true,
        proc: true,
        coreDump: true,
      });
      expect(caps.reason).toBeUndefined();
    } else {
      expect(caps).toMatchObject({
        pidfd: false,
        pidfsId: false,
        raceFreeSignals: false,
        exitInfoOfNonChildren: false,
        coreDump: false,
      });
      expect(caps.reason).toMatch(/CUSTODY_BACKEND=js/);
    }
  });

  it('falls back to js and says why when the addon cannot load', () => {
    const r = loadWith({ CUSTODY_BACKEND: '', CUSTODY_ADDON_PATH: '/nonexistent/custody.node' });
    expect(r.caps?.backend).toBe('js');
    expect(r.caps?.reason).toMatch(/native addon did not load/);
  });

  it('refuses a forced native backend it cannot provide, and a backend name it does not know', () => {
    expect(loadWith({ CUSTODY_BACKEND: 'native', CUSTODY_ADDON_PATH: '/nonexistent/custody.node' }).error?.code).toBe(
      'ERR_CUSTODY_UNSUPPORTED',
    );
    expect(loadWith({ CUSTODY_BACKEND: 'fast' }).error?.code).toBe('ERR_CUSTODY_INVALID_ARG');
  });

  it.skipIf(backend.name !== 'native')(
    'closes every pidfd a worker thread left open when the worker goes away',
    async () => {
      const count = () => readdirSync('/proc/self/fd').length;
      const before = count();
      const worker = new Worker(
        `import(${JSON.stringify(dist)}).then(async (c) => {
         const { parentPort } = await import('node:worker_threads');
         const kids = Array.from({ length: 5 }, () => c.spawn('sleep', ['30']));
         const opened = kids.map((k) => c.open(k.pid));
         parentPort.postMessage(kids.map((k) => k.pid));
         void opened;
       });`,
        { eval: true, env: { ...process.env, CUSTODY_BACKEND: 'native' } },
      );
      const pids: number[] = await new Promise((r) => worker.once('message', r));
      expect(count()).toBeGreaterThanOrEqual(before + 10);
      await worker.terminate();
      expect(count()).toBe(before);
      // The children outlive the worker and are this process's children:
      // nobody watches them any more, so end and reap them here.
      const addon = (backend as NativeBackend).addon;
      for (const pid of pids) {
        const fd = addon.pidfdOpen(pid);
        addon.pidfdSendSignal(fd, 9);
        addon.waitid(fd, addon.constants.WEXITED);
        addon.close(fd);
      }
    },
  );
});

describe(`inspectPinnedMany: pins taken on the threadpool (${backend.name})`, () => {
  it('gives, in order, each pid its pin or the error inspectPinned throws; every pidfd is closed with its pin', async () => {
    if (!backend.inspectPinnedMany) {
      // Only a backend that reads /proc off the event loop offers it; recovery then pins each in turn.
      expect(backend.name).toBe('js');
      return;
    }
    const child = cpSpawn(PERL_BIN, ['-e', 'sleep 30', MARKER], { stdio: 'ignore' });
    try {
      await waitFor(() => {
        try {
          return backend.inspect(child.pid as number).argv.includes(MARKER);
        } catch {
          return false;
        }
      });
      // A thread of this process: a TID, not a process.
      const tid = readdirSync('/proc/self/task')
        .map(Number)
        .find((t) => t !== process.pid) as number;
      const gone = unusedPid();
      const rows = await backend.inspectPinnedMany([child.pid as number, gone, tid, process.pid]);
      expect(rows).toHaveLength(4);
      const [live, none, thread, self] = rows;
      expect(live).not.toBeInstanceOf(Error);
      if (!live || !self || live instanceof Error || self instanceof Error) throw new Error('not pinned');
      expect(live.raw.argv).toEqual([PERL_BIN, '-e', 'sleep 30', MARKER]);
      expect(live.raw.startTicks).toBe(backend.inspect(child.pid as number).startTicks);
      expect(live.ref.signal(0)).toBe(true);
      expect(none).toMatchObject({ code: 'ESRCH' });
      expect(thread).toMatchObject({ code: 'ERR_CUSTODY_NOT_A_PROCESS' });
      expect(self.raw.startTicks).toBe(backend.inspect(process.pid).startTicks);
      live.ref.close();
      self.ref.close();
      await expect(backend.inspectPinnedMany([0])).rejects.toMatchObject({ code: 'ERR_OUT_OF_RANGE' });
      await expect(backend.inspectPinnedMany([])).resolves.toEqual([]);
    } finally {
      await killAndWait(child);
    }
  });
});

describe(`readFilesAt: state files read on the threadpool (${backend.name})`, () => {
  it('reads each <name>/<leaf> in order, never following a symlink nor opening a FIFO or a device; no fd is left', async () => {
    if (!backend.readFilesAt) {
      // Only the native backend reads files off the event loop; the store then reads each in turn.
      expect(backend.name).toBe('js');
      return;
    }
    const root = mkdtempSync(join(tmpdir(), 'custody-readfiles-'));
    const outside = mkdtempSync(join(tmpdir(), 'custody-readfiles-outside-'));
    let dirFd = -1;
    try {
      const put = (name: string, make: (leaf: string) => void) => {
        mkdirSync(join(root, name));
        make(join(root, name, 'm.json'));
      };
      put('plain', (f) => writeFileSync(f, '{"a":1}'));
      put('empty', (f) => writeFileSync(f, ''));
      put('big', (f) => writeFileSync(f, Buffer.alloc(65)));
      put('fifo', (f) => execFileSync('mkfifo', [f]));
      // A device node needs root (mknod); the unprivileged run checks the rest.
      const asRoot = process.getuid?.() === 0;
      if (asRoot) put('device', (f) => execFileSync('mknod', [f, 'c', '1', '3'])); // /dev/null's numbers
      put('linkleaf', (f) => symlinkSync(join(outside, 'secret'), f));
      put('noleaf', () => {});
      writeFileSync(join(outside, 'secret'), 'not ours');
      mkdirSync(join(outside, 'dir'));
      writeFileSync(join(outside, 'dir', 'm.json'), 'not ours either');
      symlinkSync(join(outside, 'dir'), join(root, 'linkdir'));
      writeFileSync(join(root, 'file'), 'a file, not a dir');
      const names = ['plain', 'empty', 'big', 'fifo', ...(asRoot ? ['device'] : []), 'linkleaf', 'noleaf', 'linkdir'];
      names.push('file', 'absent');
      dirFd = openSync(root, fsc.O_RDONLY | fsc.O_DIRECTORY);
      const rows = await backend.readFilesAt(dirFd, names, 'm.json', 64);
      const byName = Object.fromEntries(names.map((n, k) => [n, rows[k]]));
      expect(byName.plain).toEqual(Buffer.from('{"a":1}'));
      expect(byName.empty).toEqual(Buffer.alloc(0));
      expect(byName.big).toMatchObject({ size: 65, swapped: false });
      expect(byName.fifo).toMatchObject({ mode: expect.any(Number) });
      expect((byName.fifo as { mode: number }).mode & fsc.S_IFMT).toBe(fsc.S_IFIFO);
      if (asRoot) expect((byName.device as { mode: number }).mode & fsc.S_IFMT).toBe(fsc.S_IFCHR);
      expect((byName.linkleaf as { mode: number }).mode & fsc.S_IFMT).toBe(fsc.S_IFLNK);
      expect(byName.noleaf).toMatchObject({ code: 'ENOENT', syscall: 'lstat' });
      // O_DIRECTORY|O_NOFOLLOW on a symlink: ENOTDIR on Linux (ELOOP elsewhere); never the dir it names.
      expect(byName.linkdir).toMatchObject({ code: expect.stringMatching(/^(ENOTDIR|ELOOP)$/), syscall: 'opendir' });
      expect(byName.file).toMatchObject({ code: 'ENOTDIR', syscall: 'opendir' });
      expect(byName.absent).toMatchObject({ code: 'ENOENT', syscall: 'opendir' });
      // Names are single components, checked before anything is opened.
      for (const bad of ['../x', '.', '..', '', 'a/b'])
        await expect(async () => backend.readFilesAt?.(dirFd, [bad], 'm.json', 64)).rejects.toMatchObject({
          code: 'ERR_INVALID_ARG_VALUE',
        });
      await expect(async () => backend.readFilesAt?.(dirFd, ['plain'], '../m.json', 64)).rejects.toMatchObject({
        code: 'ERR_INVALID_ARG_VALUE',
      });
      await expect(async () => backend.readFilesAt?.(dirFd, ['plain'], 'm.json', -1)).rejects.toMatchObject({
        code: 'ERR_OUT_OF_RANGE',
      });
      await expect(backend.readFilesAt(dirFd, [], 'm.json', 64)).resolves.toEqual([]);
      await expect(async () =>
        backend.readFilesAt?.(
          dirFd,
          Array.from({ length: 65537 }, () => 'plain'),
          'm.json',
          64,
        ),
      ).rejects.toMatchObject({ code: 'ERR_OUT_OF_RANGE' });
    } finally {
      if (dirFd >= 0) closeSync(dirFd);
      rmSync(root, { recursive: true, force: true });
      rmSync(outside, { recursive: true, force: true });
    }
  });

  it('stops reading once a batch holds 32 MiB: the names past it come back null, unread', async () => {
    if (!backend.readFilesAt) {
      expect(backend.name).toBe('js');
      return;
    }
    const root = mkdtempSync(join(tmpdir(), 'custody-readfiles-'));
    let dirFd = -1;
    try {
      const names = ['a', 'b', 'c', 'small'];
      for (const n of names) {
        mkdirSync(join(root, n));
        writeFileSync(join(root, n, 'm.json'), n === 'small' ? 'small' : Buffer.alloc(16 << 20, 0x20));
      }
      dirFd = openSync(root, fsc.O_RDONLY | fsc.O_DIRECTORY);
      const rows = await backend.readFilesAt(dirFd, names, 'm.json', 16 << 20);
      expect(rows.map((r) => (Buffer.isBuffer(r) ? r.length : r))).toEqual([16 << 20, 16 << 20, null, null]);
    } finally {
      if (dirFd >= 0) closeSync(dirFd);
      rmSync(root, { recursive: true, force: true });
    }
  });
});
