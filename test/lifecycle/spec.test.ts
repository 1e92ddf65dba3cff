/**
 * What the public options refuse, and how: a LaunchSpec, SupervisorOptions,
 * StopOptions (and their nested objects) with a key custody does not know,
 * and any *Ms option that is not an integer from 0 to 2^31 - 1, are
 * ERR_CUSTODY_INVALID_ARG naming the key (with the known key a typo most
 * likely meant), before anything exists: no manifest, no log, no state dir,
 * no signal. The deprecated aliases (keepAlive, newGroup) still work, and
 * giving one with its new name is refused.
 */
import { existsSync, readdirSync, readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { followLog, type LaunchSpec, spawn, Supervisor, sweep, terminate } from '../../src/index.js';
import { CGROUP_ROOT, CGROUP_SKIP, expectNoCgroupsLeft } from '../helpers/cgroup.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { MARKER, tmpDir } from '../helpers/procs.js';
import { openSupervisor, PERL } from '../helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });
expectNoCgroupsLeft();

const MAX_MS = 2 ** 31 - 1;
const args = (t: string) => ['-e', 'sleep 30', '--', t, MARKER];
const invalid = (message: RegExp) => ({ code: 'ERR_CUSTODY_INVALID_ARG', message: expect.stringMatching(message) });

let ctx: Awaited<ReturnType<typeof openSupervisor>> | undefined;
afterEach(async () => {
  await ctx?.dispose();
  ctx = undefined;
});

/** The entries of the state dir that are an instance's (manifests, its logs dir). */
function instanceTraces(stateDir: string): string[] {
  const logs = join(stateDir, '.logs');
  return [
    ...readdirSync(stateDir).filter((n) => !n.startsWith('.')),
    ...(existsSync(logs) ? readdirSync(logs).map((n) => `.logs/${n}`) : []),
  ];
}

describe(`LaunchSpec checks (${backend.name})`, () => {
  const cases: Array<[string, Partial<LaunchSpec> & Record<string, unknown>, RegExp]> = [
    [
      'a misspelt top-level key',
      { readyTimeout: 5000 },
      /LaunchSpec has no option `readyTimeout` \(did you mean `readyTimeoutMs`\?\)/,
    ],
    ['a key in another case', { confirmtimeoutms: 10 }, /`confirmtimeoutms` \(did you mean `confirmTimeoutMs`\?\)/],
    ['a dropped letter', { proccessGroup: true }, /did you mean `processGroup`/],
    ['a key like none', { restartPolicy: 'always' }, /LaunchSpec has no option `restartPolicy`$/],
    [
      'a key in ready',
      { ready: { socket: '/tmp/x.sock', timeout: 10 } as never },
      /LaunchSpec.ready has no option `timeout` \(did you mean `timeoutMs`\?\)/,
    ],
    ['a key in pid', { pid: { file: '/tmp/x.pid', fiel: 1 } as never }, /LaunchSpec.pid has no option `fiel`/],
    [
      'a key in logs',
      { logs: { maxByte: 1024 } as never },
      /LaunchSpec.logs has no option `maxByte` \(did you mean `maxBytes`\?\)/,
    ],
    ['a key in limits', { limits: { memoryMaximum: 1 } as never }, /LaunchSpec.limits has no option `memoryMaximum`/],
    [
      'readyTimeoutMs past 2^31 - 1',
      { readyTimeoutMs: 2 ** 31 },
      /readyTimeoutMs must be an integer number of milliseconds from 0 to 2147483647, got 2147483648/,
    ],
    ['a fraction of a millisecond', { confirmTimeoutMs: 1.5 }, /confirmTimeoutMs must be an integer .* got 1.5/],
    ['NaN', { abandonGraceMs: Number.NaN }, /abandonGraceMs must be .* got NaN/],
    ['a negative', { readyTimeoutMs: -1 }, /readyTimeoutMs must be .* got -1/],
    ['Infinity', { confirmTimeoutMs: Number.POSITIVE_INFINITY }, /confirmTimeoutMs .* got Infinity/],
    ['a string', { abandonGraceMs: '100' as never }, /abandonGraceMs .* got "100"/],
    [
      'ready.timeoutMs past 2^31 - 1',
      { ready: { socket: '/tmp/x.sock', timeoutMs: 3e9 } },
      /ready.timeoutMs must be .* got 3000000000/,
    ],
  ];

  it.each(cases)('%s is ERR_CUSTODY_INVALID_ARG, and nothing is created', async (_what, extra, message) => {
    ctx ??= await openSupervisor();
    const spec = { id: 'bad', command: PERL, args, ...extra } as LaunchSpec;
    await expect(ctx.supervisor.launch(spec)).rejects.toMatchObject(invalid(message));
    expect(instanceTraces(ctx.stateDir)).toEqual([]);
    expect(ctx.events).toEqual([]);
  });

  it('the bounds themselves are accepted: 0 and 2^31 - 1', async () => {
    ctx = await openSupervisor();
    const inst = await ctx.supervisor.launch({
      id: 'bounds',
      command: PERL,
      args,
      confirmTimeoutMs: MAX_MS,
      abandonGraceMs: 0,
      readyTimeoutMs: MAX_MS,
      ready: () => true,
    });
    expect(inst.pid).toBeGreaterThan(1);
    await expect(ctx.supervisor.stop('bounds', { graceMs: MAX_MS, termGraceMs: 0 })).resolves.toMatchObject({
      outcome: 'exited',
    });
  });
});

describe(`SupervisorOptions checks (${backend.name})`, () => {
  const cases: Array<[string, Record<string, unknown>, RegExp]> = [
    [
      'a misspelt key',
      { keepalive: true },
      /SupervisorOptions has no option `keepalive` \(did you mean `keepAlive`\?\)/,
    ],
    [
      'ref and its alias keepAlive',
      { ref: true, keepAlive: true },
      /give ref or its deprecated alias keepAlive, not both/,
    ],
    ['ref not a boolean', { ref: 'yes' }, /ref must be a boolean/],
    [
      'a key in sweep',
      { sweep: { interval: 1000, patterns: [] } },
      /SupervisorOptions.sweep has no option `interval` \(did you mean `intervalMs`\?\)/,
    ],
    [
      'sweep.intervalMs past 2^31 - 1',
      { sweep: { intervalMs: 2 ** 31, patterns: [] } },
      /sweep.intervalMs must be an integer .* got 2147483648/,
    ],
    [
      'a sweep pattern with a fractional graceMs',
      { sweep: { intervalMs: 1000, patterns: [{ argv: ['x'], graceMs: 0.5 }] } },
      /graceMs must be an integer .* got 0.5/,
    ],
    [
      'a key in cgroup',
      { cgroup: { root: '/sys/fs/cgroup/x', roots: 1 } },
      /SupervisorOptions.cgroup has no option `roots` \(did you mean `root`\?\)/,
    ],
  ];

  it.each(cases)('%s is ERR_CUSTODY_INVALID_ARG; the state dir is never created', async (_what, extra, message) => {
    const dir = tmpDir('custody-options-');
    try {
      const stateDir = join(dir.path, 'state');
      await expect(Supervisor.open({ stateDir, ...extra } as never)).rejects.toMatchObject(invalid(message));
      expect(existsSync(stateDir)).toBe(false);
    } finally {
      dir.cleanup();
    }
  });

  it('ref, and its deprecated alias keepAlive, are accepted', async () => {
    for (const extra of [{ ref: true }, { keepAlive: true }, { ref: false }]) {
      const opened = await openSupervisor(extra);
      expect(opened.report.adopted).toEqual([]);
      await opened.dispose();
    }
  });
});

describe(`StopOptions checks (${backend.name})`, () => {
  it('a bad stop is refused before anything is signalled; the instance runs on', async () => {
    ctx = await openSupervisor();
    const inst = await ctx.supervisor.launch({ id: 'kept', command: PERL, args });
    const bad: Array<[Record<string, unknown>, RegExp]> = [
      [{ grace: 100 }, /StopOptions has no option `grace` \(did you mean `graceMs`\?\)/],
      [{ graceMs: 3e9 }, /graceMs must be an integer .* got 3000000000/],
      [{ termGraceMs: 0.5 }, /termGraceMs must be an integer .* got 0.5/],
      [{ tree: 'yes' }, /tree must be a boolean/],
      [{ signal: 'abort' }, /signal must be an AbortSignal/],
    ];
    for (const [options, message] of bad) {
      await expect(ctx.supervisor.stop('kept', options as never)).rejects.toMatchObject(invalid(message));
    }
    expect(ctx.supervisor.list()).toEqual([expect.objectContaining({ id: 'kept', status: 'running', pid: inst.pid })]);
    expect(ctx.events.filter((e) => e.type === 'stop' || e.type === 'escalate')).toEqual([]);
    await ctx.supervisor.stop('kept', { graceMs: 2000 });
  });
});

describe(`freeze() and thaw() timeoutMs (${backend.name})`, () => {
  it('past 2^31 - 1, or a fraction, is refused and the cgroup is left as it was', async (t) => {
    t.skip(!!CGROUP_SKIP, CGROUP_SKIP ?? '');
    ctx = await openSupervisor({ cgroup: { root: CGROUP_ROOT } });
    const inst = await ctx.supervisor.launch({ id: 'cg', command: PERL, args });
    const frozen = () => readFileSync(join(inst.cgroup!, 'cgroup.events'), 'utf8').match(/^frozen (\d)$/m)?.[1];
    await expect(ctx.supervisor.freeze('cg', { timeoutMs: 2 ** 31 })).rejects.toMatchObject(
      invalid(/timeoutMs .* got 2147483648/),
    );
    expect(frozen()).toBe('0');
    await ctx.supervisor.freeze('cg', { timeoutMs: 5000 });
    await expect(ctx.supervisor.thaw('cg', { timeoutMs: 0.5 })).rejects.toMatchObject(invalid(/timeoutMs .* got 0.5/));
    expect(frozen()).toBe('1');
    await ctx.supervisor.thaw('cg');
    await ctx.supervisor.stop('cg', { graceMs: 2000 });
  });
});

describe(`*Ms of the process functions (${backend.name})`, () => {
  it('terminate(), sweep() and followLog() refuse a wait Node would cut short', async () => {
    const h = spawn(PERL, ['-e', 'sleep 30', MARKER]);
    try {
      await expect(terminate(h, { graceMs: 2 ** 31 })).rejects.toMatchObject(invalid(/graceMs .* got 2147483648/));
      await expect(terminate(h, { killWaitMs: 0.25 })).rejects.toMatchObject(invalid(/killWaitMs .* got 0.25/));
      expect(h.isAlive()).toBe(true);
    } finally {
      await terminate(h, { graceMs: 2000 });
    }
    await expect(sweep({ argv: ['x'], deadlineMs: Number.NaN })).rejects.toMatchObject(invalid(/deadlineMs .* NaN/));
    const dir = tmpDir('custody-follow-');
    try {
      const file = join(dir.path, 'out.log');
      const ac = new AbortController();
      const lines = followLog(file, { pollMs: 2 ** 40, signal: ac.signal });
      await expect(lines.next()).rejects.toMatchObject(invalid(/pollMs .* got 1099511627776/));
    } finally {
      dir.cleanup();
    }
  });
});

describe(`spawn()'s processGroup and its deprecated alias newGroup (${backend.name})`, () => {
  /** The process group of pid, from /proc/<pid>/stat (field 5). */
  const pgid = (pid: number) => Number(readFileSync(`/proc/${pid}/stat`, 'utf8').split(') ')[1]!.split(' ')[2]);

  it.each([['processGroup'], ['newGroup']])('%s: true gives the child a group of its own', async (name) => {
    const h = spawn(PERL, ['-e', 'sleep 30', MARKER], { [name]: true });
    try {
      expect(pgid(h.pid)).toBe(h.pid);
    } finally {
      await terminate(h, { graceMs: 2000 });
    }
  });

  it('both at once is ERR_CUSTODY_INVALID_ARG, and nothing is spawned', () => {
    expect(() => spawn(PERL, ['-e', 'sleep 30', MARKER], { processGroup: true, newGroup: true })).toThrow(
      expect.objectContaining(invalid(/give processGroup or its deprecated alias newGroup, not both/)),
    );
  });
});
