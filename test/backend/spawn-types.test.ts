/**
 * spawn()'s stream types follow its stdio option. The expectTypeOf lines are
 * checked by `npm run typecheck` (tsc over test/, part of `npm test`); the
 * @ts-expect-error lines fail the type check if a stream is ever typed
 * non-null where it is not piped. Each case also runs, on both backends, so
 * the types are held to what spawn() really returns.
 */
import type { Readable, Writable } from 'node:stream';
import { describe, expect, expectTypeOf, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import type { StdioOption } from '../../src/index.js';
import { spawn } from '../../src/index.js';
import { expectNoLeaks } from '../helpers/leaks.js';

expectNoLeaks();

async function readAll(stream: Readable): Promise<string> {
  let out = '';
  for await (const chunk of stream) out += String(chunk);
  return out;
}

describe(`spawn() stream types (${backend.name})`, () => {
  it("stdio: 'pipe' types stdin, stdout and stderr non-null, and they are", async () => {
    const h = spawn('sh', ['-c', 'read line; echo "out $line"; echo err >&2'], { stdio: 'pipe' });
    expectTypeOf(h.stdin).toEqualTypeOf<Writable>();
    expectTypeOf(h.stdout).toEqualTypeOf<Readable>();
    expectTypeOf(h.stderr).toEqualTypeOf<Readable>();
    h.stdin.end('in\n');
    const [out, err] = await Promise.all([readAll(h.stdout), readAll(h.stderr)]);
    expect([out.trim(), err.trim()]).toEqual(['out in', 'err']);
    expect(await h.exited).toEqual({ code: 0, signal: null });
  });

  it('a [stdin, stdout, stderr] array types each stream by its own slot', async () => {
    const h = spawn('sh', ['-c', 'echo out'], { stdio: ['ignore', 'pipe', 'inherit'], cwd: '/' });
    expectTypeOf(h.stdin).toEqualTypeOf<null>();
    expectTypeOf(h.stdout).toEqualTypeOf<Readable>();
    expectTypeOf(h.stderr).toEqualTypeOf<null>();
    // @ts-expect-error stdin is not piped
    expect(() => h.stdin.end()).toThrow(TypeError);
    expect([h.stdin, h.stderr]).toEqual([null, null]);
    expect((await readAll(h.stdout)).trim()).toBe('out');
    expect(await h.exited).toEqual({ code: 0, signal: null });
  });

  it('no stdio, or one known only at run time, leaves every stream nullable', async () => {
    const ignored = spawn('true');
    expectTypeOf(ignored.stdout).toEqualTypeOf<Readable | null>();
    expect([ignored.stdin, ignored.stdout, ignored.stderr]).toEqual([null, null, null]);
    const chosen: StdioOption = process.env.CUSTODY_TEST_NEVER_SET ? 'ignore' : 'pipe';
    const piped = spawn('true', [], { stdio: chosen });
    expectTypeOf(piped.stdout).toEqualTypeOf<Readable | null>();
    // @ts-expect-error a stdio value known only at run time may not pipe
    piped.stdout.resume();
    piped.stderr?.resume();
    expect(piped.stdin).not.toBeNull();
    piped.stdin?.end();
    await Promise.all([ignored.exited, piped.exited]);
  });

  it('a file or fd target gives no stream', async () => {
    const h = spawn('true', [], { stdio: { fd: 2 } });
    expectTypeOf(h.stdout).toEqualTypeOf<null>();
    expect(h.stdout).toBeNull();
    expect(await h.exited).toEqual({ code: 0, signal: null });
  });
});
