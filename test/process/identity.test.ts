import { execFileSync, spawn as cpSpawn } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync, symlinkSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { capabilities, inspect, spawn, sweep, verify } from '../../src/index.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { exited, killAndWait, procStat, sleeper, tmpDir, unusedPid, waitFor } from '../helpers/procs.js';

expectNoLeaks();

describe(`inspect (${backend.name})`, () => {
  it('matches an independent read of a live child', async () => {
    const child = sleeper(30);
    try {
      await waitFor(() => procStat(child.pid!)?.[0] === 'S', 5000, 'sleep to start');
      const id = inspect(child.pid!);
      const ps = execFileSync('ps', ['-o', 'ppid=,ruid=,stat=', '-p', String(child.pid)], { encoding: 'utf8' })
        .trim()
        .split(/\s+/);
      const exe = execFileSync('stat', ['-L', '-c', '%d %i', `/proc/${child.pid}/exe`], { encoding: 'utf8' })
        .trim()
        .split(' ');
      const cmdline = readFileSync(`/proc/${child.pid}/cmdline`, 'utf8');
      const boot = readFileSync('/proc/sys/kernel/random/boot_id', 'utf8').trim();
      const starttime = execFileSync('sh', ['-c', `cut -d')' -f2- /proc/${child.pid}/stat | awk '{print $20}'`], {
        encoding: 'utf8',
      }).trim();
      expect(id.pid).toBe(child.pid);
      expect(id.ppid).toBe(Number(ps[0]));
      expect(id.uid).toBe(Number(ps[1]));
      expect(id.state).toBe(ps[2]![0]);
      expect(id.exe).toEqual({ dev: Number(exe[0]), ino: Number(exe[1]) });
      expect(id.argv).toEqual(cmdline.split('\0').slice(0, -1));
      expect(id.argv).toEqual(['sleep', '30']);
      expect(id.bootId).toBe(boot);
      expect(id.startTicks).toBe(Number(starttime));
      if (capabilities().pidfsId) expect(id.pidfsId).toMatch(/^\d+$/);
      else expect(id.pidfsId).toBeNull();
    } finally {
      await killAndWait(child);
    }
  });

  it('reads this process and a kernel thread (no exe, no argv)', () => {
    expect(inspect(process.pid).argv[0]).toBe(process.argv0);
    const kthreadd = procStat(2);
    if (kthreadd && readFileSync('/proc/2/stat', 'utf8').includes('(kthreadd)')) {
      const id = inspect(2);
      expect(id.exe).toBeNull();
      expect(id.argv).toEqual([]);
    }
  });

  it('reports a zombie as state Z with an empty argv, and verify calls it gone', () => {
    const h = spawn('true');
    try {
      // No turn of the event loop happens here, so nobody reaps it yet.
      const deadline = Date.now() + 5000;
      while (procStat(h.pid)?.[0] !== 'Z' && Date.now() < deadline);
      const id = inspect(h.pid);
      expect(id.state).toBe('Z');
      expect(id.argv).toEqual([]);
      expect(verify({ ...id, state: 'S' }, id).verdict).toBe('gone');
    } finally {
      h.close();
    }
  });

  // /proc files are read through a 32 KiB scratch buffer, and again whole when
  // one fills it: an argv just under, exactly at and over that size must come
  // back byte for byte, to inspect() and to sweep's argv-first scan. Over by
  // two, not one: a cmdline cut by one byte loses only its final NUL, which
  // both readers forgive.
  it.each([32 * 1024 - 1, 32 * 1024, 32 * 1024 + 2, 100 * 1024])(
    'reads a %i-byte cmdline whole, for inspect and for an exact-argv sweep',
    async (bytes) => {
      const head = ['/bin/sh', '-c', 'read x', 'sh'];
      const used = head.reduce((n, a) => n + a.length + 1, 0);
      // The last argument fills the cmdline to `bytes`, its NUL included; a marker keeps it ours alone.
      const mark = `custody-big-argv-${process.pid}-${bytes}-`;
      const argv = [...head, mark.padEnd(bytes - used - 1, 'x')];
      const child = cpSpawn(argv[0]!, argv.slice(1), { stdio: ['pipe', 'ignore', 'ignore'] });
      try {
        await waitFor(() => procStat(child.pid!)?.[0] === 'S', 5000, 'sh to wait on its stdin');
        expect(readFileSync(`/proc/${child.pid}/cmdline`).length).toBe(bytes);
        expect(inspect(child.pid!).argv).toEqual(argv);
        const swept = await sweep({ argv, dryRun: true });
        expect(swept.matched.map((m) => m.pid)).toEqual([child.pid]);
      } finally {
        await killAndWait(child);
      }
    },
  );

  it('throws ESRCH for a pid with no process', () => {
    expect(() => inspect(unusedPid())).toThrow(expect.objectContaining({ code: 'ESRCH' }));
  });

  it.each([0, -1, 1.5, Number.NaN, Infinity, 2 ** 31, '12', null, undefined])(
    'refuses pid %s with ERR_CUSTODY_INVALID_ARG',
    (bad) => {
      expect(() => inspect(bad as number)).toThrow(expect.objectContaining({ code: 'ERR_CUSTODY_INVALID_ARG' }));
    },
  );

  it('discards the reads of a process that died mid-read (ESRCH, never a mixed identity)', async () => {
    // A proc root we control, whose stat is a FIFO: the read blocks until the
    // helper below has killed and reaped the real process, then answers with
    // another process's stat, as a reused pid would.
    const dir = tmpDir();
    const victim = cpSpawn('sh', ['-c', 'sleep 30 & echo $!; wait'], { stdio: ['ignore', 'pipe', 'ignore'] });
    try {
      const pid = Number(await new Promise<string>((r) => victim.stdout!.once('data', (d) => r(String(d)))));
      const fake = join(dir.path, String(pid));
      mkdirSync(fake);
      execFileSync('mkfifo', [join(fake, 'stat')]);
      writeFileSync(join(fake, 'cmdline'), 'sleep\u000030\u0000');
      writeFileSync(join(fake, 'status'), `Name:\tsleep\nTgid:\t${pid}\nUid:\t0\t0\t0\t0\n`);
      symlinkSync(`/proc/${pid}/exe`, join(fake, 'exe'));
      const impostor = readFileSync('/proc/self/stat', 'utf8').replace(/^\d+/, String(pid));
      // The native backend reads stat twice (before and after the other
      // reads, to see an exec), under its pidfd: its first read returns only
      // after the real process is dead and reaped (by its parent sh), with
      // the impostor's text, and so does the second. The js backend reads
      // stat twice too, to compare start times: the first read gets the real
      // text, the second, after the death, the impostor's.
      const stat = join(fake, 'stat');
      // Bounded (5 s): a pid reused before the first poll must not keep the FIFO, and so inspect, blocked.
      const killReap = `kill -9 ${pid}; for i in $(seq 500); do kill -0 ${pid} 2>/dev/null || break; sleep 0.01; done`;
      const script =
        backend.name === 'native'
          ? `exec 3>"$2"; ${killReap}; printf '%s' "$1" >&3; exec 3>&-; timeout 5 sh -c 'printf "%s" "$0" > "$1"' "$1" "$2"`
          : `cat /proc/${pid}/stat > "$2"; ${killReap}; timeout 5 sh -c 'printf "%s" "$0" > "$1"' "$1" "$2"`;
      const helper = cpSpawn('sh', ['-c', script, 'helper', impostor, stat], { stdio: 'ignore' });
      // Wait for the real process to exist as the helper starts, then read:
      // the blocking FIFO read happens inside inspect.
      const run = () => backend.inspect(pid, dir.path);
      // The js backend reads synchronously too: both block in the FIFO open
      // until the helper writes, by which time the real process is gone.
      let err: unknown;
      try {
        run();
      } catch (e) {
        err = e;
      }
      await exited(helper);
      expect(err).toMatchObject({ code: 'ESRCH' });
      // Native: the pidfd was opened while the process lived (the FIFO open
      // comes after it); it is the re-check that catches the death.
      if (backend.name === 'native') expect(err).toMatchObject({ syscall: 'pidfd_send_signal' });
    } finally {
      await killAndWait(victim);
      dir.cleanup();
    }
  });
});

