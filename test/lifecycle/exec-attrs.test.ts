// Exec attributes through a launch: the instance runs as runAs.uid with its
// limits, the manifest records runAs so that a restarted agent's ownership
// rule still expects that uid (adopted, not quarantined), `custody ls` shows
// it; a step the kernel refuses fails the launch with nothing left (no
// process, no manifest, the program's marker unwritten); what a backend
// cannot apply is refused before anything exists.
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { parseCgroupV2Line } from '../../src/backend/procview.js';
import { type LaunchSpec, Supervisor } from '../../src/index.js';
import { expectedUid } from '../../src/process/ownership.js';
import { decodeManifest } from '../../src/state/manifest.js';
import { CGROUP_ROOT, CGROUP_SKIP, cgroupsBelow, expectNoCgroupsLeft } from '../helpers/cgroup.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { runCli } from '../helpers/cli.js';
import { isGone, isRoot, MARKER } from '../helpers/procs.js';
import { openSupervisor, PERL } from '../helpers/supervisor.js';

const cleanups = cleanupAfterEach({ marker: MARKER });
expectNoCgroupsLeft();

const NOBODY = 65534;
const native = backend.name === 'native';

/** A perl that sleeps, carrying the token and the suite's marker. */
const sleeper = (id: string, extra: Partial<LaunchSpec> = {}): LaunchSpec => ({
  id,
  command: PERL,
  args: (tok) => ['-e', 'sleep 60', '--', tok, MARKER],
  cwd: '/',
  ...extra,
});

async function supervisorCtx(cgroup = false) {
  const ctx = await openSupervisor(cgroup ? { cgroup: { root: CGROUP_ROOT } } : {});
  cleanups.push(() => ctx.dispose());
  return ctx;
}

const statusOf = (pid: number) => readFileSync(`/proc/${pid}/status`, 'utf8');
const limitOf = (pid: number, row: string) =>
  new RegExp(`^${row}\\s+(\\S+)\\s+(\\S+)`, 'm').exec(readFileSync(`/proc/${pid}/limits`, 'utf8'))?.slice(1);

