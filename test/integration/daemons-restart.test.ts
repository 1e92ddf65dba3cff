// Daemons whose titles were said to change, across an agent restart, as
// they really behave. postgres run as the postgres user (`setpriv --reuid`,
// `uid` declared): its postmaster keeps its argv (only its children take
// titles such as "postgres: checkpointer"), and a restart adopts it as
// verified. haproxy -Ws reloaded with SIGUSR2: its master re-execs itself
// (same pid, same start, same program) and keeps its argv (the new worker
// carries `-sf <old>`), and a restart adopts it as verified. Readiness is
// what each says: postgres's socket accepting, haproxy's master CLI listing
// its worker. Skipped, saying why, where a program is not installed (.ci/run
// installs them); CUSTODY_REQUIRE_DAEMONS=1 makes a missing one a failure.
import { execFileSync } from 'node:child_process';
import { chmodSync, chownSync, existsSync, mkdirSync, readdirSync, writeFileSync } from 'node:fs';
import { createConnection } from 'node:net';
import { join } from 'node:path';
import { describe, expect, it, type TestContext } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { inspect } from '../../src/index.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { isGone, isRoot, MARKER, tmpDir, waitFor } from '../helpers/procs.js';
import { plainEnv } from './plain-env.js';
import { installed, restartingAgent } from './programs.js';

const cleanups = cleanupAfterEach({ marker: MARKER });

const HAPROXY = installed('haproxy');
const SETPRIV = installed('setpriv');
/** Debian's postgres binaries live in a versioned dir off PATH. */
const PG_BIN = (() => {
  try {
    const v = readdirSync('/usr/lib/postgresql').sort().at(-1);
    return v && existsSync(`/usr/lib/postgresql/${v}/bin/postgres`) ? `/usr/lib/postgresql/${v}/bin` : null;
  } catch {
    return null;
  }
})();

function need(t: TestContext, found: unknown, pkg: string): void {
  const why = `${pkg} is not installed (Debian: apt-get install ${pkg}; .ci/run installs it)`;
  if (!found && process.env.CUSTODY_REQUIRE_DAEMONS === '1') throw new Error(`CUSTODY_REQUIRE_DAEMONS=1, but ${why}`);
  t.skip(!found, why);
}

/** One request on a unix socket; resolves once the reply so far satisfies `done` (the master CLI keeps it open). */
function ask(sock: string, line: string, done: (reply: string) => boolean): Promise<string> {
  return new Promise((resolve, reject) => {
    let out = '';
    const c = createConnection(sock, () => c.write(line));
    c.setEncoding('utf8');
    c.setTimeout(2000, () => c.destroy(new Error(`no full reply on ${sock}: ${JSON.stringify(out.slice(0, 200))}`)));
    c.on('data', (d: string) => {
      out += d;
      if (done(out)) {
        c.destroy();
        resolve(out);
      }
    });
    c.once('error', reject);
  });
}

