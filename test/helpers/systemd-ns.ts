/**
 * A real systemd for tests, booted as pid 1 of new pid, mount, cgroup, uts,
 * ipc and net namespaces (test/fixtures/systemd-ns.sh), in a cgroup v2 of
 * the test's own, isolated from the host: private /run, /tmp, /var/tmp and
 * /var/log, cgroup2 alone at its /sys/fs/cgroup, only the test's own empty
 * targets. The agent under test runs inside the namespaces (`nsenter`), or
 * every target it is handed would be in another pid namespace. One boot per
 * suite: `boot()` in beforeAll, `shutdown()` in afterAll, which SIGKILLs the
 * init by its pid (the whole namespace goes with it), waits for it, and
 * removes what cgroups systemd made, children first, and the test's own.
 */
import { type ChildProcess, execFile, spawn } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, readdirSync, readFileSync, rmdirSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { CGROUP_MOUNT } from './cgroup.js';
import { isRoot, tmpDir, waitFor } from './procs.js';

const FIXTURE = new URL('../fixtures/systemd-ns.sh', import.meta.url).pathname;
/** The project's tree: the agent under test, dist/ and node_modules/ are run from it inside the namespace. */
const PROJECT = new URL('../..', import.meta.url).pathname.replace(/\/$/, '');
const SYSTEMD = '/lib/systemd/systemd';

function onPath(cmd: string): boolean {
  return (process.env.PATH ?? '/usr/bin:/bin').split(':').some((d) => d && existsSync(join(d, cmd)));
}

/** Why a systemd cannot be booted here, or null. Under CUSTODY_REQUIRE_DAEMONS=1 a missing systemd is a failure (skipIfNoSystemd). */
export const SYSTEMD_SKIP: string | null = (() => {
  if (!isRoot()) return 'needs root: mounts and namespaces for a systemd of its own';
  if (!existsSync(SYSTEMD) || !onPath('systemd-run') || !onPath('systemctl'))
    return 'systemd is not installed (Debian: apt-get install --no-install-recommends systemd; .ci/run installs it)';
  if (!onPath('unshare') || !onPath('nsenter')) return 'unshare and nsenter (util-linux) are not installed';
  if (!CGROUP_MOUNT) return 'no cgroup v2 mount here';
  return null;
})();

/** The reason to skip, or throws where CUSTODY_REQUIRE_DAEMONS=1 says systemd must be there. */
export function systemdSkip(): string | null {
  if (SYSTEMD_SKIP && process.env.CUSTODY_REQUIRE_DAEMONS === '1')
    throw new Error(`CUSTODY_REQUIRE_DAEMONS=1, but ${SYSTEMD_SKIP}`);
  return SYSTEMD_SKIP;
}

export interface Ran {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: string;
  stderr: string;
}

export class SystemdNs {
  /** The init's pid on the host. */
  readonly init: number;
  /** The host directory bound at `/run/host` inside. */
  readonly hostDir: string;
  /** The host path of the namespace's cgroup root (systemd's `-.slice`). */
  readonly cgroup: string;
  readonly #unshare: ChildProcess;
  readonly #cleanupDir: () => void;

  constructor(init: number, hostDir: string, cgroup: string, unshare: ChildProcess, cleanupDir: () => void) {
    this.init = init;
    this.hostDir = hostDir;
    this.cgroup = cgroup;
    this.#unshare = unshare;
    this.#cleanupDir = cleanupDir;
  }

  /** Runs a command inside every namespace of the init (bounded: `timeoutMs`, then SIGKILL). */
  run(argv: string[], timeoutMs = 20_000): Promise<Ran> {
    return new Promise((resolve) => {
      execFile(
        'nsenter',
        ['-t', String(this.init), '-a', ...argv],
        { timeout: timeoutMs, killSignal: 'SIGKILL', maxBuffer: 1 << 22 },
        (err, stdout, stderr) => {
          const e = err as (Error & { code?: number | string; signal?: NodeJS.Signals }) | null;
          resolve({
            code: e ? (typeof e.code === 'number' ? e.code : null) : 0,
            signal: e?.signal ?? null,
            stdout,
            stderr,
          });
        },
      );
    });
  }