describe(`exec attributes through launch (${backend.name})`, () => {
  it('runAs: the instance runs as that uid, recorded for recovery, adopted after an agent restart, shown by ls', async (t) => {
    t.skip(!isRoot(), 'runAs to another uid needs root');
    const ctx = await supervisorCtx();
    const inst = await ctx.supervisor.launch(
      sleeper('as-nobody', {
        runAs: { uid: NOBODY, gid: NOBODY },
        umask: 0o027,
        rlimits: { nofile: [256, 512] },
        oomScoreAdj: 250,
      }),
    );
    expect(inst.identity.uid).toBe(NOBODY);
    expect(statusOf(inst.pid)).toMatch(new RegExp(`^Uid:\\s+${NOBODY}\\s+${NOBODY}`, 'm'));
    expect(statusOf(inst.pid)).toMatch(/^Umask:\s+0027$/m);
    expect(limitOf(inst.pid, 'Max open files')).toEqual(['256', '512']);
    expect(readFileSync(`/proc/${inst.pid}/oom_score_adj`, 'utf8').trim()).toBe('250');
    const manifest = JSON.parse(readFileSync(join(ctx.stateDir, 'as-nobody', 'manifest.json'), 'utf8'));
    expect(manifest.runAs).toEqual({ uid: NOBODY, gid: NOBODY, groups: [] });

    const ls = await runCli(['ls', '--state-dir', ctx.stateDir, '--json']);
    expect(JSON.parse(ls.stdout).instances).toEqual([expect.objectContaining({ id: 'as-nobody', runAs: NOBODY })]);
    const inspected = await runCli(['inspect', String(inst.pid), '--json']);
    expect(JSON.parse(inspected.stdout)).toMatchObject({ pid: inst.pid, uid: NOBODY });
    const text = await runCli(['ls', '--state-dir', ctx.stateDir]);
    expect(text.stdout).toMatch(new RegExp(`^as-nobody\\s+running\\s+${inst.pid}\\s+${NOBODY}\\s+ok`, 'm'));

    // An agent restart: the ownership rule expects runAs.uid from the manifest, not ours.
    await ctx.supervisor.close();
    const { supervisor, report } = await Supervisor.open({ stateDir: ctx.stateDir });
    cleanups.push(() => supervisor.close());
    expect(report.adopted).toEqual([expect.objectContaining({ id: 'as-nobody', pid: inst.pid })]);
    expect(report.quarantined).toEqual([]);
    expect(await supervisor.stop('as-nobody', { graceMs: 5000 })).toMatchObject({ outcome: 'exited' });
    expect(isGone(inst.pid)).toBe(true);
  });

  it('a step the kernel refuses fails the launch: no process, no manifest, the program never ran', async () => {
    const ctx = await supervisorCtx();
    const marker = join(ctx.root, 'ran');
    const nrOpen = Number(readFileSync('/proc/sys/fs/nr_open', 'utf8').trim());
    const err = await ctx.supervisor
      .launch({
        id: 'refused',
        command: 'sh',
        args: (tok) => ['-c', `echo ran > ${marker}`, tok],
        rlimits: { nofile: nrOpen + 1 },
      })
      .catch((e: unknown) => e);
    // Native: the child's step, as an errno error. js: the exec wrapper's `ulimit` fails and it exits 126.
    expect(err).toMatchObject(
      native ? { code: 'EPERM', syscall: 'prlimit64' } : { code: 'ERR_CUSTODY_LAUNCH_EXITED', exitCode: 126 },
    );
    expect(existsSync(marker)).toBe(false);
    expect(ctx.supervisor.list()).toEqual([]);
    expect(readdirSync(ctx.stateDir).filter((n) => !n.startsWith('.'))).toEqual([]);
  });

  it('bad exec attributes are ERR_CUSTODY_INVALID_ARG naming the field; what the backend cannot do is refused; nothing exists', async () => {
    const ctx = await supervisorCtx();
    await expect(ctx.supervisor.launch(sleeper('bad', { umask: 0o1000 }))).rejects.toMatchObject({
      code: 'ERR_CUSTODY_INVALID_ARG',
      message: expect.stringContaining('LaunchSpec.umask'),
    });
    await expect(ctx.supervisor.launch(sleeper('bad', { rlimits: { nofile: [2, 1] } }))).rejects.toMatchObject({
      code: 'ERR_CUSTODY_INVALID_ARG',
      message: expect.stringContaining('LaunchSpec.rlimits.nofile'),
    });
    await expect(ctx.supervisor.launch(sleeper('bad', { runAs: { uid: 1 } as never }))).rejects.toMatchObject({
      code: 'ERR_CUSTODY_INVALID_ARG',
      message: expect.stringContaining('LaunchSpec.runAs.gid'),
    });
    if (!native) {
      await expect(ctx.supervisor.launch(sleeper('bad', { noNewPrivileges: true }))).rejects.toMatchObject({
        code: 'ERR_CUSTODY_UNSUPPORTED',
      });
    }
    expect(readdirSync(ctx.stateDir).filter((n) => !n.startsWith('.'))).toEqual([]);
    expect(existsSync(join(ctx.stateDir, '.logs', 'bad'))).toBe(false);
  });

  it('in an instance cgroup: native joins it first, then drops to runAs.uid; js refuses runAs there; no cgroup left', async (t) => {
    t.skip(CGROUP_SKIP !== null, CGROUP_SKIP ?? '');
    t.skip(!isRoot(), 'runAs to another uid needs root');
    const ctx = await supervisorCtx(true);
    const spec = sleeper('caged', { runAs: { uid: NOBODY, gid: NOBODY }, rlimits: { nofile: 128 } });
    const mine = () => cgroupsBelow(CGROUP_ROOT).filter((d) => d.includes('/caged.'));
    if (!native) {
      // The wrapper that writes cgroup.procs would run as nobody (child_process drops the uid first).
      await expect(ctx.supervisor.launch(spec)).rejects.toMatchObject({ code: 'ERR_CUSTODY_UNSUPPORTED' });
      expect(mine()).toEqual([]);
      return;
    }
    const inst = await ctx.supervisor.launch(spec);
    expect(inst.cgroup).not.toBeNull();
    // Joined as root before the uid drop: /proc/<pid>/cgroup names the instance's cgroup.
    const node = parseCgroupV2Line(readFileSync(`/proc/${inst.pid}/cgroup`, 'utf8'));
    expect(node && inst.cgroup?.endsWith(node)).toBe(true);
    expect(inst.identity.uid).toBe(NOBODY);
    expect(limitOf(inst.pid, 'Max open files')).toEqual(['128', '128']);
    await ctx.supervisor.stop('caged', { graceMs: 5000 });
    expect(mine()).toEqual([]);
    // A refused step in a cgroup: the abandon removes the cgroup it made.
    const nrOpen = Number(readFileSync('/proc/sys/fs/nr_open', 'utf8').trim());
    await expect(ctx.supervisor.launch({ ...spec, rlimits: { nofile: nrOpen + 1 } })).rejects.toMatchObject({
      code: 'EPERM',
      syscall: 'prlimit64',
    });
    expect(mine()).toEqual([]);
  });

  it('noNewPrivileges (native): the instance runs with no_new_privs', async (t) => {
    t.skip(!native, 'the js backend cannot set it (capabilities().exec.noNewPrivileges is false)');
    const ctx = await supervisorCtx();
    const inst = await ctx.supervisor.launch(sleeper('nnp', { noNewPrivileges: true }));
    expect(statusOf(inst.pid)).toMatch(/^NoNewPrivs:\s+1$/m);
    await ctx.supervisor.stop('nnp', { graceMs: 5000 });
  });
});

