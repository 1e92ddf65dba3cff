// The store's batch paths, which recovery uses and a lone stop does not:
// readMany (the addon's readFilesAt on the native backend) must answer
// exactly as read() does, and a batched removal, whose steps wait in
// libuv's pool queue while anything else runs, must never be led out of the
// state dir by a symlink renamed into place meanwhile.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdirSync, readFileSync, renameSync, rmSync, symlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { StateStore } from '../../src/state/store.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { isRoot, tmpDir } from '../helpers/procs.js';
import { startingManifest } from '../helpers/state.js';
import { holdThreadpool } from '../helpers/threadpool.js';

expectNoLeaks();

const starting = (id: string) => startingManifest(id, 'a'.repeat(32));

/** A readMany() entry as answer() words it. */
const answerOf = (r: unknown) =>
  answer(() => {
    if (r instanceof Error) throw r;
    return r;
  });

/** A new store in a temp dir for `body`; the dir is removed after, whatever happens. */
async function inStore(
  body: (store: StateStore, state: string, root: string, events: Array<{ type: string }>) => Promise<void>,
): Promise<void> {
  const dir = tmpDir('custody-batch-');
  try {
    const state = join(dir.path, 'state');
    const events: Array<{ type: string }> = [];
    const store = await StateStore.open(state, { emit: (type) => events.push({ type }), create: true });
    try {
      await body(store, state, dir.path, events);
    } finally {
      store.close();
    }
  } finally {
    dir.cleanup();
  }
}

/** What read() says of a name: its manifest's id, or its error's class and message. */
function answer(read: () => unknown): string {
  try {
    const m = read() as { id: string };
    return `manifest ${m.id}`;
  } catch (err) {
    return `${(err as Error).constructor.name}: ${(err as Error).message}`;
  }
}

describe(`batched removal (${backend.name})`, () => {
  it('never follows an instance dir swapped for a symlink while its removal waits in the pool', () =>
    inStore(async (store, state, root) => {
      const outside = join(root, 'outside');
      mkdirSync(outside);
      writeFileSync(join(outside, 'manifest.json'), 'not custody state');
      await store.write(starting('x'));
      // The removal's first step is queued first and runs; then the pool's
      // threads are blocked, so its next step runs only once they are
      // released, after the swap.
      const removal = store.remove('x', { sync: false });
      const pool = holdThreadpool(root);
      await sleep(200);
      renameSync(join(state, 'x'), join(root, 'x-moved'));
      symlinkSync(outside, join(state, 'x'));
      pool.release();
      await pool.drained;
      await removal;
      expect(existsSync(join(outside, 'manifest.json'))).toBe(true);
    }));

  it('removes an instance dir the pooled way and the careful way alike', () =>
    inStore(async (store, state, root, events) => {
      for (const id of ['plain', 'extra', 'link']) await store.write(starting(id));
      // A file custody did not write stays, with a warning; a symlinked instance dir goes as a link.
      writeFileSync(join(state, 'extra', 'operator-notes'), 'mine');
      rmSync(join(state, 'link'), { recursive: true });
      symlinkSync(root, join(state, 'link'));
      const results = await Promise.all(['plain', 'extra', 'link'].map((id) => store.remove(id, { sync: false })));
      await store.syncDir();
      expect(results).toEqual([
        { removed: true, left: [] },
        { removed: true, left: ['operator-notes'] },
        { removed: true, left: [] },
      ]);
      expect(existsSync(join(state, 'plain'))).toBe(false);
      expect(existsSync(join(state, 'extra', 'operator-notes'))).toBe(true);
      expect(existsSync(join(state, 'extra', 'manifest.json'))).toBe(false);
      expect(existsSync(join(state, 'link'))).toBe(false);
      expect(existsSync(root)).toBe(true);
      expect(events.filter((e) => e.type === 'warning')).toHaveLength(1);
    }));
});

describe(`readMany answers as read() does (${backend.name})`, () => {
  it('for every kind of thing found where a manifest should be', () =>
    inStore(async (store, state) => {
      const names = ['good', 'fifo', 'leaflink', 'leafdir', 'big', 'empty', 'json', 'none', 'dirlink', 'notdir'];
      for (const id of names) if (id !== 'dirlink' && id !== 'notdir') await store.write(starting(id));
      const m = (id: string) => join(state, id, 'manifest.json');
      rmSync(m('fifo'));
      execFileSync('mkfifo', [m('fifo')]);
      rmSync(m('leaflink'));
      symlinkSync(m('good'), m('leaflink'));
      rmSync(m('leafdir'));
      mkdirSync(m('leafdir'));
      writeFileSync(m('big'), Buffer.alloc(1024 * 1024 + 1, 0x20));
      writeFileSync(m('empty'), '');
      writeFileSync(m('json'), '{"version":');
      rmSync(m('none'));
      symlinkSync(join(state, 'good'), join(state, 'dirlink'));
      writeFileSync(join(state, 'notdir'), 'a file');
      if (isRoot()) {
        names.push('device');
        await store.write(starting('device'));
        rmSync(m('device'));
        execFileSync('mknod', [m('device'), 'c', '1', '3']);
      }
      const got = (await store.readMany(names)).map(answerOf);
      const expected = names.map((n) => answer(() => store.read(n)));
      expect(got).toEqual(expected);
      // Only the good one was read; every other kind was refused.
      expect(expected.filter((a) => a.startsWith('manifest '))).toEqual(['manifest good']);
    }));

  it('for a state dir of manifests near the size cap: what a batch leaves unread is read one by one', () =>
    inStore(async (store, state) => {
      // 40 valid manifests padded with whitespace to just under 1 MiB: more
      // than a native batch holds (32 MiB), so some come back unread.
      const ids = Array.from({ length: 40 }, (_, i) => `big-${i}`);
      for (const id of ids) {
        await store.write(starting(id));
        const path = join(state, id, 'manifest.json');
        const text = readFileSync(path, 'utf8');
        writeFileSync(path, text + ' '.repeat(1024 * 1024 - Buffer.byteLength(text) - 1));
      }
      expect((await store.readMany(ids)).map(answerOf)).toEqual(ids.map((id) => `manifest ${id}`));
    }));
});
