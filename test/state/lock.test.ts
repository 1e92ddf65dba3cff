// The state dir's lock: one holder at a time between real processes, on
// each backend and across them, against a holder of custody 0.1 too;
// takeover only from a holder proven gone; a .lock that is not a regular
// file is a custody error.
import { execFileSync, spawn as cpSpawn } from 'node:child_process';
import { mkdirSync, readdirSync, readFileSync, symlinkSync, unlinkSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { loadAddon } from '../../src/backend/addon.js';
import { backend } from '../../src/backend/index.js';
import { inspect, Supervisor } from '../../src/index.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { endOwn, goneFrom, isRoot, killAndWait, MARKER, procStat, tmpDir, untilReady } from '../helpers/procs.js';
import { DIST, fill01, NodeChild } from '../helpers/state.js';
import { PERL } from '../helpers/supervisor.js';

const cleanups = cleanupAfterEach({ marker: MARKER });

function stateDir(): string {
  const dir = tmpDir('custody-lock-');
  cleanups.push(() => dir.cleanup());
  return join(dir.path, 'state');
}

/** Opens and closes a supervisor on it: the dir is free again, or this throws why not. */
async function openClose(dir: string): Promise<void> {
  await (await Supervisor.open({ stateDir: dir, onEvent: () => {} })).supervisor.close();
}

/** A state dir a supervisor has stamped and closed. */
async function stamped(): Promise<string> {
  const dir = stateDir();
  await openClose(dir);
  return dir;
}

/** A child that opens and closes a supervisor on command: "open" answers held or the error, "close" answers closed. */
function opener(dir: string, backendName: string): NodeChild {
  const child = new NodeChild(
    `
    const { Supervisor } = await import(${JSON.stringify(DIST)});
    const { createInterface } = await import('node:readline');
    let sup = null;
    for await (const line of createInterface({ input: process.stdin })) {
      if (line === 'open') {
        try {
          ({ supervisor: sup } = await Supervisor.open({ stateDir: ${JSON.stringify(dir)}, onEvent: () => {} }));
          console.log('held');
        } catch (e) {
          console.log(JSON.stringify({ code: e.code, holderPid: e.holderPid ?? null, message: e.message }));
        }
      } else if (line === 'close') {
        if (sup) await sup.close();
        sup = null;
        console.log('closed');
      }
    }`,
    backendName,
  );
  cleanups.push(() => child.end());
  return child;
}

/** Both children try to open at once, `rounds` times; returns how each round went. */
async function race(a: NodeChild, b: NodeChild, rounds: number) {
  const outcomes = { aHeld: 0, bHeld: 0, both: 0, neither: 0, misnamed: [] as string[] };
  for (let i = 0; i < rounds; i++) {
    a.send('open');
    b.send('open');
    const [ra, rb] = await Promise.all([a.next(), b.next()]);
    if (ra === 'held' && rb === 'held') outcomes.both++;
    else if (ra === 'held') outcomes.aHeld++;
    else if (rb === 'held') outcomes.bHeld++;
    else outcomes.neither++;
    for (const [r, holder] of [
      [ra, b.pid],
      [rb, a.pid],
    ] as const) {
      if (r === 'held') continue;
      const e = JSON.parse(r);
      if (e.code !== 'ERR_CUSTODY_STATE_LOCKED' || e.holderPid !== holder) outcomes.misnamed.push(r);
    }
    await Promise.all([a.ask('close'), b.ask('close')]);
  }
  return outcomes;
}

/** Until a process that is not our child has been reaped by whoever is its parent now (bounded). */
async function settleGone(pid: number): Promise<void> {
  for (let i = 0; i < 500 && procStat(pid) !== null; i++) await new Promise((r) => setTimeout(r, 10));
}

const nativeLoads = process.platform === 'linux' && 'addon' in loadAddon();

describe(`the state dir lock (${backend.name})`, () => {
  it('two processes racing to open it 200 times: exactly one holds it each time, the other is told who', {
    timeout: 240_000,
  }, async () => {
    const dir = stateDir();
    const a = opener(dir, backend.name);
    const b = opener(dir, backend.name);
    const r = await race(a, b, 200);
    expect(r.both).toBe(0);
    expect(r.neither).toBe(0);
    expect(r.misnamed).toEqual([]);
    expect(r.aHeld + r.bHeld).toBe(200);
    console.log(
      `${backend.name}: 200 racing opens: ${r.aHeld} won by one process, ${r.bHeld} by the other, never both`,
    );
    // Released each time: nothing but the stamp, the lock and the current record is left.
    expect(readdirSync(dir).filter((n) => !/^\.(custody|lock(\.\d+)?)$/.test(n))).toEqual([]);
  });

  it('a js and a native supervisor exclude each other as two of one kind do', { timeout: 120_000 }, async (ctx) => {
    ctx.skip(!nativeLoads, 'needs the native addon: one of the two racers runs on it');
    const dir = stateDir();
    const r = await race(opener(dir, 'native'), opener(dir, 'js'), 50);
    expect(r).toMatchObject({ both: 0, neither: 0, misnamed: [] });
  });

  it('takes over from a holder killed with SIGKILL, which never released it', async () => {
    const dir = stateDir();
    const holder = opener(dir, backend.name);
    expect(await holder.ask('open')).toBe('held');
    await expect(Supervisor.open({ stateDir: dir })).rejects.toMatchObject({
      code: 'ERR_CUSTODY_STATE_LOCKED',
      holderPid: holder.pid,
    });
    holder.child.kill('SIGKILL');
    await holder.exited;
    await openClose(dir);
  });

  it('keeps out, and is kept out by, a holder of custody 0.1 (native: flock and record; js: the record)', async () => {
    // Stamped and closed; then a 0.1 supervisor opens it.
    const dir = await stamped();
    const lock = join(dir, '.lock');
    const flocker = cpSpawn(
      PERL,
      [
        '-e',
        'open(my $f, "+<", $ARGV[0]) or die; flock($f, 6) or die "busy"; $| = 1; print "ready\\n"; sleep 300',
        lock,
        MARKER,
      ],
      {
        stdio: ['ignore', 'pipe', 'ignore'],
      },
    );
    cleanups.push(() => killAndWait(flocker));
    await untilReady(flocker.stdout!);
    const id = inspect(flocker.pid!);
    writeFileSync(lock, fill01('lock-held', { PID: id.pid, START_TICKS: id.startTicks }));
    await expect(Supervisor.open({ stateDir: dir })).rejects.toMatchObject({
      code: 'ERR_CUSTODY_STATE_LOCKED',
      holderPid: flocker.pid,
    });
    // The 0.1 js backend could not flock: its record alone holds the dir.
    await killAndWait(flocker);
    const recorder = cpSpawn(PERL, ['-e', 'sleep 300', MARKER], { stdio: 'ignore' });
    cleanups.push(() => killAndWait(recorder));
    const rid = inspect(recorder.pid!);
    writeFileSync(lock, fill01('lock-held', { PID: rid.pid, START_TICKS: rid.startTicks }));
    await expect(Supervisor.open({ stateDir: dir })).rejects.toMatchObject({
      code: 'ERR_CUSTODY_STATE_LOCKED',
      holderPid: recorder.pid,
    });
    // The same pid with other start ticks is another process: that holder is gone.
    writeFileSync(lock, fill01('lock-held', { PID: rid.pid, START_TICKS: rid.startTicks + 1 }));
    const { supervisor } = await Supervisor.open({ stateDir: dir, onEvent: () => {} });
    try {
      // What a 0.1 opener reads in .lock: this holder's pid and start ticks, alive.
      const record = JSON.parse(readFileSync(lock, 'utf8'));
      expect(record).toMatchObject({ pid: process.pid, startTicks: inspect(process.pid).startTicks });
      // And a 0.1 native opener's flock fails while the native backend holds it.
      let flockFails: boolean;
      try {
        execFileSync(PERL, ['-e', 'open(my $f, "+<", $ARGV[0]) or die; flock($f, 6) or exit 3', lock]);
        flockFails = false;
      } catch (err) {
        flockFails = (err as { status: number }).status === 3;
      }
      expect(flockFails).toBe(backend.name === 'native');
    } finally {
      await supervisor.close();
    }
    expect(readFileSync(lock, 'utf8')).toBe('');
  });

  it('a holder record it cannot prove gone keeps the dir held: another PID namespace, or an unreadable record', async () => {
    const dir = await stamped();
    const top = () =>
      readdirSync(dir)
        .filter((n) => /^\.lock\.\d+$/.test(n))
        .sort((x, y) => Number(x.slice(6)) - Number(y.slice(6)))
        .at(-1)!;
    const self = inspect(process.pid);
    // Pid 1 of another namespace may well run: nothing here can tell.
    writeFileSync(join(dir, top()), JSON.stringify({ pid: 1, startTicks: 5, bootId: self.bootId, pidNs: 1 }));
    await expect(Supervisor.open({ stateDir: dir })).rejects.toMatchObject({
      code: 'ERR_CUSTODY_STATE_LOCKED',
      holderPid: 1,
      message: expect.stringMatching(/another PID namespace/),
    });
    writeFileSync(join(dir, top()), '{"pid": 1, "startTi');
    await expect(Supervisor.open({ stateDir: dir })).rejects.toMatchObject({
      code: 'ERR_CUSTODY_STATE_LOCKED',
      message: expect.stringMatching(/unreadable; remove it/),
    });
    // Another boot: whatever ran then is gone.
    writeFileSync(
      join(dir, top()),
      JSON.stringify({ pid: 1, startTicks: 5, bootId: '00000000-0000-0000-0000-000000000000', pidNs: 1 }),
    );
    await openClose(dir);
  });

  it('a .lock that is a FIFO, a device or a symlink is a custody error, never a hang or a raw errno', async () => {
    const dir = await stamped();
    const lock = join(dir, '.lock');
    const elsewhere = join(dir, '..', 'target');
    writeFileSync(elsewhere, 'not a lock');
    const kinds: Array<[string, () => void]> = [
      ['a FIFO', () => execFileSync('mkfifo', ['-m', '600', lock])],
      ['a symlink (never followed)', () => symlinkSync(elsewhere, lock)],
    ];
    if (isRoot()) kinds.push(['a character device', () => execFileSync('mknod', ['-m', '600', lock, 'c', '1', '3'])]);
    for (const [kind, make] of kinds) {
      unlinkSync(lock);
      make();
      const err = await Supervisor.open({ stateDir: dir }).catch((e) => e);
      expect([kind, err.code, err.message]).toEqual([
        kind,
        'ERR_CUSTODY_UNSAFE_PATH',
        `${lock} is ${kind}; custody's lock must be a regular file`,
      ]);
    }
    expect(readFileSync(elsewhere, 'utf8')).toBe('not a lock');
  });

  it("one process holds a dir once: a second supervisor in it is refused, and the first one's close frees it", async () => {
    const dir = stateDir();
    mkdirSync(dir, { mode: 0o700 });
    const { supervisor } = await Supervisor.open({ stateDir: dir, onEvent: () => {} });
    await expect(Supervisor.open({ stateDir: dir })).rejects.toMatchObject({
      code: 'ERR_CUSTODY_STATE_LOCKED',
      holderPid: process.pid,
    });
    await supervisor.close();
    await openClose(dir);
  });

  it('two copies of custody in one process (the ESM and the CommonJS build) exclude each other too', async () => {
    // A product that bundles one copy while a dependency brings another: two
    // module instances, one pid. The second must be refused while the first
    // holds the dir, and take it once the first has closed.
    const dir = stateDir();
    const child = new NodeChild(
      `
      const { createRequire } = await import('node:module');
      const esm = await import(${JSON.stringify(DIST)});
      const cjs = createRequire(import.meta.url)(${JSON.stringify(join(DIST, '..', 'cjs', 'index.js'))});
      const dir = ${JSON.stringify(dir)};
      const out = { distinct: esm.Supervisor !== cjs.Supervisor };
      const { supervisor } = await esm.Supervisor.open({ stateDir: dir, onEvent: () => {} });
      try {
        const second = await cjs.Supervisor.open({ stateDir: dir, onEvent: () => {} });
        out.second = 'held';
        await second.supervisor.close();
      } catch (e) {
        out.second = { code: e.code, holderPid: e.holderPid };
      }
      await supervisor.close();
      await (await cjs.Supervisor.open({ stateDir: dir, onEvent: () => {} })).supervisor.close();
      out.afterClose = 'held';
      out.pid = process.pid;
      console.log(JSON.stringify(out));`,
      backend.name,
    );
    cleanups.push(() => child.end());
    const out = JSON.parse((await child.next()) ?? 'null');
    expect(out).toEqual({
      distinct: true,
      second: { code: 'ERR_CUSTODY_STATE_LOCKED', holderPid: out.pid },
      afterClose: 'held',
      pid: out.pid,
    });
  });
  /**
   * A holder that hands its lock fd to a process of its own (as its fork does
   * between clone and exec), then dies by SIGKILL: the fd's holder keeps the
   * flock. The perl holding it sleeps `seconds`.
   */
  async function holderWithHeir(dir: string, seconds: number): Promise<number> {
    const holder = new NodeChild(
      `
      const { Supervisor } = await import(${JSON.stringify(DIST)});
      const { readdirSync, readlinkSync } = await import('node:fs');
      const { spawn } = await import('node:child_process');
      await Supervisor.open({ stateDir: ${JSON.stringify(dir)}, onEvent: () => {} });
      const fd = Number(readdirSync('/proc/self/fd').find((n) => { try { return readlinkSync('/proc/self/fd/' + n).endsWith('/.lock'); } catch { return false; } }));
      const heir = spawn(${JSON.stringify(PERL)}, ['-e', 'select(undef, undef, undef, $ARGV[0])', '${seconds}', ${JSON.stringify(MARKER)}], { stdio: ['ignore', 'ignore', 'ignore', fd], detached: true });
      console.log(String(heir.pid));`,
      'native',
    );
    cleanups.push(() => holder.end());
    const heir = Number(await holder.next());
    cleanups.push(() => endOwn([heir]));
    holder.child.kill('SIGKILL');
    await holder.exited;
    return heir;
  }

  it("a dead holder's fd kept by another process: the flock is waited for, bounded, never taken from it", {
    timeout: 30_000,
  }, async (ctx) => {
    ctx.skip(backend.name !== 'native', 'only the native backend flocks .lock');
    const dir = await stamped();
    // Released within the bound: the newcomer waits, then holds it.
    const brief = await holderWithHeir(dir, 0.8);
    expect(procStat(brief)?.[0]).toMatch(/[SR]/);
    // The wait is on timers: the rest of the process runs meanwhile (a blocking wait lets no tick through).
    let ticks = 0;
    const ticker = setInterval(() => ticks++, 20);
    try {
      const waiting = openClose(dir);
      // Meanwhile the dir is this process's: a second open here is refused at once, not let in behind the first.
      await expect(Supervisor.open({ stateDir: dir })).rejects.toMatchObject({
        code: 'ERR_CUSTODY_STATE_LOCKED',
        holderPid: process.pid,
      });
      await waiting;
    } finally {
      clearInterval(ticker);
    }
    expect(ticks).toBeGreaterThan(5);
    expect(goneFrom(brief)).toBe(true);
    // Kept past it: refused, and told why; the heir is not touched.
    const stubborn = await holderWithHeir(dir, 300);
    await expect(Supervisor.open({ stateDir: dir })).rejects.toMatchObject({
      code: 'ERR_CUSTODY_STATE_LOCKED',
      message: expect.stringMatching(/inherited from pid \d+, which is gone/),
    });
    expect(procStat(stubborn)?.[0]).toMatch(/[SR]/);
    process.kill(stubborn, 'SIGKILL');
    await settleGone(stubborn);
    await openClose(dir);
  });
});
