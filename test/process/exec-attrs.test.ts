// Exec attributes on spawn(): a real program (sh, with its builtins only, so
// the process that reads is the one spawned) reads its own /proc/self/status,
// limits and oom_score_adj and prints them, so what is
// checked is what the kernel says the program got. A step the kernel refuses
// leaves no process, and the program never ran: the marker file it would
// write is absent.
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { capabilities, spawn, type SpawnOptions } from '../../src/index.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { isRoot, tmpDir } from '../helpers/procs.js';

expectNoLeaks();

const NOBODY = 65534;
const native = backend.name === 'native';

/** sh printing its own status, limits and oom_score_adj, reading them itself (no cat: another process). */
const READ_SELF = [
  '-c',
  'for f in status limits oom_score_adj; do while IFS= read -r l; do printf "%s\\n" "$l"; done </proc/self/$f; done',
];

interface Seen {
  uid: string;
  gid: string;
  groups: string;
  umask: string;
  noNewPrivs: string;
  oomScoreAdj: number;
  limits: Record<string, [string, string]>;
}

/** What the program printed, parsed. */
function parseSelf(text: string): Seen {
  const field = (name: string) => new RegExp(`^${name}:[ \\t]*(.*)$`, 'm').exec(text)?.[1]?.trim() ?? '';
  const limits: Record<string, [string, string]> = {};
  for (const m of text.matchAll(/^(Max [a-z ]+?)\s{2,}(\S+)\s+(\S+)/gm)) limits[m[1]!] = [m[2]!, m[3]!];
  const last = text.trim().split('\n').pop() ?? '';
  return {
    uid: field('Uid'),
    gid: field('Gid'),
    groups: field('Groups'),
    umask: field('Umask'),
    noNewPrivs: field('NoNewPrivs'),
    oomScoreAdj: Number(last),
    limits,
  };
}

async function runSelf(options: SpawnOptions): Promise<Seen> {
  const h = spawn('/bin/sh', READ_SELF, { ...options, cwd: '/', stdio: ['ignore', 'pipe', 'inherit'] });
  let out = '';
  for await (const chunk of h.stdout) out += String(chunk);
  expect(await h.exited).toEqual({ code: 0, signal: null });
  return parseSelf(out);
}

/** This process has CAP_SYS_RESOURCE (raise a hard limit, lower oom_score_adj below its floor). */
function hasSysResource(): boolean {
  const eff = /^CapEff:\s*([0-9a-f]+)$/m.exec(readFileSync('/proc/self/status', 'utf8'))?.[1] ?? '0';
  return (BigInt(`0x${eff}`) & (1n << 24n)) !== 0n;
}

const ownOom = () => Number(readFileSync('/proc/self/oom_score_adj', 'utf8').trim());
const nrOpen = () => Number(readFileSync('/proc/sys/fs/nr_open', 'utf8').trim());

let restoreOom: number | null = null;
afterEach(() => {
  if (restoreOom !== null) writeFileSync('/proc/self/oom_score_adj', String(restoreOom));
  restoreOom = null;
});

