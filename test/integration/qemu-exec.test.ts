// Debian's QEMU launched as a VM manager launches it: as nobody, with raised
// memlock and nofile limits, a umask, its own OOM score and (native)
// no_new_privs, given by custody between clone and exec instead of a shell or
// setpriv around it. Checked through /proc/<pid>/status, limits and
// oom_score_adj of the running QEMU, and the mode of the QMP socket it made
// (the umask at work). Needs root (runAs) and QEMU; skipped, saying why,
// elsewhere.
import { chmodSync, chownSync, mkdirSync, readFileSync, statSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, afterEach, describe, expect, it } from 'vitest';
import { qmpQuit, qmpReady, qmpStatus } from '../../examples/qmp.js';
import { backend } from '../../src/backend/index.js';
import { expectNoLeaks, processesWithMarker } from '../helpers/leaks.js';
import { isGone, isRoot, MARKER } from '../helpers/procs.js';
import { openSupervisor } from '../helpers/supervisor.js';
import { plainEnv } from './plain-env.js';
import { installed, qemuArgs } from './programs.js';

const QEMU = installed('qemu-system-x86_64');
const NOBODY = 65534;
const MEMLOCK = 4 << 20;

expectNoLeaks({ marker: MARKER });

afterAll(() => {
  expect(
    processesWithMarker(MARKER).filter((p) => p.cmd.includes('qemu')),
    'QEMU left behind',
  ).toEqual([]);
});

let ctx: Awaited<ReturnType<typeof openSupervisor>> | undefined;
afterEach(async () => {
  await ctx?.dispose();
  ctx = undefined;
});

describe(`QEMU with exec attributes (${backend.name})`, () => {
  it('runs as nobody with its memlock and nofile limits, umask, OOM score (and no_new_privs)', async (t) => {
    if (QEMU === null && process.env.CUSTODY_REQUIRE_QEMU === '1') throw new Error('CUSTODY_REQUIRE_QEMU=1, no QEMU');
    t.skip(QEMU === null, 'qemu-system-x86_64 is not installed (Debian: apt-get install qemu-system-x86)');
    t.skip(!isRoot(), 'runAs to nobody needs root');
    ctx = await openSupervisor();
    // QEMU (as nobody) makes its QMP socket in a dir of its own; it must be able to reach it.
    chmodSync(ctx.root, 0o711);
    const vmDir = join(ctx.root, 'vm');
    mkdirSync(vmDir, { mode: 0o700 });
    chownSync(vmDir, NOBODY, NOBODY);
    const qmp = join(vmDir, 'qmp.sock');
    const native = backend.name === 'native';
    const inst = await ctx.supervisor.launch({
      id: 'vm',
      command: QEMU!,
      args: (tok) => qemuArgs(tok, qmp),
      env: plainEnv(),
      cwd: '/',
      confirmTimeoutMs: 30_000,
      ready: { socket: qmp, probe: qmpReady },
      readyTimeoutMs: 30_000,
      runAs: { uid: NOBODY, gid: NOBODY },
      rlimits: { memlock: MEMLOCK, nofile: [1024, 4096] },
      umask: 0o027,
      oomScoreAdj: 300,
      // The js backend cannot set it (capabilities().exec.noNewPrivileges).
      ...(native ? { noNewPrivileges: true } : {}),
    });
    const status = readFileSync(`/proc/${inst.pid}/status`, 'utf8');
    const limits = readFileSync(`/proc/${inst.pid}/limits`, 'utf8');
    expect(status).toMatch(new RegExp(`^Uid:\\s+${NOBODY}\\s+${NOBODY}\\s+${NOBODY}\\s+${NOBODY}$`, 'm'));
    expect(status).toMatch(new RegExp(`^Gid:\\s+${NOBODY}\\s+${NOBODY}\\s+${NOBODY}\\s+${NOBODY}$`, 'm'));
    expect(status).toMatch(/^Groups:\s*$/m);
    expect(status).toMatch(/^Umask:\s+0027$/m);
    expect(status).toMatch(new RegExp(`^NoNewPrivs:\\s+${native ? 1 : 0}$`, 'm'));
    expect(limits).toMatch(new RegExp(`^Max locked memory\\s+${MEMLOCK}\\s+${MEMLOCK}\\s`, 'm'));
    expect(limits).toMatch(/^Max open files\s+1024\s+4096\s/m);
    expect(readFileSync(`/proc/${inst.pid}/oom_score_adj`, 'utf8').trim()).toBe('300');
    // The socket QEMU bound: 0777 less the umask, owned by nobody.
    const sock = statSync(qmp);
    expect([sock.mode & 0o777, sock.uid]).toEqual([0o750, NOBODY]);
    expect(inst.identity.uid).toBe(NOBODY);
    expect(await qmpStatus(qmp)).toBe('running');
    const r = await ctx.supervisor.stop('vm', { graceMs: 10_000, graceful: (_i, signal) => qmpQuit(qmp, { signal }) });
    expect(r).toMatchObject({ outcome: 'exited', escalated: false, code: 0 });
    expect(isGone(inst.pid)).toBe(true);
  }, 60_000);
});