  /** Runs a command inside and returns its stdout; throws on a failure, with its stderr. */
  async ok(argv: string[]): Promise<string> {
    const r = await this.run(argv);
    if (r.code !== 0) throw new Error(`${argv.join(' ')}: ${r.code ?? r.signal}: ${r.stderr}`);
    return r.stdout;
  }

  /** The host path of a cgroup as the namespace names it (`/system.slice/x.service`). */
  hostCgroup(node: string): string {
    return join(this.cgroup, node);
  }

  /** SIGKILL to the init by its pid, waited for; then the cgroups it made, children first, and ours. */
  async shutdown(): Promise<void> {
    try {
      process.kill(this.init, 'SIGKILL');
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'ESRCH') throw err;
    }
    const u = this.#unshare;
    if (u.exitCode === null && u.signalCode === null) await new Promise((r) => u.once('exit', r));
    // Every process of the namespace was killed with its init; their cgroups empty (bounded).
    await waitFor(
      () => readFileSync(join(this.cgroup, 'cgroup.events'), 'latin1').includes('populated 0'),
      10_000,
      `${this.cgroup} empty`,
    );
    removeDepthFirst(this.cgroup);
    this.#cleanupDir();
  }
}

/** rmdir of a cgroup and every cgroup below it, children first (at most 32 deep, as cgroup-tree's walk). */
function removeDepthFirst(dir: string, depth = 0): void {
  if (depth > 32) throw new Error(`${dir}: deeper than 32`);
  for (const e of readdirSync(dir, { withFileTypes: true })) {
    if (e.isDirectory()) removeDepthFirst(join(dir, e.name), depth + 1);
  }
  rmdirSync(dir);
}

/**
 * Boots the systemd: a cgroup of the test's own under the v2 mount, the
 * launching shell moved into it, `unshare` runs the boot script, whose init
 * writes its host pid into the host dir; then waits (bounded) until
 * `systemctl is-system-running` says running or degraded.
 */
export async function boot(): Promise<SystemdNs> {
  if (!CGROUP_MOUNT) throw new Error('no cgroup v2 mount');
  const cgroup = join(CGROUP_MOUNT, `custody-systemd-${process.pid}-${randomBytes(4).toString('hex')}`);
  mkdirSync(cgroup);
  const dir = tmpDir('custody-sdns-');
  const unshare = spawn(
    'sh',
    [
      '-c',
      'echo $$ >"$1/cgroup.procs" && shift && exec unshare --pid --mount --cgroup --uts --ipc --net --fork --propagation private "$@"',
      'sh',
      cgroup,
      FIXTURE,
      dir.path,
      // What the agent runs from, kept visible where the boot covers it (a clone in /tmp, as CI's may be).
      PROJECT,
      dirname(dirname(process.execPath)),
    ],
    { stdio: ['ignore', 'ignore', 'pipe'] },
  );
  let stderr = '';
  unshare.stderr?.on('data', (d: Buffer) => {
    stderr = (stderr + d.toString()).slice(-4000);
  });
  const pidFile = join(dir.path, 'init.pid');
  try {
    const init = await waitFor(
      () => {
        if (unshare.exitCode !== null) throw new Error(`the boot failed (${unshare.exitCode}): ${stderr}`);
        return existsSync(pidFile) && Number(readFileSync(pidFile, 'utf8'));
      },
      10_000,
      'the namespace init',
    );
    const ns = new SystemdNs(init, dir.path, cgroup, unshare, dir.cleanup);
    let state = '';
    for (let i = 0; i < 100; i++) {
      state = (await ns.run(['systemctl', 'is-system-running'], 5000)).stdout.trim();
      if (state === 'running' || state === 'degraded') return ns;
      await new Promise((r) => setTimeout(r, 100));
    }
    await ns.shutdown();
    throw new Error(`systemd in the namespace did not come up: ${state}; ${stderr}`);
  } catch (err) {
    if (unshare.exitCode === null) unshare.kill('SIGKILL');
    throw err;
  }
}