describe(`exec attributes on spawn() (${backend.name})`, () => {
  it('capabilities() says which it applies', () => {
    const exec = capabilities().exec;
    expect(exec).toMatchObject({ runAs: true, umask: true, oomScoreAdj: true, noNewPrivileges: native });
    expect(exec.rlimits).toEqual(
      native
        ? ['nofile', 'memlock', 'core', 'nproc', 'as', 'fsize', 'stack', 'cpu']
        : ['nofile', 'memlock', 'core', 'as', 'fsize', 'stack', 'cpu'],
    );
    if (!native) expect(exec.reason).toMatch(/noNewPrivileges/);
  });

  it('the program runs with the umask, limits, oom_score_adj (and no_new_privs) given', async () => {
    const seen = await runSelf({
      umask: 0o027,
      rlimits: { nofile: [512, 1024], memlock: 65536, core: 0, cpu: [Number.POSITIVE_INFINITY, Infinity] },
      oomScoreAdj: 321,
      ...(native ? { noNewPrivileges: true } : {}),
    });
    expect(seen.umask).toBe('0027');
    expect(seen.oomScoreAdj).toBe(321);
    expect(seen.noNewPrivs).toBe(native ? '1' : '0');
    expect(seen.limits['Max open files']).toEqual(['512', '1024']);
    expect(seen.limits['Max locked memory']).toEqual(['65536', '65536']);
    expect(seen.limits['Max core file size']).toEqual(['0', '0']);
    expect(seen.limits['Max cpu time']).toEqual(['unlimited', 'unlimited']);
  });

  it('runAs: the program runs as that uid and gid, with those groups (native) or none (js)', async (t) => {
    t.skip(!isRoot(), 'runAs to another uid needs root');
    const groups = native ? [NOBODY - 1, 100] : [];
    const seen = await runSelf({ runAs: { uid: NOBODY, gid: NOBODY, groups }, umask: 0o077, oomScoreAdj: 500 });
    expect(seen.uid.split(/\s+/)).toEqual(Array(4).fill(String(NOBODY)));
    expect(seen.gid.split(/\s+/)).toEqual(Array(4).fill(String(NOBODY)));
    expect(seen.groups.split(/\s+/).filter(Boolean).map(Number).sort()).toEqual([...groups].sort());
    expect([seen.umask, seen.oomScoreAdj]).toEqual(['0077', 500]);
  });

  it("oomScoreAdj is written whenever given: the agent's own never reaches the program, and the agent keeps it", async () => {
    const before = ownOom();
    // At -1000 where this process may go there (CAP_SYS_RESOURCE); else well above what the program is given.
    const agent = hasSysResource() ? -1000 : 700;
    writeFileSync('/proc/self/oom_score_adj', String(agent));
    restoreOom = before;
    const given = hasSysResource() ? 0 : 100;
    expect((await runSelf({ oomScoreAdj: given })).oomScoreAdj).toBe(given);
    expect(ownOom()).toBe(agent);
    // Not given: inherited, as child_process does.
    expect((await runSelf({})).oomScoreAdj).toBe(agent);
  });

  it('a step the kernel refuses (nofile above fs.nr_open) fails the spawn, and the program never runs', async () => {
    const dir = tmpDir();
    try {
      const marker = join(dir.path, 'ran');
      const options: SpawnOptions = { rlimits: { nofile: nrOpen() + 1 } };
      if (native) {
        // The step's errno and syscall are the spawn's error, thrown once the child is reaped.
        expect(() => spawn('sh', ['-c', `echo ran > ${marker}`], options)).toThrow(
          expect.objectContaining({ code: 'EPERM', errno: -1, syscall: 'prlimit64' }),
        );
      } else {
        // The js backend's exec wrapper fails the step and ends with 126 before the program.
        const h = spawn('sh', ['-c', `echo ran > ${marker}`], options);
        expect(await h.exited).toEqual({ code: 126, signal: null });
      }
      expect(existsSync(marker)).toBe(false);
    } finally {
      dir.cleanup();
    }
  });

  it('lowering oom_score_adj below its floor without CAP_SYS_RESOURCE fails the spawn (EACCES), nothing runs', async (t) => {
    t.skip(hasSysResource(), 'this process has CAP_SYS_RESOURCE: it may lower it');
    const dir = tmpDir();
    try {
      const marker = join(dir.path, 'ran');
      const options: SpawnOptions = { oomScoreAdj: -1000 };
      if (native) {
        expect(() => spawn('sh', ['-c', `echo ran > ${marker}`], options)).toThrow(
          expect.objectContaining({ code: 'EACCES', syscall: 'write', path: '/proc/self/oom_score_adj' }),
        );
      } else {
        expect(await spawn('sh', ['-c', `echo ran > ${marker}`], options).exited).toEqual({
          code: 126,
          signal: null,
        });
      }
      expect(existsSync(marker)).toBe(false);
    } finally {
      dir.cleanup();
    }
  });

  it('a limit above the hard one without CAP_SYS_RESOURCE fails the spawn (EPERM), and nothing runs', async (t) => {
    t.skip(hasSysResource(), 'this process has CAP_SYS_RESOURCE: it may raise a hard limit');
    const hard = /^Max open files\s+\S+\s+(\S+)/m.exec(readFileSync('/proc/self/limits', 'utf8'))?.[1];
    t.skip(hard === undefined || hard === 'unlimited', 'no finite hard nofile limit here');
    const dir = tmpDir();
    try {
      const marker = join(dir.path, 'ran');
      const options: SpawnOptions = { rlimits: { nofile: [1024, Number(hard) + 1] } };
      if (native) {
        expect(() => spawn('sh', ['-c', `echo ran > ${marker}`], options)).toThrow(
          expect.objectContaining({ code: 'EPERM', syscall: 'prlimit64' }),
        );
      } else {
        expect(await spawn('sh', ['-c', `echo ran > ${marker}`], options).exited).toEqual({ code: 126, signal: null });
      }
      expect(existsSync(marker)).toBe(false);
    } finally {
      dir.cleanup();
    }
  });

  it('runAs without the privilege fails the spawn (EPERM), and nothing runs', async (t) => {
    t.skip(isRoot(), 'root may take any uid (scripts/test-unprivileged.sh runs this as nobody)');
    const dir = tmpDir();
    try {
      const marker = join(dir.path, 'ran');
      const uid = process.getuid!() === NOBODY ? NOBODY - 1 : NOBODY;
      expect(() => spawn('sh', ['-c', `echo ran > ${marker}`], { runAs: { uid, gid: uid } })).toThrow(
        expect.objectContaining({ code: 'EPERM', syscall: native ? 'setgroups' : 'spawn' }),
      );
      expect(existsSync(marker)).toBe(false);
    } finally {
      dir.cleanup();
    }
  });

  it('bad input is ERR_CUSTODY_INVALID_ARG naming the field, before anything runs', () => {
    const cases: Array<[SpawnOptions, RegExp]> = [
      [{ umask: 0o1000 }, /umask/],
      [{ umask: 1.5 }, /umask/],
      [{ oomScoreAdj: 1001 }, /oomScoreAdj/],
      [{ oomScoreAdj: -1001 }, /oomScoreAdj/],
      [{ noNewPrivileges: 'yes' as unknown as boolean }, /noNewPrivileges/],
      [{ rlimits: { nofile: [5, 4] } }, /rlimits\.nofile/],
      [{ rlimits: { nofile: -1 } }, /rlimits\.nofile/],
      [{ rlimits: { nofile: Number.NaN } }, /rlimits\.nofile/],
      [{ rlimits: { stack: 2 ** 53 } }, /rlimits\.stack/],
      [{ rlimits: { nofiles: 5 } as never }, /rlimits.*nofiles.*nofile/],
      [{ runAs: { uid: -1, gid: 0 } }, /runAs\.uid/],
      [{ runAs: { uid: 0, gid: 2 ** 32 - 1 } }, /runAs\.gid/],
      [{ runAs: { uid: 0 } as never }, /runAs\.gid/],
      [{ runAs: { uid: 0, gid: 0, groups: [1, -2] } }, /runAs\.groups/],
      [{ runAs: { uid: 0, gid: 0, group: [] } as never }, /runAs.*group/],
    ];
    for (const [options, field] of cases) {
      expect(() => spawn('true', [], options), JSON.stringify(options)).toThrow(
        expect.objectContaining({ code: 'ERR_CUSTODY_INVALID_ARG', message: expect.stringMatching(field) }),
      );
    }
  });

  it('the js backend refuses what child_process and its wrapper cannot apply, before anything runs', (t) => {
    t.skip(native, 'the native child applies all of them');
    const hard = Number(/^Max open files\s+\S+\s+(\S+)/m.exec(readFileSync('/proc/self/limits', 'utf8'))?.[1]);
    const cases: SpawnOptions[] = [
      { noNewPrivileges: true },
      { rlimits: { nproc: 100 } },
      { rlimits: { memlock: 1000 } },
      { runAs: { uid: NOBODY, gid: NOBODY, groups: [100] } },
      { runAs: { uid: 2 ** 31, gid: NOBODY } },
      { runAs: { uid: NOBODY, gid: NOBODY }, oomScoreAdj: ownOom() - 1 },
      ...(Number.isFinite(hard) ? [{ runAs: { uid: NOBODY, gid: NOBODY }, rlimits: { nofile: hard + 1 } }] : []),
    ];
    for (const options of cases) {
      expect(() => spawn('true', [], options), JSON.stringify(options)).toThrow(
        expect.objectContaining({ code: 'ERR_CUSTODY_UNSUPPORTED' }),
      );
    }
  });
});
