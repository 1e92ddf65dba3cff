// The shipped examples (examples/, in the package's files) run as a user runs
// them, on this backend, and say what they did: so they stay true. The packed
// package runs them again from an empty project (test/packaging/run.sh).
// Each example ends what it started; the leak check below holds them to it.
import { execFile, execFileSync } from 'node:child_process';
import { existsSync, rmSync } from 'node:fs';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { backend } from '../src/backend/index.js';
import { cleanupAfterEach } from './helpers/cleanups.js';

cleanupAfterEach();

const EXAMPLES = join(import.meta.dirname, '..', 'examples');
const TSC = join(import.meta.dirname, '..', 'node_modules', 'typescript', 'bin', 'tsc');

function example(file: string): Promise<{ code: number | null; stdout: string; stderr: string }> {
  const env = { ...process.env, CUSTODY_BACKEND: backend.name };
  return new Promise((resolve) => {
    execFile(process.execPath, [join(EXAMPLES, file)], { env, timeout: 60_000 }, (err, stdout, stderr) => {
      resolve({ code: err ? ((err as { code?: number }).code ?? null) : 0, stdout, stderr });
    });
  });
}

async function runs(file: string, expected: RegExp[]): Promise<void> {
  const r = await example(file);
  expect(r, r.stderr).toMatchObject({ code: 0, stderr: '' });
  for (const line of expected) expect(r.stdout).toMatch(line);
}

describe(`the shipped examples (${backend.name})`, () => {
  it('quickstart.js: launch, ready, close, adopt, stop', () =>
    runs('quickstart.js', [
      /^launched app: pid \d+$/m,
      /^adopted: app \(pid \d+\)$/m,
      /^stopped app: exited, stopped$/m,
    ]));

  it('adopt.js: a second agent process adopts what the first launched, and stops it', () =>
    runs('adopt.js', [
      /launched nap, pid (\d+); exiting without stop\(\)/,
      /adopted nap, pid \d+/,
      /stopped nap: exited/,
    ]));

  it('restart.js: on-failure restarts with a growing delay, then gives up', () =>
    runs('restart.js', [
      /^restart {2}#1 in 50 ms$/m,
      /^restart {2}#2 in 100 ms$/m,
      /^restart {2}#3 in 200 ms$/m,
      /^gave-up {2}after 3 restarts$/m,
      /^crashy is failed: 3 restarts, the last end exit-code$/m,
    ]));

  it('notify-daemon.js: READY=1 ends the launch (native), or says why it cannot (js)', () =>
    runs(
      'notify-daemon.js',
      backend.name === 'native'
        ? [/^status loading$/m, /^status serving$/m, /^daemon ready: pid \d+$/m, /^stopped: exited, stopped$/m]
        : [/^skipped: ready: 'notify' needs the native backend \(this is js\)$/m],
    ));

  it('exec-attrs.js: the attributes this backend applies, as the kernel shows them', () =>
    runs('exec-attrs.js', [
      new RegExp(`^backend: ${backend.name}; asking for umask, rlimits, oomScoreAdj`, 'm'),
      // runAs where root runs it: nobody's uid; else the agent's own.
      new RegExp(`^uid ${process.getuid?.() === 0 ? 65534 : process.getuid?.()}, umask 0027, nofile \\d+/\\d+$`, 'm'),
      new RegExp(`^oom_score_adj \\d+, no_new_privs ${backend.name === 'native' ? 1 : 0}$`, 'm'),
      /^stopped nap: exited, stopped$/m,
    ]));

  it('commonjs.cjs: require() and token: env', () =>
    runs('commonjs.cjs', [new RegExp(`^backend: ${backend.name}$`, 'm'), /^stopped nap: exited, stopped$/m]));

  it('typescript.ts: type-checks under strict and runs', async () => {
    // One output dir per backend: the two projects run at once. Inside examples/, so that 'custody' resolves.
    const out = join(EXAMPLES, '.build', backend.name);
    rmSync(out, { recursive: true, force: true });
    execFileSync(process.execPath, [TSC, '-p', EXAMPLES, '--outDir', out], { stdio: 'pipe' });
    expect(existsSync(join(out, 'typescript.js'))).toBe(true);
    await runs(join('.build', backend.name, 'typescript.js'), [
      /^second launch refused: ERR_CUSTODY_BUSY$/m,
      /^stop: exited/m,
    ]);
  });
});
