// Process trees (src/process/tree.ts): what terminateTree() finds beyond
// the children it starts with. A child forked after SIGTERM (while the
// grace runs) is found by the rescans and ended; a process re-parented away
// from the tree counts only through the session custody made, and only when
// that session is named; a process outside both is never touched.
import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { descendants, spawn, terminateTree } from '../../src/index.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { processesWithMarker } from '../helpers/leaks.js';
import { catchesSignal, isGone, killOwn, MARKER, waitFor } from '../helpers/procs.js';
import { PERL } from '../helpers/supervisor.js';

const cleanups = cleanupAfterEach({ marker: MARKER });

/** Every process of this test (by the marker in its argv) is killed after it, whatever the test did. */
function killMarkedAfter(): void {
  cleanups.push(async () => {
    const left = () => processesWithMarker(MARKER).filter((p) => p.state !== 'Z');
    for (const p of left()) killOwn(p.pid);
    await waitFor(() => left().length === 0, 5000, 'the marked processes to end');
  });
}

/** The kernel's own list of a process's children (not custody's walk), empty once the orphan's parent has exited. */
const childless = (pid: number) => readFileSync(`/proc/${pid}/task/${pid}/children`, 'utf8').trim() === '';

const byName = (name: string) =>
  processesWithMarker(MARKER).find((p) => p.cmd.includes(` ${name} `) && p.state !== 'Z');

describe(`process trees (${backend.name})`, () => {
  it('ends a child forked during the grace, escalating for it, and never a bystander', async () => {
    killMarkedAfter();
    // On its first SIGTERM the root (which ignores it otherwise) forks a child that ignores SIGTERM too: only a
    // rescan after the signal can find it.
    const forker = `my $once; $SIG{TERM} = sub { return if $once++; exec($^X, '-e', '$SIG{TERM} = "IGNORE"; sleep 60', '--', 'late', $ARGV[0]) if !fork }; sleep 60 while 1`;
    const root = spawn(PERL, ['-e', forker, MARKER]);
    const bystander = spawn(PERL, ['-e', 'sleep 60', '--', 'bystander', MARKER]);
    cleanups.push(() => bystander.close());
    await waitFor(() => byName('bystander'), 5000, 'the bystander');
    await waitFor(() => catchesSignal(root.pid, 15), 5000, "the root's SIGTERM handler");
    const escalations: number[] = [];
    const r = await terminateTree(root, { graceMs: 1000, onEscalate: ({ pid }) => escalations.push(pid) });
    expect(r).toMatchObject({ outcome: 'exited', escalated: true });
    expect(escalations).toEqual([root.pid]);
    expect(r.members).toHaveLength(2);
    expect(r.members[0]).toBe(root.pid);
    const late = r.members[1]!;
    expect(isGone(late)).toBe(true);
    expect(r.members).not.toContain(bystander.pid);
    expect(bystander.isAlive()).toBe(true);
    bystander.signal('SIGKILL');
    await bystander.exited;
  });

  it('a member re-parented away is found through the session custody made, only when it is named', async () => {
    killMarkedAfter();
    // The root leads a session of its own; its child forks the orphan-to-be and exits, so the orphan
    // leaves the tree (re-parented to init) but stays in the root's session.
    const prog = `my $p = fork; if (!$p) { exec($^X, '-e', 'sleep 60', '--', 'orphan', $ARGV[0]) if !fork; exit 0 } waitpid($p, 0); sleep 60`;
    const first = spawn(PERL, ['-e', prog, MARKER], { detached: true });
    const orphan = await waitFor(() => byName('orphan'), 5000, 'the orphan');
    // The orphan can exec before its parent exits: until then it is still in the tree.
    await waitFor(() => childless(first.pid), 5000, 'the orphan to be re-parented');
    const pinned = descendants(first.pid);
    expect(pinned.map((d) => d.pid)).not.toContain(orphan.pid);
    for (const d of pinned) d.close();
    // Without the session: the tree is the root alone, and the orphan lives on.
    const bare = await terminateTree(first, { graceMs: 2000 });
    expect(bare.members).toEqual([first.pid]);
    expect(isGone(orphan.pid)).toBe(false);
    first.close();
    killOwn(orphan.pid);
    await waitFor(() => isGone(orphan.pid), 5000, 'the first orphan');

    const second = spawn(PERL, ['-e', prog, MARKER], { detached: true });
    cleanups.push(() => second.close());
    const secondOrphan = await waitFor(() => byName('orphan'), 5000, 'the second orphan');
    await waitFor(() => childless(second.pid), 5000, 'the second orphan to be re-parented');
    const named = await terminateTree(second, { graceMs: 2000, session: second.pid });
    expect(named).toMatchObject({ outcome: 'exited', escalated: false });
    expect(named.members.sort()).toEqual([second.pid, secondOrphan.pid].sort());
    await waitFor(() => isGone(secondOrphan.pid), 5000, 'the orphan to be ended with its session');
  });

  it('refuses a pid that cannot be one before reading anything', () => {
    for (const bad of [0, -3, 1.5, 2 ** 32 + 1]) {
      expect(() => descendants(bad)).toThrow(expect.objectContaining({ code: 'ERR_CUSTODY_INVALID_ARG' }));
    }
  });
});