describe(`daemons across an agent restart (${backend.name})`, () => {
  it('postgres as the postgres user (uid declared): its postmaster keeps its argv, and a restart adopts it', async (t) => {
    need(t, PG_BIN && SETPRIV, 'postgresql');
    t.skip(!isRoot(), 'needs root: runs postgres as the postgres user');
    const dir = tmpDir('custody-pg-');
    cleanups.push(() => dir.cleanup());
    const pgUid = Number(execFileSync('id', ['-u', 'postgres'], { encoding: 'utf8' }).trim());
    const pgGid = Number(execFileSync('id', ['-g', 'postgres'], { encoding: 'utf8' }).trim());
    const data = join(dir.path, 'data');
    const run = join(dir.path, 'run');
    mkdirSync(run);
    chmodSync(dir.path, 0o755);
    chownSync(run, pgUid, pgGid);
    mkdirSync(data, { mode: 0o700 });
    chownSync(data, pgUid, pgGid);
    const asPg = [`--reuid=${pgUid}`, `--regid=${pgGid}`, '--init-groups', '--'];
    execFileSync(SETPRIV!, [...asPg, `${PG_BIN}/initdb`, '-D', data, '-A', 'trust', '--no-sync'], {
      stdio: 'ignore',
      env: plainEnv(),
      timeout: 60_000,
    });
    const a = restartingAgent({ stateDir: join(dir.path, 'state') }, (fn) => cleanups.push(fn));
    const { supervisor } = await a.open();
    const sock = join(run, '.s.PGSQL.5432');
    const inst = await supervisor.launch({
      id: 'db',
      command: SETPRIV!,
      executable: `${PG_BIN}/postgres`,
      uid: pgUid,
      // The token rides in cluster_name, which names the cluster in its children's titles.
      args: (tk) => [
        ...asPg,
        `${PG_BIN}/postgres`,
        '-D',
        data,
        '-k',
        run,
        '-c',
        'listen_addresses=',
        '-c',
        `cluster_name=${tk}`,
      ],
      ready: { socket: sock },
      env: plainEnv(),
      confirmTimeoutMs: 20_000,
      readyTimeoutMs: 30_000,
    });
    expect(inspect(inst.pid).uid).toBe(pgUid);
    // Its children take titles of their own; the postmaster does not.
    await waitFor(() => backend.children(inst.pid).length > 0, 10_000, 'the postmaster to start its children');
    expect(inspect(inst.pid).argv).toEqual(inst.identity.argv);
    const { report } = await a.open();
    expect(report.adopted).toEqual([{ id: 'db', pid: inst.pid }]);
    expect(report.repaired).toEqual([]);
    expect(report.quarantined).toEqual([]);
  }, 120_000);

  it('haproxy -Ws reloaded (its master re-execs itself): the same process, adopted after a restart', async (t) => {
    need(t, HAPROXY, 'haproxy');
    const dir = tmpDir('custody-haproxy-');
    cleanups.push(() => dir.cleanup());
    const master = join(dir.path, 'master.sock');
    const cfg = join(dir.path, 'haproxy.cfg');
    writeFileSync(
      cfg,
      [
        'defaults',
        '  mode tcp',
        '  timeout connect 1s',
        '  timeout client 1s',
        '  timeout server 1s',
        'listen front',
        `  bind unix@${join(dir.path, 'front.sock')}`,
        `  server none unix@${join(dir.path, 'nothing.sock')}`,
        '',
      ].join('\n'),
    );
    const a = restartingAgent({ stateDir: join(dir.path, 'state') }, (fn) => cleanups.push(fn));
    const { supervisor } = await a.open();
    // The master CLI answers once the master runs its loop (before that it takes no SIGUSR2): ready then.
    const workerListed = async () => {
      await ask(master, 'show proc\n', (reply) => /^\d+\s+worker\b/m.test(reply));
    };
    const inst = await supervisor.launch({
      id: 'lb',
      command: HAPROXY!,
      args: (tk) => ['-Ws', '-S', master, '-f', cfg, '-p', join(dir.path, `haproxy-${tk}.pid`)],
      ready: { socket: master, probe: workerListed },
      env: plainEnv(),
      readyTimeoutMs: 20_000,
    });
    const launched = inspect(inst.pid);
    const first = await waitFor(() => backend.children(inst.pid)[0], 10_000, 'the first worker');
    process.kill(inst.pid, 'SIGUSR2');
    await waitFor(() => backend.children(inst.pid).some((w) => w !== first), 10_000, 'a new worker after the reload');
    await waitFor(() => isGone(first), 10_000, 'the old worker to leave');
    // Re-exec'd: the same pid and start, the same argv for the master.
    expect(inspect(inst.pid)).toMatchObject({ startTicks: launched.startTicks, argv: launched.argv });
    const { report, supervisor: reopened } = await a.open();
    expect(report.adopted).toEqual([{ id: 'lb', pid: inst.pid }]);
    expect(report.quarantined).toEqual([]);
    expect((await reopened.stop('lb', { graceMs: 5000 })).outcome).toBe('exited');
    await waitFor(() => backend.children(inst.pid).length === 0 && isGone(inst.pid), 10_000, 'haproxy to end');
  }, 60_000);
});