describe('runAs in the ownership rule and the manifest', () => {
  it('with runAs the rule expects runAs.uid (and the declared uid), not ours', () => {
    const ours = process.getuid!();
    const other = ours === NOBODY ? NOBODY - 1 : NOBODY;
    expect(expectedUid({ uid: null, runAsUid: null }, ours)).toBe(true);
    expect(expectedUid({ uid: null, runAsUid: null }, other)).toBe(false);
    expect(expectedUid({ uid: null, runAsUid: other }, other)).toBe(true);
    expect(expectedUid({ uid: null, runAsUid: other }, ours)).toBe(false);
    expect(expectedUid({ uid: 4242, runAsUid: other }, 4242)).toBe(true);
  });

  it('a manifest whose runAs is malformed is a bad manifest', () => {
    const base = {
      version: 3,
      id: 'vm',
      token: 'a'.repeat(32),
      state: 'starting',
      identity: null,
      quarantine: null,
      command: '/bin/sleep',
      args: ['a'.repeat(32)],
      expect: [],
      paths: [],
      executable: null,
      pidSource: 'child',
      pidFile: null,
      createdAt: new Date().toISOString(),
      updatedAt: new Date().toISOString(),
      supervisorPid: process.pid,
    };
    const decode = (runAs: unknown) => decodeManifest(JSON.stringify({ ...base, runAs }), '/x/vm/manifest.json');
    expect(decode({ uid: NOBODY, gid: NOBODY, groups: [1] }).runAs).toEqual({ uid: NOBODY, gid: NOBODY, groups: [1] });
    for (const bad of [
      null,
      { uid: -1, gid: 0, groups: [] },
      { uid: 0, gid: 2 ** 32, groups: [] },
      { uid: 0, gid: 0 },
    ]) {
      expect(() => decode(bad), JSON.stringify(bad)).toThrow(/runAs is malformed/);
    }
  });
});
