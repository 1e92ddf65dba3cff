// What the native spawn's child does to signals before it execs, read at the
// syscall level with strace: the one place that shows what happens between
// clone and execve. Node ignores SIGPIPE and installs handlers; none of that
// may reach the program, and no handler of ours may run in the child, on our
// memory, once it unblocks signals. On x86_64 (the architecture with a clone3
// trampoline) the kernel clears every handler at clone (CLONE_CLEAR_SIGHAND)
// and the child resets only the classic signals; elsewhere, or where clone3 is
// refused, it resets every signal itself.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backend } from '../src/backend/index.js';
import { expectNoLeaks } from './helpers/leaks.js';

expectNoLeaks();

const addonPath = process.env.CUSTODY_ADDON_PATH ?? join(import.meta.dirname, '..', 'build', 'Release', 'custody.node');

/** strace -f of a node that spawns /bin/true through the addon: the trace's lines. */
function traceSpawn(dir: string): string[] {
  const out = join(dir, 'trace');
  // A handler of Node's (SIGUSR2 through libuv) and Node's own SIG_IGN of
  // SIGPIPE are both in place when the addon clones.
  const script = `
    process.on('SIGUSR2', () => {});
    const a = require(${JSON.stringify(addonPath)});
    const [, fd] = a.spawn('/bin/true', ['true'], null, null, -1, -1, -1, 0, -1);
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
      process.execPath,
      '-e',
      script,
    ],
    { timeout: 30_000, stdio: 'ignore' },
  );
  return readFileSync(out, 'utf8').split('\n');
}

/** The calls the child (the pid the clone returned) made before its execve. */
function childCallsBeforeExec(lines: string[], cloneCall: RegExp): { clone: string; calls: string[] } {
  const at = lines.findIndex((l) => cloneCall.test(l));
  const clone = lines[at];
  if (clone === undefined) throw new Error(`no ${cloneCall} in the trace:\n${lines.join('\n')}`);
  // A vfork-style clone blocks: strace prints it "<unfinished ...>" and its
  // result on a "<... clone3 resumed>" line of the same thread.
  const tid = clone.split(' ')[0];
  const done = /= \d+$/.test(clone)
    ? clone
    : lines.slice(at + 1).find((l) => l.startsWith(`${tid} <... clone`) && /= \d+$/.test(l));
  const child = done?.match(/= (\d+)$/)?.[1];
  if (!child) throw new Error(`the clone's result is not in the trace:\n${lines.join('\n')}`);
  const calls: string[] = [];
  for (const l of lines) {
    if (!l.startsWith(`${child} `)) continue;
    const call = l.slice(`${child} `.length);
    if (call.startsWith('execve(')) break;
    calls.push(call);
  }
  return { clone, calls };
}

describe.skipIf(backend.name !== 'native')('the native spawn and signals (strace)', () => {
  it.skipIf(process.arch !== 'x64')(
    'clears every handler at clone and resets only the classic signals before execve',
    () => {
      const dir = mkdtempSync(join(tmpdir(), 'custody-strace-'));
      try {
        const { clone, calls } = childCallsBeforeExec(traceSpawn(dir), /clone3\(\{flags=[^}]*CLONE_CLEAR_SIGHAND/);
        expect(clone).toMatch(/CLONE_VM\|/);
        expect(clone).toMatch(/CLONE_VFORK/);
        expect(clone).toMatch(/CLONE_PIDFD/);
        const resets = calls.filter((c) => c.startsWith('rt_sigaction('));
        // 1..31 but SIGKILL and SIGSTOP, each to SIG_DFL: 29 calls, not 62.
        expect(resets).toHaveLength(29);
        expect(resets.every((c) => /sa_handler=SIG_DFL/.test(c))).toBe(true);
        expect(resets.some((c) => c.startsWith('rt_sigaction(SIGPIPE,'))).toBe(true);
        expect(resets.some((c) => c.startsWith('rt_sigaction(SIGUSR2,'))).toBe(true);
        // Every reset comes before the mask is opened: nothing of ours can run in the child.
        const unblock = calls.findIndex((c) => c.startsWith('rt_sigprocmask(SIG_SETMASK, []'));
        expect(unblock).toBeGreaterThan(calls.lastIndexOf(resets.at(-1) ?? ''));
      } finally {
        rmSync(dir, { recursive: true, force: true });
      }
    },
  );
});
