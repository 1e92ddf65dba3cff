// What the native spawn's child does to signals before it execs, read at the
// syscall level with strace: the one place that shows what happens between
// clone and execve. Node ignores SIGPIPE and installs handlers; none of that
// may reach the program, and no handler of ours may run in the child, on our
// memory, once it unblocks signals. On x86_64 (the architecture with a clone3
// trampoline) the kernel clears every handler at clone (CLONE_CLEAR_SIGHAND)
// and the child resets only the classic signals; elsewhere, or where clone3 is
// refused (staged with a seccomp filter, test/fixtures/c/hostile-exec.c), it
// resets the classic signals and every real-time one that has a handler.
import { execFileSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { compileC } from '../helpers/cprog.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { tmpDir } from '../helpers/procs.js';

expectNoLeaks();

const addonPath =
  process.env.CUSTODY_ADDON_PATH ?? join(import.meta.dirname, '..', '..', 'build', 'Release', 'custody.node');

/** strace -f of a node (run by `launcher`, if any) that spawns /bin/true through the addon: the trace's lines. */
function traceSpawn(dir: string, launcher: string[] = []): string[] {
  const out = join(dir, 'trace');
  // A handler of Node's (SIGUSR2 through libuv) and Node's own SIG_IGN of
  // SIGPIPE are both in place when the addon clones.
  const script = `
    process.on('SIGUSR2', () => {});
    const a = require(${JSON.stringify(addonPath)});
    const fd = a.spawn('/bin/true', ['true'], null, null, -1, -1, -1, 0, -1) % a.constants.SPAWN_PID_SCALE;
    a.waitid(fd, a.constants.WEXITED);`;
  execFileSync(
    'strace',
    [
      '-f',
      '-qq',
      '-e',
      'trace=clone,clone3,rt_sigaction,rt_sigprocmask,execve',
      '-o',
      out,
      ...launcher,
      process.execPath,
      '-e',
      script,
    ],
    { timeout: 30_000, stdio: 'ignore' },
  );
  return readFileSync(out, 'utf8').split('\n');
}

/** A trace line as [pid, call]; strace pads the pid column to the widest pid it has seen. */
function parse(line: string): [string, string] | null {
  const m = line.match(/^(\d+)\s+(.*)$/);
  return m ? [m[1] ?? '', m[2] ?? ''] : null;
}

/** The calls the child (the pid the clone returned) made before its execve. */
function childCallsBeforeExec(lines: string[], cloneCall: RegExp): { clone: string; calls: string[] } {
  const traced = lines.map(parse).filter((l): l is [string, string] => l !== null);
  const at = traced.findIndex(([, call]) => cloneCall.test(call));
  const found = traced[at];
  if (!found) throw new Error(`no ${cloneCall} in the trace:\n${lines.join('\n')}`);
  const [tid, clone] = found;
  // A vfork-style clone blocks: strace prints it "<unfinished ...>" and its
  // result on a "<... clone3 resumed>" line of the same thread.
  const done = /= \d+$/.test(clone)
    ? clone
    : traced
        .slice(at + 1)
        .find(([pid, call]) => pid === tid && call.startsWith('<... clone') && /= \d+$/.test(call))?.[1];
  const child = done?.match(/= (\d+)$/)?.[1];
  if (!child) throw new Error(`the clone's result is not in the trace:\n${lines.join('\n')}`);
  const calls: string[] = [];
  for (const [pid, call] of traced) {
    if (pid !== child) continue;
    if (call.startsWith('execve(')) break;
    calls.push(call);
  }
  return { clone, calls };
}

/** The child's rt_sigaction calls, split into resets to SIG_DFL and the rest; and where it unblocks signals. */
function signalCalls(calls: string[]): { resets: string[]; others: string[]; unblock: number; lastAction: number } {
  const actions = calls.filter((c) => c.startsWith('rt_sigaction('));
  // A reset passes a new action; a read passes NULL and gets the old one back.
  const resets = actions.filter((c) => /^rt_sigaction\(\w+, \{sa_handler=SIG_DFL/.test(c));
  return {
    resets,
    others: actions.filter((c) => !resets.includes(c)),
    unblock: calls.findIndex((c) => c.startsWith('rt_sigprocmask(SIG_SETMASK, []')),
    lastAction: calls.lastIndexOf(actions.at(-1) ?? ''),
  };
}

/** The 29 classic signals (1..31 but SIGKILL and SIGSTOP), each reset, SIGPIPE (Node's SIG_IGN) and SIGUSR2 (a handler) among them. */
function expectClassicResets(resets: string[]): void {
  expect(resets).toHaveLength(29);
  expect(resets.every((c) => !c.startsWith('rt_sigaction(SIGRT'))).toBe(true);
  expect(resets.some((c) => c.startsWith('rt_sigaction(SIGPIPE,'))).toBe(true);
  expect(resets.some((c) => c.startsWith('rt_sigaction(SIGUSR2,'))).toBe(true);
}

describe.skipIf(backend.name !== 'native')('the native spawn and signals (strace)', () => {
  let dir: ReturnType<typeof tmpDir>;
  beforeAll(() => {
    dir = tmpDir('custody-strace-');
  });
  afterAll(() => dir.cleanup());

  it.skipIf(process.arch !== 'x64')(
    'clears every handler at clone and resets only the classic signals before execve',
    () => {
      const { clone, calls } = childCallsBeforeExec(traceSpawn(dir.path), /clone3\(\{flags=[^}]*CLONE_CLEAR_SIGHAND/);
      expect(clone).toMatch(/CLONE_VM\|/);
      expect(clone).toMatch(/CLONE_VFORK/);
      expect(clone).toMatch(/CLONE_PIDFD/);
      const { resets, others, unblock, lastAction } = signalCalls(calls);
      expectClassicResets(resets);
      // Nothing else sets, or even reads, a disposition before execve.
      expect(others).toEqual([]);
      // Every reset comes before the mask is opened: nothing of ours can run in the child.
      expect(unblock).toBeGreaterThan(lastAction);
    },
  );

  it.skipIf(process.arch !== 'x64')(
    'where clone3 is refused, clones and resets the classic signals, reading the real-time ones, before execve',
    () => {
      const hostileExec = compileC('hostile-exec', dir.path);
      const lines = traceSpawn(dir.path, [hostileExec, 'no-clone3']);
      // The addon asked for clone3 and the filter said ENOSYS...
      expect(lines.some((l) => /clone3\(\{flags=[^}]*CLONE_CLEAR_SIGHAND.*= -1 ENOSYS/.test(l))).toBe(true);
      const { clone, calls } = childCallsBeforeExec(lines, /^clone\(.*flags=CLONE_VM\|[^,]*CLONE_VFORK/);
      expect(clone).toMatch(/CLONE_PIDFD/);
      const { resets, others, unblock, lastAction } = signalCalls(calls);
      expectClassicResets(resets);
      // ...so the child read each real-time signal glibc lets it touch
      // (34..64); none has a handler here, and the ignored 40 is kept.
      expect(others).toHaveLength(31);
      expect(others.every((c) => /^rt_sigaction\(SIGRT_\d+, NULL, \{sa_handler=SIG_(DFL|IGN)/.test(c))).toBe(true);
      expect(others.filter((c) => /sa_handler=SIG_IGN/.test(c))).toHaveLength(1);
      expect(unblock).toBeGreaterThan(lastAction);
    },
  );
});
