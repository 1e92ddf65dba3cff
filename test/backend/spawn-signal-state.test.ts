// The signal state a spawned program starts in, read from the program's own
// /proc/self/status: nothing blocked, nothing caught, and of the ignored
// signals only the real-time ones the agent itself was handed ignored (as
// child_process leaves them); the classic signals Node ignores (SIGPIPE,
// SIGXFSZ) are back to their defaults. The same on either backend and, on
// the native one, whichever way the kernel let the child be made: clone3
// clearing every handler at clone, or, where a seccomp filter refuses clone3
// as container runtimes' default profiles do, clone and the child's own resets.
import { execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { compileC } from '../helpers/cprog.js';
import { expectNoLeaks } from '../helpers/leaks.js';
import { tmpDir } from '../helpers/procs.js';

expectNoLeaks();

const DIST = pathToFileURL(join(import.meta.dirname, '..', '..', 'dist', 'index.js')).href;
// hostile-exec leaves this real-time signal ignored for the agent.
const INHERITED_IGNORED = 40;

/** One bit per signal, as /proc/<pid>/status prints the masks: signal n is bit n-1. */
const mask = (...signals: number[]): bigint => signals.reduce((m, s) => m | (1n << BigInt(s - 1)), 0n);

interface SignalState {
  SigIgn: string;
  SigCgt: string;
  SigBlk: string;
}

// Runs as the agent: a handler of its own, then three spawns (the first
// finds out whether clone3 is refused, the rest take the path it chose), each
// child printing its status.
const AGENT = `
import { text } from 'node:stream/consumers';
import { readFileSync } from 'node:fs';
import { capabilities, spawn } from ${JSON.stringify(DIST)};
const signals = (status) => Object.fromEntries(status.split('\\n').filter((l) => /^Sig(Ign|Cgt|Blk):/.test(l)).map((l) => l.split(/:\\s+/)));
process.on('SIGUSR2', () => {});
// The sanitizer run preloads libasan into this node for the addon's sake;
// preloaded into cat it would install handlers of its own.
const env = { ...process.env };
delete env.LD_PRELOAD;
const agent = signals(readFileSync('/proc/self/status', 'utf8'));
const children = [];
for (let i = 0; i < 3; i++) {
  const h = spawn('/bin/cat', ['/proc/self/status'], { stdio: ['ignore', 'pipe', 'ignore'], env });
  const [out, exit] = await Promise.all([text(h.stdout), h.exited]);
  if (exit.code !== 0) throw new Error('cat ended ' + JSON.stringify(exit));
  children.push(signals(out));
}
process.stdout.write(JSON.stringify({ backend: capabilities().backend, agent, children }));
`;

let dir: ReturnType<typeof tmpDir>;
let hostileExec: string;
beforeAll(() => {
  dir = tmpDir('custody-sigstate-');
  hostileExec = compileC('hostile-exec', dir.path);
});
afterAll(() => dir.cleanup());

function runAgent(mode: 'clone3' | 'no-clone3'): { backend: string; agent: SignalState; children: SignalState[] } {
  const out = execFileSync(hostileExec, [mode, process.execPath, '--input-type=module', '-e', AGENT], {
    env: { ...process.env, CUSTODY_BACKEND: backend.name },
    timeout: 30_000,
    encoding: 'utf8',
  });
  return JSON.parse(out);
}

const hex = (m: string): bigint => BigInt(`0x${m}`);

describe.each(['clone3', 'no-clone3'] as const)('a program spawned by an agent on a host with %s', (mode) => {
  it.skipIf(process.arch !== 'x64' && mode === 'no-clone3')(
    'starts with default dispositions but for an inherited ignored real-time signal, nothing blocked',
    () => {
      const run = runAgent(mode);
      expect(run.backend).toBe(backend.name);
      // The hostile state is really there in the agent: Node's own ignores,
      // the inherited one, and a handler.
      const agentIgnores = hex(run.agent.SigIgn);
      expect(agentIgnores & mask(13, 25, INHERITED_IGNORED)).toBe(mask(13, 25, INHERITED_IGNORED));
      expect(hex(run.agent.SigCgt) & mask(12)).toBe(mask(12));
      expect(run.children).toHaveLength(3);
      for (const child of run.children) {
        expect(hex(child.SigIgn)).toBe(mask(INHERITED_IGNORED));
        expect(hex(child.SigCgt)).toBe(0n);
        expect(hex(child.SigBlk)).toBe(0n);
      }
    },
  );
});
