// Drives every call of the native addon, success and error paths, ROUNDS
// times in one process, for scripts/valgrind.sh: each leak or invalid access
// in the addon then shows up ROUNDS-fold. Loads the addon directly from
// CUSTODY_ADDON_PATH (the backend's own probe would refuse a kernel call that
// valgrind does not know and fall back to js, testing nothing).
// Prints which calls valgrind refused (ENOSYS): those paths ran only up to
// the refused syscall.
import { execFileSync } from 'node:child_process';
import { closeSync, mkdirSync, mkdtempSync, openSync, rmSync, writeFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const addon = createRequire(import.meta.url)(process.env.CUSTODY_ADDON_PATH);
const ROUNDS = Number(process.env.ROUNDS ?? 20);
const C = addon.constants;
const refused = new Map();
const calls = new Map();

/** Runs fn; an error whose code is in `expected` is an error path we meant to take. */
function call(name, fn, expected = []) {
  calls.set(name, (calls.get(name) ?? 0) + 1);
  try {
    return fn();
  } catch (err) {
    if (err?.code === 'ENOSYS') {
      refused.set(name, `${err.syscall ?? '?'} ENOSYS`);
      return undefined;
    }
    if (expected.includes(err?.code)) return undefined;
    throw new Error(`${name}: ${err?.stack ?? err}`);
  }
}

const dir = mkdtempSync(join(tmpdir(), 'custody-valgrind-'));
const lockFile = join(dir, 'lock');
writeFileSync(lockFile, '');
// A state dir for readFilesAt: one manifest, one FIFO where a manifest should be.
const stateDir = join(dir, 'state');
mkdirSync(join(stateDir, 'a'), { recursive: true });
writeFileSync(join(stateDir, 'a', 'manifest.json'), '{"id":"a"}');
mkdirSync(join(stateDir, 'fifo'));
execFileSync('mkfifo', [join(stateDir, 'fifo', 'manifest.json')]);
const stat = '4242 (a) (b c) S 1 77 77 0 -1 4194560 100 0 0 0 1 2 0 0 20 0 1 0 123456 1000 200 18446744073709551615\n';

// The one exit dispatcher: [id, code, status] triples in `events`.
const waiting = new Map();
const events = addon.watchDispatch((count) => {
  for (let i = 0; i < count * 3; i += 3) waiting.get(events[i])?.([events[i + 1], events[i + 2]]);
});

/** Waits for the exit through a watch; `reap`: the watch reaps it, else waitid does. */
async function waitExit(pidfd, reap) {
  const report = await new Promise((resolve) => {
    const id = call('watch', () => addon.watch(pidfd, reap));
    if (id === undefined) resolve(undefined);
    else waiting.set(id, resolve);
  });
  if (reap) return report;
  return call('waitid', () => addon.waitid(pidfd, C.WEXITED));
}

try {
  for (let round = 0; round < ROUNDS; round++) {
    call('probe', () => addon.probe());
    call('parseStat', () => addon.parseStat(stat));
    call('parseStat(bad)', () => addon.parseStat('garbage'), ['EINVAL']);
    call('readBootId', () => addon.readBootId());
    call('readBootId(missing)', () => addon.readBootId(join(dir, 'missing')), ['ENOENT']);
    call('listProcesses', () => addon.listProcesses());
    // The threadpool batches, awaited: each result (pidfds, buffers) is built and freed within the round.
    const pins = await call('inspectPinnedMany', () => addon.inspectPinnedMany([process.pid, 2 ** 22 - 1]));
    for (const row of pins ?? []) if (Array.isArray(row) && row[7] >= 0) addon.close(row[7]);
    call('inspectPinnedMany(out of range)', () => addon.inspectPinnedMany([0]), ['ERR_OUT_OF_RANGE']);
    const stateFd = openSync(stateDir, 'r');
    try {
      await call('readFilesAt', () => addon.readFilesAt(stateFd, ['a', 'missing', 'fifo'], 'manifest.json', 64));
      call('readFilesAt(bad name)', () => addon.readFilesAt(stateFd, ['../a'], 'manifest.json', 64), [
        'ERR_INVALID_ARG_VALUE',
      ]);
    } finally {
      closeSync(stateFd);
    }
    call('inspect(self)', () => addon.inspect(process.pid));
    const kept = call('inspect(self, keep pidfd)', () => addon.inspect(process.pid, '/proc', true));
    if (kept && kept[7] >= 0) call('close', () => addon.close(kept[7]));
    // PID_MAX_LIMIT - 1: in range for the addon, held by no process here.
    call('inspect(gone)', () => addon.inspect(2 ** 22 - 1), ['ESRCH', 'ENOENT']);
    call('inspect(out of range)', () => addon.inspect(2 ** 32 + process.pid), ['ERR_OUT_OF_RANGE']);

    const self = call('pidfdOpen', () => addon.pidfdOpen(process.pid));
    if (self !== undefined) {
      call('pidfsId', () => addon.pidfsId(self));
      call('pidfdGetExitInfo', () => addon.pidfdGetExitInfo(self), ['EINVAL', 'ENOTTY', 'ESRCH']);
      call('pidfdSendSignal(0)', () => addon.pidfdSendSignal(self, 0));
      call('close', () => addon.close(self));
    }
    call('pidfdOpen(gone)', () => addon.pidfdOpen(2 ** 22 - 1), ['ESRCH']);

    const p = call('pipe', () => addon.pipe());
    if (p) for (const fd of p) call('close', () => addon.close(fd));
    const fd = openSync(lockFile, 'r+');
    call('flock(EX|NB)', () => addon.flock(fd, C.LOCK_EX | C.LOCK_NB));
    closeSync(fd); // releases the lock
    call('setChildSubreaper', () => addon.setChildSubreaper(true));
    call('getChildSubreaper', () => addon.getChildSubreaper());
    call('setChildSubreaper', () => addon.setChildSubreaper(false));

    // spawn() returns pid * SPAWN_PID_SCALE + pidfd.
    const spawned = (n) => ({ pid: Math.floor(n / C.SPAWN_PID_SCALE), pidfd: n % C.SPAWN_PID_SCALE });
    // Valgrind refuses a clone whose child shares the fd table (CLONE_FILES):
    // spawn is checked here on the copying path, the same code but for the
    // table's sharing.
    const copy = C.SPAWN_COPY_FD_TABLE;
    const session = round % 2 === 0 ? C.SPAWN_NEW_SESSION : 0;
    const child = call('spawn', () =>
      // A word past the addon's 255-unit stack copy takes the heap path too.
      addon.spawn(
        '/bin/sh',
        ['sh', '-c', 'exit 3', 'sh', 'x'.repeat(300)],
        ['PATH=/usr/bin:/bin'],
        null,
        0,
        1,
        2,
        copy | session,
        -1,
      ),
    );
    if (child !== undefined) {
      const { pid, pidfd } = spawned(child);
      const reapHere = round % 2 === 1;
      const info = await waitExit(pidfd, reapHere);
      if (reapHere && info && info[1] !== 3) throw new Error(`watch reap: ${JSON.stringify(info)}`);
      if (!reapHere && info && info.pid !== pid) throw new Error(`waitid: ${JSON.stringify(info)}`);
      call('close', () => addon.close(pidfd));
    }
    call('spawn(ENOENT)', () => addon.spawn(join(dir, 'missing'), ['x'], [], dir, 0, 1, 2, copy, -1), ['ENOENT']);
    const idle = call('spawn(sleep)', () => addon.spawn('/bin/sleep', ['sleep', '30'], [], null, 0, 1, 2, copy, -1));
    if (idle !== undefined) {
      const { pid, pidfd } = spawned(idle);
      const id = call('watch', () => addon.watch(pidfd, false));
      if (id !== undefined) {
        call('watchRef', () => addon.watchRef(id, false));
        call('unwatch', () => addon.unwatch(id));
      }
      process.kill(pid, 'SIGKILL');
      await waitExit(pidfd, true);
      call('close', () => addon.close(pidfd));
    }
  }
} finally {
  rmSync(dir, { recursive: true, force: true });
}
const total = [...calls.values()].reduce((a, b) => a + b, 0);
console.log(`valgrind-addon: ${calls.size} calls, ${total} invocations over ${ROUNDS} rounds`);
for (const [name, why] of refused) console.log(`valgrind-addon: refused under valgrind: ${name} (${why})`);
