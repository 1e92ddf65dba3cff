import { execFile, execFileSync } from 'node:child_process';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { backend } from '../../src/backend/index.js';
import { Supervisor, type CustodyEvent, type SupervisorOptions } from '../../src/index.js';
import { asNamespaceInit, MARKER, SIGNAL_LOGGER, tmpDir } from './procs.js';

export const FIXTURES = join(import.meta.dirname, '..', 'fixtures');
export const FAKE_VM = join(FIXTURES, 'fake-vm.py');
export const LAUNCHER = join(FIXTURES, 'launcher.sh');
/**
 * The real interpreter, not a shim: a pyenv shim is a shell script that
 * execs python after custody has confirmed the shim (which is exactly the
 * pre-exec trap confirm exists for, but not what these tests are about).
 */
export const PERL = execFileSync('sh', ['-c', 'command -v perl'], { encoding: 'utf8' }).trim();

/**
 * A launcher's shell script (for `sh -c`) that execs `"$0" -e "sleep 30" --
 * "$1" "$2"` (perl, a token, a marker) once the file "$3" exists, waiting
 * up to 20 s: a test kills the launch's supervisor first, then opens the
 * gate, so the launch is cut off before its exec however loaded the
 * machine is. A fixed sleep here loses that race now and then.
 */
export const GATED_PERL_LAUNCH =
  'for i in $(seq 1000); do [ -e "$3" ] && break; sleep 0.02; done; exec "$0" -e "sleep 30" -- "$1" "$2"';
export const PYTHON = execFileSync('python3', ['-c', 'import sys; print(sys.executable)'], { encoding: 'utf8' }).trim();

/**
 * Runs test/fixtures/recover-ns.mjs as pid 1 of a new PID namespace, on this
 * backend, with its state and signal log in `dir`: its one JSON report, as
 * JSON.parse gives it (each test reads the fields of its mode).
 * `extra` follows the fixture's fixed arguments (the strace path, for one mode).
 */
export async function recoverInNamespace(
  mode: string,
  dir: string,
  trials: number,
  options: { timeoutMs: number; extra?: string[] },
): Promise<ReturnType<typeof JSON.parse>> {
  const args = [mode, join(dir, 'state'), String(trials), SIGNAL_LOGGER, LAUNCHER, PERL, join(dir, 'signals.log')];
  const { stdout } = await promisify(execFile)(
    'unshare',
    asNamespaceInit(join(FIXTURES, 'recover-ns.mjs'), ...args, FAKE_VM, PYTHON, ...(options.extra ?? [])),
    { env: { ...process.env, CUSTODY_BACKEND: backend.name }, timeout: options.timeoutMs, maxBuffer: 16 << 20 },
  );
  return JSON.parse(stdout.trim().split('\n').pop()!);
}

/** A supervisor on a fresh state dir, with its events collected. */
export async function openSupervisor(extra: Partial<SupervisorOptions> = {}) {
  const dir = tmpDir('custody-state-');
  const stateDir = join(dir.path, 'state');
  const events: CustodyEvent[] = [];
  const sink = extra.onEvent;
  const { supervisor, report } = await Supervisor.open({
    stateDir,
    ...extra,
    onEvent: (e) => {
      sink?.(e);
      events.push(e);
    },
  });
  return {
    supervisor,
    report,
    events,
    stateDir,
    root: dir.path,
    async dispose() {
      // Stop whatever a failed test left running, then drop the dir.
      for (const info of supervisor.list()) {
        if (info.status === 'running' || info.status === 'exited')
          await supervisor.stop(info.id, { graceMs: 500 }).catch(() => {});
      }
      await supervisor.close();
      dir.cleanup();
    },
  };
}

/** argv for the fake VM: python3 fake-vm.py --socket S --token T <marker> ...extra */
export function vmArgs(socket: string, token: string, extra: string[] = []): string[] {
  return [FAKE_VM, '--socket', socket, '--token', token, '--marker', MARKER, ...extra];
}