describe(`verify (${backend.name})`, () => {
  const children: Array<ReturnType<typeof sleeper>> = [];
  afterAll(async () => {
    for (const c of children) await killAndWait(c);
  });

  async function live(seconds = 30) {
    const child = sleeper(seconds);
    children.push(child);
    await waitFor(() => procStat(child.pid!)?.[0] === 'S', 5000, 'sleep');
    return { child, id: inspect(child.pid!) };
  }

  it('ok for the same live process', async () => {
    const { id } = await live();
    expect(verify(id)).toEqual({ verdict: 'ok' });
    expect(verify(id, inspect(id.pid))).toEqual({ verdict: 'ok' });
  });

  it('gone once the process has exited', async () => {
    const { child, id } = await live();
    await killAndWait(child);
    expect(verify(id)).toEqual({ verdict: 'gone' });
    expect(verify(id, null)).toEqual({ verdict: 'gone' });
  });

  it('rebooted when the boot id differs', async () => {
    const { id } = await live();
    expect(verify({ ...id, bootId: '00000000-0000-0000-0000-000000000000' })).toEqual({
      verdict: 'rebooted',
      field: 'bootId',
    });
  });

  it('unrecorded, naming the field, when bootId or startTicks was never recorded', async () => {
    const { id } = await live();
    const { bootId: _b, ...noBoot } = id;
    const { startTicks: _s, ...noTicks } = id;
    expect(verify(noBoot)).toEqual({ verdict: 'unrecorded', field: 'bootId' });
    expect(verify(noTicks)).toEqual({ verdict: 'unrecorded', field: 'startTicks' });
  });

  it('reused when start ticks differ, or the pidfs id where both have one', async () => {
    const { id } = await live();
    expect(verify({ ...id, startTicks: id.startTicks - 1 })).toEqual({ verdict: 'reused', field: 'startTicks' });
    if (id.pidfsId) {
      // Same start ticks (a reuse within one clock tick) and only the pidfs id tells.
      expect(verify({ ...id, pidfsId: String(BigInt(id.pidfsId) + 1n) })).toEqual({
        verdict: 'reused',
        field: 'pidfsId',
      });
    }
  });

  it('mismatch on exe when the same process exec()s another program', async () => {
    const child = cpSpawn('sh', ['-c', 'read line; exec sleep 30'], { stdio: ['pipe', 'ignore', 'ignore'] });
    children.push(child);
    await waitFor(() => procStat(child.pid!)?.[0] === 'S', 5000, 'sh');
    const before = inspect(child.pid!);
    child.stdin!.write('go\n');
    await waitFor(() => inspect(child.pid!).argv[0] === 'sleep', 5000, 'exec');
    expect(verify(before)).toEqual({ verdict: 'mismatch', field: 'exe' });
  });

  it('mismatch on argv when the same program is exec()d with other arguments', async () => {
    const child = cpSpawn('sh', ['-c', 'read line; exec sh -c "read more" second'], {
      stdio: ['pipe', 'ignore', 'ignore'],
    });
    children.push(child);
    await waitFor(() => procStat(child.pid!)?.[0] === 'S', 5000, 'sh');
    const before = inspect(child.pid!);
    child.stdin!.write('go\n');
    await waitFor(() => inspect(child.pid!).argv.includes('second'), 5000, 'exec');
    expect(verify(before)).toEqual({ verdict: 'mismatch', field: 'argv' });
  });

  it('refuses a record that is not an identity', () => {
    expect(() => verify(null as never)).toThrow(expect.objectContaining({ code: 'ERR_CUSTODY_INVALID_ARG' }));
    expect(() => verify({ pid: -4 })).toThrow(expect.objectContaining({ code: 'ERR_CUSTODY_INVALID_ARG' }));
  });
});
