/**
 * Instance.exited and the event loop, in a fresh node running dist/: a
 * script whose only work left is `await instance.exited` lives until the
 * exit and reports it (it used to end at once with code 13, its top-level
 * await unsettled, because the supervisor's exit watch does not hold the
 * loop); a script that does not wait ends while its daemon runs on,
 * unless its supervisor was opened with `ref` (or its old name keepAlive). An
 * instance with a restart policy holds it across its restarts' backoffs too.
 */
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { MARKER, tmpDir, waitFor } from '../helpers/procs.js';
import { PERL } from '../helpers/supervisor.js';

expectNoLeaks({ marker: MARKER });

const dist = join(import.meta.dirname, '..', '..', 'dist', 'index.js');

/** Runs an ES module script (top-level await) in a fresh node on this backend: its exit code, output and time. */
async function runScript(body: string, timeoutMs: number) {
  const started = Date.now();
  const run = promisify(execFile)(process.execPath, ['--input-type=module', '-e', body], {
    env: { ...process.env, CUSTODY_BACKEND: backend.name },
    encoding: 'utf8',
    timeout: timeoutMs,
  });
  const { code, stdout, stderr } = await run.then(
    (r) => ({ code: 0, stdout: r.stdout, stderr: r.stderr }),
    (e: { code?: number; stdout?: string; stderr?: string }) => ({
      code: e.code ?? -1,
      stdout: e.stdout ?? '',
      stderr: e.stderr ?? '',
    }),
  );
  return { code, stdout, stderr, ms: Date.now() - started };
}

/**
 * Launches perl running `perlCode` with the token, the marker and a gate file as its arguments ($ARGV[2] is
 * the gate), then creates the gate: an instance that waits for it ends only after its launch is confirmed,
 * however loaded the machine is.
 */
const launchScript = (dir: string, perlCode: string, options: object = {}) => `
  const { writeFileSync } = await import('node:fs');
  const { Supervisor } = await import(${JSON.stringify(dist)});
  const stateDir = ${JSON.stringify(join(dir, 'state'))};
  const gate = ${JSON.stringify(join(dir, 'gate'))};
  const { supervisor } = await Supervisor.open({ stateDir, ...${JSON.stringify(options)} });
  const inst = await supervisor.launch({
    id: 'brief',
    command: ${JSON.stringify(PERL)},
    args: (t) => ['-e', ${JSON.stringify(perlCode)}, '--', t, ${JSON.stringify(MARKER)}, gate],
  });
  writeFileSync(gate, '');
  console.log(JSON.stringify({ pid: inst.pid }));
`;

/** Perl that waits (at most 20 s) for its gate file, then exits with `code`. */
const untilGate = (code: number) =>
  `for (1 .. 1000) { last if -e $ARGV[2]; select(undef, undef, undef, 0.02) } exit ${code}`;

/** Whether pid still runs the marked perl (so a kill by pid reaches only what the test started). */
const isOurs = (pid: number) => {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').includes(MARKER);
  } catch {
    return false;
  }
};

describe(`awaiting Instance.exited (${backend.name})`, () => {
  it('holds the loop until the exit, whose status it reports; the script exits 0', async () => {
    const dir = tmpDir('custody-exited-');
    try {
      const script = `${launchScript(dir.path, untilGate(7))}
        const status = await inst.exited;
        console.log(JSON.stringify({ status }));`;
      const r = await runScript(script, 20_000);
      expect({ code: r.code, stderr: r.stderr }).toEqual({ code: 0, stderr: '' });
      const [launched, ended] = r.stdout
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l));
      expect(launched.pid).toBeGreaterThan(1);
      expect(ended).toEqual({ status: { code: 7, signal: null } });
      expect(isOurs(launched.pid)).toBe(false);
    } finally {
      dir.cleanup();
    }
  });

  it('with a restart policy, holds the loop across the backoff until the policy gives up; the script exits 0', async () => {
    const dir = tmpDir('custody-exited-');
    try {
      // Each run exits 3 once the gate is there; the first end is restarted after 300 ms (a backoff timer
      // holds nothing), the second leaves it failed, and only then does exited settle.
      const restart = { when: 'on-failure', delayMs: 300, limit: { count: 1, withinMs: 60_000 } };
      const script = `${launchScript(dir.path, untilGate(3)).replace("id: 'brief',", `id: 'brief', restart: ${JSON.stringify(restart)},`)}
        const status = await inst.exited;
        console.log(JSON.stringify({ status, restarts: inst.restarts }));`;
      const r = await runScript(script, 20_000);
      expect({ code: r.code, stderr: r.stderr }).toEqual({ code: 0, stderr: '' });
      const [launched, ended] = r.stdout
        .trim()
        .split('\n')
        .map((l) => JSON.parse(l));
      expect(ended.restarts).toBe(1);
      expect(isOurs(launched.pid)).toBe(false);
    } finally {
      dir.cleanup();
    }
  });

  it('a script that does not wait ends at once while its daemon runs on', async () => {
    const dir = tmpDir('custody-exited-');
    let pid = 0;
    try {
      const r = await runScript(launchScript(dir.path, 'sleep 30'), 20_000);
      expect({ code: r.code, stderr: r.stderr }).toEqual({ code: 0, stderr: '' });
      pid = JSON.parse(r.stdout.trim()).pid;
      // Ended while the 30 s daemon runs: nothing of the instance held the loop.
      expect(isOurs(pid)).toBe(true);
      expect(r.ms).toBeLessThan(20_000);
    } finally {
      if (pid > 1 && isOurs(pid)) {
        process.kill(pid, 'SIGKILL');
        await waitFor(() => !isOurs(pid), 5000, 'the daemon to be gone');
      }
      dir.cleanup();
    }
  });

  it.each([['ref'], ['keepAlive']])('%s: true holds the loop while the instance runs, unawaited', async (name) => {
    const dir = tmpDir('custody-exited-');
    try {
      const r = await runScript(launchScript(dir.path, untilGate(0), { [name]: true }), 20_000);
      expect({ code: r.code, stderr: r.stderr }).toEqual({ code: 0, stderr: '' });
      // The script ended only once its instance had: nothing was left to kill.
      expect(isOurs(JSON.parse(r.stdout.trim()).pid)).toBe(false);
    } finally {
      dir.cleanup();
    }
  });
});
