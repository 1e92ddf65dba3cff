// Why an instance ended, as systemd's Result= says it: on the exit event,
// on stop()'s result and stop event, on Instance.lastExit and in list().
// Real processes end each way: exit 0, exit 3, SIGKILL from outside, a
// SIGABRT that writes a core (the kernel's CLD_DUMPED: native says
// core-dump, the js backend signal, as capabilities() says), stop(). An
// OOM kill cannot be staged on this host (its cgroup v2 has no memory
// controller, so an instance cgroup has no memory.events): the reading of
// memory.events is tested on a fixture file instead (a seam), and the
// result it leads to through resultOf().
import { mkdtempSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { capabilities, type ExitEvent, type Instance, type StopEvent } from '../../src/index.js';
import { oomKillsIn } from '../../src/process/cgroup.js';
import { resultOf } from '../../src/process/exit.js';
import { decodeWaitStatus } from '../../src/process/signals.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { MARKER, waitFor } from '../helpers/procs.js';
import { openSupervisor, PERL, PYTHON } from '../helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });

let ctx: Awaited<ReturnType<typeof openSupervisor>> | undefined;
const dirs: string[] = [];
afterEach(async () => {
  await ctx?.dispose();
  ctx = undefined;
  for (const d of dirs.splice(0)) rmSync(d, { recursive: true, force: true });
});

const scratch = () => {
  const d = mkdtempSync(join(tmpdir(), 'custody-result-'));
  dirs.push(d);
  return d;
};

/** Whether a process of ours that aborts writes its core into its cwd: a core limit above 0, a plain core_pattern. */
function coresLandInCwd(): boolean {
  const pattern = readFileSync('/proc/sys/kernel/core_pattern', 'utf8').trim();
  const line = readFileSync('/proc/self/limits', 'utf8')
    .split('\n')
    .find((l) => l.startsWith('Max core file size'));
  const hard = line?.slice('Max core file size'.length).trim().split(/\s+/)[1];
  return hard !== undefined && hard !== '0' && pattern !== '' && !pattern.startsWith('|') && !pattern.includes('/');
}

/** Waits (at most 20 s) for the gate file, then exits with the given code: it ends once launched, never before. */
const GATED_EXIT = `for (1 .. 1000) { last if -e $ARGV[2]; select(undef, undef, undef, 0.02) } exit $ARGV[3]`;

async function exitEvent(id: string): Promise<ExitEvent> {
  return waitFor(
    () => ctx?.events.find((e): e is ExitEvent => e.type === 'exit' && e.id === id),
    20_000,
    `the exit event of ${id}`,
  );
}

async function launchGated(id: string, code: number): Promise<{ inst: Instance; gate: string }> {
  const gate = join(scratch(), 'gate');
  const inst = await ctx!.supervisor.launch({
    id,
    command: PERL,
    args: (t) => ['-e', GATED_EXIT, '--', t, MARKER, gate, String(code)],
  });
  return { inst, gate };
}

describe(`why an instance ended (${backend.name})`, () => {
  it('exit 0 is success, another code is exit-code: on the exit event and on Instance.lastExit', async () => {
    ctx = await openSupervisor();
    const ok = await launchGated('ok', 0);
    const bad = await launchGated('bad', 3);
    expect(ok.inst.lastExit).toBeNull();
    writeFileSync(ok.gate, '');
    writeFileSync(bad.gate, '');
    expect(await exitEvent('ok')).toMatchObject({ code: 0, signal: null, result: 'success' });
    expect(await exitEvent('bad')).toMatchObject({ code: 3, signal: null, result: 'exit-code' });
    expect(ok.inst.lastExit).toEqual({ code: 0, signal: null, result: 'success' });
    expect(bad.inst.lastExit).toEqual({ code: 3, signal: null, result: 'exit-code' });
  });

  it('SIGKILL from outside is signal; list() shows the exited instance with its result', async () => {
    ctx = await openSupervisor();
    const { inst } = await launchGated('killed', 0);
    process.kill(inst.pid, 'SIGKILL');
    expect(await exitEvent('killed')).toMatchObject({ code: null, signal: 'SIGKILL', result: 'signal' });
    expect(inst.lastExit).toEqual({ code: null, signal: 'SIGKILL', result: 'signal' });
    const shown = ctx.supervisor.list().find((i) => i.id === 'killed');
    // Shown until its cleanup removed it; while shown, with its result.
    if (shown) expect(shown.exit).toEqual({ code: null, signal: 'SIGKILL', result: 'signal' });
  });

  it('a SIGABRT that wrote a core is core-dump where the backend can tell (capabilities().coreDump), else signal', async () => {
    ctx = await openSupervisor();
    const cwd = scratch();
    const gate = join(cwd, 'gate');
    // Its own core limit raised as far as the hard limit allows; it aborts once the gate appears. This host's
    // core_pattern is a plain name, so the kernel writes the core in this scratch cwd (removed after).
    const py = `
import os, resource, sys, time
hard = resource.getrlimit(resource.RLIMIT_CORE)[1]
resource.setrlimit(resource.RLIMIT_CORE, (hard, hard))
print('core limit', hard, flush=True)
for _ in range(1000):
    if os.path.exists(sys.argv[1]):
        os.abort()
    time.sleep(0.02)
`;
    const inst = await ctx.supervisor.launch({
      id: 'dumped',
      command: PYTHON,
      args: (t) => ['-c', py, gate, t, MARKER],
      cwd,
    });
    writeFileSync(gate, '');
    const exit = await exitEvent('dumped');
    const cores = readdirSync(cwd).filter((n) => n === 'core' || n.startsWith('core.'));
    expect(exit).toMatchObject({ code: null, signal: 'SIGABRT' });
    if (!coresLandInCwd()) {
      // A hard limit of 0, or a core_pattern that sends cores elsewhere (a pipe, a path): nothing to see here.
      console.log('no core can be written into a cwd here: core-dump not checked');
      return;
    }
    expect(cores.length).toBeGreaterThan(0);
    expect(capabilities().coreDump).toBe(backend.name === 'native');
    expect(exit.result).toBe(capabilities().coreDump ? 'core-dump' : 'signal');
    expect(inst.lastExit?.result).toBe(exit.result);
  });

  it('stop() is stopped: its result, its stop event and Instance.lastExit say so', async () => {
    ctx = await openSupervisor();
    const { inst } = await launchGated('stopped', 0);
    const r = await ctx.supervisor.stop('stopped', { graceMs: 5000 });
    expect(r).toMatchObject({ outcome: 'exited', signal: 'SIGTERM', result: 'stopped' });
    const ev = ctx.events.find((e): e is StopEvent => e.type === 'stop' && e.id === 'stopped');
    expect(ev).toMatchObject({ result: 'stopped' });
    expect(inst.lastExit).toEqual({ code: null, signal: 'SIGTERM', result: 'stopped' });
  });
});

describe('results from statuses (pure)', () => {
  it('a wait status with WCOREDUMP says so; resultOf reads status, core and OOM kills', () => {
    expect(decodeWaitStatus(3 << 8)).toEqual({ code: 3, signal: null });
    expect(decodeWaitStatus(6)).toEqual({ code: null, signal: 'SIGABRT' });
    expect(decodeWaitStatus(6 | 0x80)).toEqual({ code: null, signal: 'SIGABRT', coreDumped: true });
    expect(resultOf({ code: 0, signal: null })).toBe('success');
    expect(resultOf({ code: 1, signal: null })).toBe('exit-code');
    expect(resultOf({ code: null, signal: 'SIGTERM' })).toBe('signal');
    expect(resultOf({ code: null, signal: 'SIGSEGV', coreDumped: true })).toBe('core-dump');
    expect(resultOf({ code: null, signal: null })).toBe('unknown');
    // An OOM kill counted in its cgroup explains a SIGKILL, or a status that cannot be known; nothing else.
    expect(resultOf({ code: null, signal: 'SIGKILL' }, 1)).toBe('oom-kill');
    expect(resultOf({ code: null, signal: null }, 1)).toBe('oom-kill');
    expect(resultOf({ code: null, signal: 'SIGKILL' }, 0)).toBe('signal');
    expect(resultOf({ code: 0, signal: null }, 1)).toBe('success');
    expect(resultOf({ code: null, signal: 'SIGTERM' }, 1)).toBe('signal');
  });

  it("memory.events (a fixture file: this host's cgroup v2 has no memory controller) counts oom_kill and oom_group_kill", () => {
    const dir = mkdtempSync(join(tmpdir(), 'custody-memevents-'));
    try {
      expect(oomKillsIn(dir)).toBe(0);
      writeFileSync(join(dir, 'memory.events'), 'low 0\nhigh 0\nmax 12\noom 2\noom_kill 1\noom_group_kill 0\n');
      expect(oomKillsIn(dir)).toBe(1);
      writeFileSync(join(dir, 'memory.events'), 'low 0\nhigh 0\nmax 4\noom 1\noom_kill 0\noom_group_kill 3\n');
      expect(oomKillsIn(dir)).toBe(3);
      writeFileSync(join(dir, 'memory.events'), 'low 0\nhigh 0\nmax 0\noom 0\noom_kill 0\n');
      expect(oomKillsIn(dir)).toBe(0);
    } finally {
      rmSync(dir, { recursive: true, force: true });
    }
  });
});
