/**
 * The end-of-suite check every behavioural suite runs: no zombie child, no
 * stray descendant process, no fd left open that the suite opened.
 */
import { readdirSync, readFileSync, readlinkSync } from 'node:fs';
import { afterAll, beforeAll, expect } from 'vitest';

function openFds(): Map<string, string> {
  const out = new Map<string, string>();
  for (const fd of readdirSync('/proc/self/fd')) {
    try {
      out.set(fd, readlinkSync(`/proc/self/fd/${fd}`));
    } catch {
      // the fd of the readdir itself, closed by now
    }
  }
  return out;
}

interface Proc {
  pid: number;
  ppid: number;
  state: string;
  cmd: string;
}

function processTable(): Proc[] {
  const out: Proc[] = [];
  for (const name of readdirSync('/proc')) {
    if (!/^\d+$/.test(name)) continue;
    try {
      const stat = readFileSync(`/proc/${name}/stat`, 'utf8');
      const close = stat.lastIndexOf(')');
      const rest = stat.slice(close + 2).split(' ');
      const cmd = readFileSync(`/proc/${name}/cmdline`, 'utf8').split('\0').join(' ').trim();
      out.push({ pid: Number(name), ppid: Number(rest[1]), state: rest[0]!, cmd });
    } catch {
      // gone
    }
  }
  return out;
}

/** Our descendants (children, grandchildren...), by walking ppid links. */
export function descendantsOf(root: number): Proc[] {
  const table = processTable();
  const kids = new Map<number, Proc[]>();
  for (const p of table) {
    if (!kids.has(p.ppid)) kids.set(p.ppid, []);
    kids.get(p.ppid)!.push(p);
  }
  const out: Proc[] = [];
  const stack = [root];
  while (stack.length) {
    for (const k of kids.get(stack.pop()!) ?? []) {
      out.push(k);
      stack.push(k.pid);
    }
  }
  return out;
}

/** Processes anywhere whose argv contains `marker` (for strays that were re-parented away). */
export function processesWithMarker(marker: string): Proc[] {
  return processTable().filter((p) => p.cmd.includes(marker) && p.pid !== process.pid);
}

/**
 * Every process this test worker starts inherits this variable (unless a
 * test gives a child an environment of its own), so a stray that double
 * forked away to init is still found by its environment.
 */
const ENV_MARKER = `CUSTODY_LEAK_MARKER=${process.pid}-${Date.now()}`;
process.env.CUSTODY_LEAK_MARKER = ENV_MARKER.split('=')[1];

export function processesWithEnvMarker(): Proc[] {
  return processTable().filter((p) => {
    if (p.pid === process.pid) return false;
    try {
      return readFileSync(`/proc/${p.pid}/environ`, 'latin1').split('\0').includes(ENV_MARKER);
    } catch {
      return false;
    }
  });
}

async function settle(check: () => boolean, ms = 3000): Promise<void> {
  const deadline = Date.now() + ms;
  while (!check() && Date.now() < deadline) await new Promise((r) => setTimeout(r, 20));
}

/**
 * Registers the checks around a suite. `marker`, when given, is a string
 * the suite puts in every argv it launches, so strays re-parented to init
 * are found too.
 */
export function expectNoLeaks(options: { marker?: string } = {}): void {
  let fdsBefore: Map<string, string>;
  let childrenBefore: Set<number>;
  beforeAll(() => {
    fdsBefore = openFds();
    childrenBefore = new Set(descendantsOf(process.pid).map((p) => p.pid));
  });
  afterAll(async () => {
    // Exits and closes are asynchronous: give in-flight reaps a moment.
    const strays = () => {
      const found = new Map<number, Proc>();
      for (const p of descendantsOf(process.pid)) if (!childrenBefore.has(p.pid)) found.set(p.pid, p);
      for (const p of processesWithEnvMarker()) if (!childrenBefore.has(p.pid)) found.set(p.pid, p);
      if (options.marker) for (const p of processesWithMarker(options.marker)) found.set(p.pid, p);
      return [...found.values()];
    };
    const leakedFds = () => [...openFds()].filter(([fd, target]) => fdsBefore.get(fd) !== target);
    await settle(() => strays().length === 0 && leakedFds().length === 0);
    const left = strays();
    expect(
      left.filter((p) => p.state === 'Z'),
      'zombies',
    ).toEqual([]);
    expect(left, 'stray processes').toEqual([]);
    expect(leakedFds(), 'open fds').toEqual([]);
  });
}
