// The custody CLI, run as users run it (node dist/cli/main.js), on state dirs a
// real Supervisor wrote and processes this suite starts: every exit status
// and both streams of every run are asserted.
import { type ChildProcess, execFile, execFileSync, spawn as cpSpawn } from 'node:child_process';
import {
  chmodSync,
  chownSync,
  existsSync,
  lstatSync,
  mkdirSync,
  readdirSync,
  readFileSync,
  readlinkSync,
  renameSync,
  statSync,
  symlinkSync,
  writeFileSync,
} from 'node:fs';
import { join, relative } from 'node:path';
import { randomBytes } from 'node:crypto';
import { describe, expect, it } from 'vitest';
import { backend } from '../../src/backend/index.js';
import { prefixLines } from '../../src/cli/logs.js';
import { inspect, logPaths, spawn, Supervisor } from '../../src/index.js';
import { cleanupAfterEach } from '../helpers/cleanups.js';
import { endOwn, isGone, isRoot, loggedSignals, MARKER, tmpDir, unusedPid, waitFor } from '../helpers/procs.js';
import { fill01, identityVars, write01 } from '../helpers/state.js';
import { PERL, PYTHON, vmArgs } from '../helpers/supervisor.js';

const cleanups = cleanupAfterEach({ marker: MARKER });

const CLI = join(import.meta.dirname, '..', '..', 'dist', 'cli', 'main.js');
const VERSION = JSON.parse(readFileSync(join(import.meta.dirname, '..', '..', 'package.json'), 'utf8'))
  .version as string;

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

/** The environment of a run: this backend, and no state dir unless the test names one. */
function cliEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const env: NodeJS.ProcessEnv = { ...process.env, CUSTODY_BACKEND: backend.name, ...extra };
  if (!('CUSTODY_STATE_DIR' in extra)) delete env.CUSTODY_STATE_DIR;
  return env;
}

/**
 * How long one run may take: far more than a CLI run takes on a loaded host (~2 s), and less than the
 * test's own timeout (30 s), so that a run that hangs fails its own test, saying where it hung, instead of
 * outliving it (it was then found by the suite's leak check, and why it hung was lost).
 */
const RUN_TIMEOUT_MS = 20_000;
/** How long a hung node run is given to write its diagnostic report (SIGUSR2) before SIGKILL. */
const REPORT_WAIT_MS = 2_000;

/** Each thread of a process as /proc shows it: tid, name, state, wait channel, syscall number (what a hang waits in). */
function threadStates(pid: number | undefined): string {
  if (pid === undefined) return '(never started)';
  const read = (tid: string, f: string) => {
    try {
      return readFileSync(`/proc/${pid}/task/${tid}/${f}`, 'utf8').trim();
    } catch (err) {
      return `(${(err as NodeJS.ErrnoException).code})`;
    }
  };
  try {
    return readdirSync(`/proc/${pid}/task`)
      .map((tid) => {
        const stat = read(tid, 'stat');
        const state = stat.slice(stat.lastIndexOf(')') + 2).split(' ')[0];
        return `  ${tid} ${read(tid, 'comm')} ${state} wchan=${read(tid, 'wchan')} syscall=${read(tid, 'syscall').split(' ')[0]}`;
      })
      .join('\n');
  } catch (err) {
    return `(gone: ${(err as Error).message})`;
  }
}

/**
 * Runs `file args` to its end (bounded), whatever its exit status. One still running after RUN_TIMEOUT_MS
 * fails the run with its threads' states and, for a node run (`report`), Node's diagnostic report (its
 * native stack and the libuv handles that kept it alive) on its stderr; it is killed either way.
 */
function run(file: string, args: string[], env = cliEnv(), report = false): Promise<Run> {
  return new Promise((resolve, reject) => {
    let hung: string | null = null;
    const child = execFile(file, args, { env, maxBuffer: 16 << 20 }, (err, stdout, stderr) => {
      clearTimeout(timer);
      clearTimeout(kill);
      if (hung !== null) {
        reject(
          new Error(
            `${[file, ...args].join(' ')} still ran after ${RUN_TIMEOUT_MS} ms; killed. Its threads then:\n${hung}\nstdout: ${stdout}\nstderr: ${stderr}`,
          ),
        );
        return;
      }
      const code = err ? (err as { code?: unknown }).code : 0;
      if (typeof code !== 'number') reject(err);
      else resolve({ code, stdout, stderr });
    });
    let kill: NodeJS.Timeout | undefined;
    const timer = setTimeout(() => {
      hung = threadStates(child.pid);
      if (!report) {
        child.kill('SIGKILL');
        return;
      }
      child.kill('SIGUSR2');
      kill = setTimeout(() => child.kill('SIGKILL'), REPORT_WAIT_MS);
    }, RUN_TIMEOUT_MS);
  });
}

/** Node's diagnostic report on SIGUSR2, to stderr: what run() asks a hung CLI for. */
const REPORT_FLAGS = ['--report-on-signal', '--report-signal=SIGUSR2', '--report-filename=stderr'];

const cli = (args: string[], env?: Record<string, string>) =>
  run(process.execPath, [...REPORT_FLAGS, CLI, ...args], cliEnv(env), true);

/** Many runs, a few at a time (the machine is shared). */
async function cliAll(runs: string[][]): Promise<Run[]> {
  const out: Run[] = [];
  for (let i = 0; i < runs.length; i += 4) out.push(...(await Promise.all(runs.slice(i, i + 4).map((a) => cli(a)))));
  return out;
}

function ran(r: Run | undefined): Run {
  if (!r) throw new Error('a run that cliAll did not make');
  return r;
}

/** A success: exit 0, and nothing on stderr. */
function ok(run: Run | undefined): string {
  const r = ran(run);
  expect(r, r.stderr).toMatchObject({ code: 0, stderr: '' });
  return r.stdout;
}

/** A usage error: exit 2, nothing on stdout, one line on stderr. */
function usage(run: Run | undefined, message: RegExp): void {
  const r = ran(run);
  expect(r.code, r.stderr).toBe(2);
  expect(r.stdout).toBe('');
  expect(r.stderr).toMatch(/^custody: [^\n]+ \(see custody (--help|help [a-z]+)\)\n$/);
  expect(r.stderr).toMatch(message);
}

/** An error: exit 1, nothing on stdout, one line on stderr: words, then the code in brackets. */
function failure(run: Run | undefined, code: string): string {
  const r = ran(run);
  expect(r.code, r.stderr).toBe(1);
  expect(r.stdout).toBe('');
  expect(r.stderr).toMatch(/^custody: [^\n]+\n$/);
  expect(r.stderr.endsWith(` [${code}]\n`), r.stderr).toBe(true);
  return r.stderr;
}

function scratch(): string {
  const d = tmpDir('custody-cli-');
  cleanups.push(() => d.cleanup());
  return d.path;
}

/** Every entry under dir with what a change would alter: what a read-only command must leave as it was. */
function snapshot(dir: string): string[] {
  const out: string[] = [];
  const walk = (d: string) => {
    for (const name of readdirSync(d).sort()) {
      const p = join(d, name);
      const st = lstatSync(p);
      out.push(`${relative(dir, p)} ${st.ino} ${st.mode.toString(8)} ${st.size} ${st.mtimeMs}`);
      if (st.isDirectory()) walk(p);
    }
  };
  walk(dir);
  return out;
}

/** Ends, by pid, what a test started and left; waits until each is gone. */
function endAtCleanup(pids: () => number[]): void {
  cleanups.push(() => endOwn(pids(), 10_000));
}

/** A state dir from a real Supervisor launch: fake VMs, those named in `tamper` quarantined at the next recovery. */
async function stateWithQuarantine(ids = ['ok', 'bad'], tamper = ['bad']) {
  const root = scratch();
  const stateDir = join(root, 'state');
  const log = join(root, 'signals.log');
  const { supervisor } = await Supervisor.open({ stateDir, onEvent: () => {} });
  const pids: Record<string, number> = {};
  endAtCleanup(() => Object.values(pids));
  try {
    for (const id of ids) {
      const socket = join(root, `${id}.sock`);
      const args = (t: string) => vmArgs(socket, t, ['--signal-log', log]);
      pids[id] = (await supervisor.launch({ id, command: PYTHON, args, ready: { socket } })).pid;
    }
  } finally {
    await supervisor.close();
  }
  for (const id of tamper) {
    const mPath = join(stateDir, id, 'manifest.json');
    const m = JSON.parse(readFileSync(mPath, 'utf8'));
    writeFileSync(mPath, JSON.stringify({ ...m, identity: { ...m.identity, startTicks: m.identity.startTicks + 3 } }));
  }
  return { stateDir, root, log, pids };
}

/**
 * A daemon that writes to both logs: a line on each at start (and the pid
 * of a child of its own, so that stopping the whole instance shows), and a
 * line on each at every SIGUSR1.
 */
const CHATTY = `
import signal, subprocess, sys, time
child = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(300)', sys.argv[2]])
n = 0
def usr1(num, frame):
    global n
    n += 1
    print('usr1 %d' % n, flush=True)
    print('usr1 %d err' % n, file=sys.stderr, flush=True)
signal.signal(signal.SIGUSR1, usr1)
print('out 1', flush=True)
print('err 1', file=sys.stderr, flush=True)
print('child %d' % child.pid, flush=True)
while True:
    time.sleep(3600)
`;

/** A Supervisor-launched chatty instance `vm`, its supervisor closed: what a CLI user finds. */
async function chattyInstance() {
  const root = scratch();
  const stateDir = join(root, 'state');
  const { supervisor } = await Supervisor.open({ stateDir, onEvent: () => {} });
  const pids: number[] = [];
  endAtCleanup(() => pids);
  try {
    pids.push((await supervisor.launch({ id: 'vm', command: PYTHON, args: (t) => ['-c', CHATTY, t, MARKER] })).pid);
  } finally {
    await supervisor.close();
  }
  const files = logPaths(stateDir, 'vm');
  const child = await waitFor(
    () => /^child (\d+)$/m.exec(existsSync(files.stdout) ? readFileSync(files.stdout, 'utf8') : '')?.[1],
    10_000,
    'the daemon to start its child',
  );
  pids.push(Number(child));
  await waitFor(() => readFileSync(files.stderr, 'utf8') === 'err 1\n', 10_000, 'the stderr line');
  return { stateDir, files, pid: pids[0]!, child: pids[1]! };
}

const SLEEP_300 = "b'-c', b'import time; time.sleep(300)'";

/** A python that execs itself with the given argv (Python expressions of bytes: any byte can be in one). */
function execvPython(args: string[]): ChildProcess {
  const code = `import os, sys; os.execv(sys.executable, [os.fsencode(sys.executable), ${args.join(', ')}])`;
  return cpSpawn(PYTHON, ['-c', code], { stdio: 'ignore' });
}

/** A CLI run that keeps going (logs --follow), its output collected; ended at cleanup by pid if still running. */
function started(args: string[]) {
  const child: ChildProcess = cpSpawn(process.execPath, [CLI, ...args], {
    env: cliEnv(),
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  const out = { stdout: '', stderr: '' };
  child.stdout!.on('data', (d: Buffer) => (out.stdout += d.toString()));
  child.stderr!.on('data', (d: Buffer) => (out.stderr += d.toString()));
  const done = new Promise<Run>((resolve) =>
    child.once('close', (code, signal) => resolve({ code: code ?? (signal ? 128 : -1), ...out })),
  );
  cleanups.push(async () => {
    if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
    await done;
  });
  return { child, out, done };
}

/**
 * The usage tests start a CLI run per case, all at once (up to 26 node processes): under the sanitizer's
 * preload on a loaded 2-CPU host one took 31 s. Each run keeps its own RUN_TIMEOUT_MS; the tests get room for
 * their count of runs.
 */
const MANY_RUNS_TIMEOUT_MS = 90_000;

describe(`custody CLI: help, version, usage (${backend.name})`, { timeout: MANY_RUNS_TIMEOUT_MS }, () => {
  const commands = ['ls', 'inspect', 'logs', 'stop', 'recover', 'release', 'sweep'];

  it('--help, -h and help print the overview on stdout and exit 0; --version prints the version', async () => {
    const [long, short, word, version] = await cliAll([['--help'], ['-h'], ['help'], ['--version']]);
    const text = ok(long);
    expect(text).toMatch(/^usage: custody <command> \[options\]/);
    expect(text).toContain('npx custody');
    // Where the state dir comes from is in the first lines, before the commands.
    expect(text.split('\n').slice(0, 4).join('\n')).toMatch(/--state-dir DIR, or \$CUSTODY_STATE_DIR/);
    for (const c of [...commands, 'help']) expect(text).toMatch(new RegExp(`^  ${c} +\\S`, 'm'));
    expect(ok(short)).toBe(text);
    expect(ok(word)).toBe(text);
    expect(ok(version)).toBe(`${VERSION}\n`);
  });

  it("help COMMAND, COMMAND --help and COMMAND -h print that command's help on stdout and exit 0", async () => {
    const runs = await cliAll(
      commands.flatMap((c) => [
        ['help', c],
        [c, '--help'],
        [c, '-h'],
      ]),
    );
    commands.forEach((c, i) => {
      const text = ok(runs[3 * i]);
      expect(text).toMatch(new RegExp(`^usage: custody ${c} `));
      expect(text).toMatch(/^options:$/m);
      expect(text).toMatch(/^ {2}-h, --help +this help$/m);
      expect(ok(runs[3 * i + 1])).toBe(text);
      expect(ok(runs[3 * i + 2])).toBe(text);
    });
    // Help wins over whatever else is wrong with the line.
    expect(ok(await cli(['inspect', 'abc', '--help']))).toMatch(/^usage: custody inspect PID/);
    expect(ok(await cli(['ls', '--bogus', '-h']))).toMatch(/^usage: custody ls /);
  });

  it('a bad invocation is one line on stderr and exit 2, before anything is opened or created', async () => {
    const root = scratch();
    const missing = join(root, 'state');
    const cases: Array<[string[], RegExp]> = [
      [[], /no command given/],
      [['frobnicate'], /unknown command "frobnicate"/],
      [['help', 'frobnicate'], /unknown command "frobnicate"/],
      [['--version', 'ls'], /--version takes nothing else/],
      [['inspect'], /inspect needs PID/],
      [['inspect', 'abc'], /PID must be a number, got "abc"/],
      [['inspect', '-1'], /PID must be a positive integer, got -1/],
      [['inspect', '0'], /PID must be a positive integer/],
      [['inspect', '99999999999'], /PID must be at most \d+ \(kernel\.pid_max\)/],
      [['inspect', '1', '2'], /inspect takes one PID; unexpected "2"/],
      [['ls', '--bogus'], /unknown option --bogus for ls/],
      [['ls'], /ls needs --state-dir DIR \(or CUSTODY_STATE_DIR\)/],
      [['ls', '--json=yes'], /--json takes no value/],
      [['ls', '--state-dir'], /--state-dir needs a value \(DIR\)/],
      [['stop', '--state-dir', missing], /stop needs ID/],
      [['stop', 'bad id', '--state-dir', missing], /id must be/],
      [['stop', '.vm', '--state-dir', missing], /not starting with a dot/],
      [['stop', 'vm', '--grace-ms', '5s', '--state-dir', missing], /--grace-ms must be a whole number of milliseconds/],
      [['logs', 'vm', '-n', '-3', '--state-dir', missing], /-n must be a whole number, got "-3"/],
      [['logs', 'vm', '--stream', 'both', '--state-dir', missing], /--stream must be stdout or stderr, got "both"/],
      [['release', '--state-dir', missing], /release takes one ID or --all/],
      [['release', 'x', '--all', '--state-dir', missing], /release takes one ID or --all/],
      [['release', '../x', '--state-dir', missing], /not a name in a state dir/],
      [['sweep', '--', 'sleep', '300'], /sweep needs --exact -- ARGV/],
      [['sweep', '--exact'], /sweep needs --exact -- ARGV/],
      // ARGV typed without its `--`: the message says so, and how the line should read.
      [['sweep', '--exact', 'sleep', '300'], /the -- is missing: custody sweep --exact -- sleep 300 /],
      [['sweep', '--exact', '--uid', 'me', '--', 'sleep'], /--uid must be a whole number/],
    ];
    const runs = await cliAll(cases.map(([args]) => args));
    for (const [i, [, message]] of cases.entries()) usage(runs[i], message);
    expect(existsSync(missing)).toBe(false);
  });

  it('under --json an error is one JSON object on stderr: a usage error (exit 2) and an error (exit 1)', async () => {
    const root = scratch();
    const missing = join(root, 'state');
    const [bad, absent, plain] = await cliAll([
      ['ls', '--json', '--bogus'],
      ['ls', '--json', '--state-dir', missing],
      ['ls', '--state-dir', missing],
    ]);
    const oneObject = (r: Run | undefined, code: number) => {
      const x = ran(r);
      expect(x.code, x.stderr).toBe(code);
      expect(x.stdout).toBe('');
      expect(x.stderr).toMatch(/^\{[^\n]*\}\n$/);
      return JSON.parse(x.stderr);
    };
    expect(oneObject(bad, 2)).toEqual({
      error: { code: 'ERR_CUSTODY_USAGE', message: 'unknown option --bogus for ls (see custody help ls)' },
    });
    expect(oneObject(absent, 1)).toEqual({
      error: { code: 'ERR_CUSTODY_NO_STATE_DIR', message: `state dir ${missing} does not exist` },
    });
    // Without --json the same error is the line in words.
    failure(plain, 'ERR_CUSTODY_NO_STATE_DIR');
    expect(existsSync(missing)).toBe(false);
  });
});

describe(`custody inspect (${backend.name})`, () => {
  it('shows the identity: the exe as its path beside dev:ino, argv bytes that are not UTF-8 as \\xNN', async () => {
    // argv[4] is the byte 0xff and then the marker: not UTF-8.
    const child = execvPython([SLEEP_300, "'caf\\u00e9'.encode()", `b'\\xff${MARKER}'`]);
    endAtCleanup(() => [child.pid!]);
    const pid = child.pid!;
    const id = await waitFor(
      () => {
        const i = inspect(pid);
        return i.argv[1] === '-c' && i.argv.length === 5 ? i : null;
      },
      10_000,
      'the exec',
    );
    expect(id.argv[4]).toBe(`\udcff${MARKER}`);
    const exe = readlinkSync(`/proc/${pid}/exe`);
    expect(statSync(exe)).toMatchObject({ dev: id.exe!.dev, ino: id.exe!.ino });

    const human = ok(await cli(['inspect', String(pid)]));
    expect(human).toMatch(new RegExp(`^pid {9}${pid}$`, 'm'));
    expect(human).toMatch(new RegExp(`^startTicks {2}${id.startTicks}$`, 'm'));
    expect(human).toContain(`\nexe         ${exe} (${id.exe!.dev}:${id.exe!.ino})\n`);
    expect(human).toContain(`\nargv        ${id.argv[0]} -c "import time; time.sleep(300)" café "\\xff${MARKER}"\n`);

    const json = JSON.parse(ok(await cli(['inspect', String(pid), '--json'])));
    // custody's lossless form, byte for byte, and the path read beside it.
    // And its cgroup v2, as /proc/<pid>/cgroup names it.
    const cgroup = readFileSync(`/proc/${pid}/cgroup`, 'utf8').match(/^0::(.*)$/m)?.[1] ?? null;
    expect(json).toEqual({ ...id, state: json.state, exePath: exe, cgroup });
  });

  it('a pid with no process, and a thread, are errors in words with their codes', async () => {
    const gone = unusedPid();
    const tid = readdirSync(`/proc/${process.pid}/task`)
      .map(Number)
      .find((t) => t !== process.pid)!;
    const [none, thread] = await cliAll([
      ['inspect', String(gone)],
      ['inspect', String(tid)],
    ]);
    expect(failure(none, 'ESRCH')).toBe(`custody: no process ${gone} (it may have exited) [ESRCH]\n`);
    expect(failure(thread, 'ERR_CUSTODY_NOT_A_PROCESS')).toContain(`pid ${tid} is a thread of process ${process.pid}`);
  });
});

describe(`custody ls (${backend.name})`, () => {
  it('lists each instance with its verdict, entries without a manifest, foreign files; changes nothing', async () => {
    const s = await stateWithQuarantine();
    mkdirSync(join(s.stateDir, 'half'), { mode: 0o700 });
    writeFileSync(join(s.stateDir, 'notes.txt'), 'mine\n');
    const before = snapshot(s.stateDir);
    const json = JSON.parse(ok(await cli(['ls', '--state-dir', s.stateDir, '--json'])));
    expect(json).toMatchObject({ stateDir: s.stateDir, format: 3, foreign: ['notes.txt'] });
    expect(json.instances).toEqual([
      expect.objectContaining({ id: 'bad', state: 'running', pid: s.pids.bad, verdict: 'reused', field: 'startTicks' }),
      expect.objectContaining({ id: 'half', state: 'incomplete', pid: null, verdict: null }),
      expect.objectContaining({ id: 'ok', state: 'running', pid: s.pids.ok, verdict: 'ok', command: PYTHON }),
    ]);
    // The same from $CUSTODY_STATE_DIR, and with the option before the command.
    // (Uptime is whole seconds: it may have moved on between the two runs.)
    const timeless = (j: { instances: Array<Record<string, unknown>> }) => ({
      ...j,
      instances: j.instances.map(({ uptimeSeconds: _, ...rest }) => rest),
    });
    const fromEnv = JSON.parse(ok(await cli(['ls', '--json'], { CUSTODY_STATE_DIR: s.stateDir })));
    expect(timeless(fromEnv)).toEqual(timeless(json));
    const human = ok(await cli(['--state-dir', s.stateDir, 'ls'])).split('\n');
    expect(human[0]).toBe(`state dir ${s.stateDir}: format 3`);
    expect(human[1]).toMatch(/^ID\s+STATE\s+PID\s+VERDICT\s+UPTIME\s+LAST\s+RESTARTS\s+REASON\s+ARGS$/);
    // The arguments, not only argv[0]: the process's argv as recorded, clipped to the column.
    const args = (id: string) => json.instances.find((i: { id: string }) => i.id === id).argv as string[];
    expect(args('ok')).toEqual(inspect(s.pids.ok!).argv);
    expect(args('ok').length).toBeGreaterThan(2);
    const shown = (id: string) => args(id).join(' ').slice(0, 99);
    // A process that no longer verifies has no uptime; one that does has run a while.
    expect(human[2]).toMatch(
      new RegExp(`^bad\\s+running\\s+${s.pids.bad}\\s+reused:startTicks\\s+-\\s+-\\s+0\\s+-\\s+`),
    );
    expect(human[2]).toContain(shown('bad'));
    expect(human[3]).toMatch(/^half\s+incomplete\s+-\s+-\s+-\s+-\s+-\s+manifest .*no manifest/);
    expect(human[4]).toMatch(new RegExp(`^ok\\s+running\\s+${s.pids.ok}\\s+ok\\s+\\d+(s|m\\d\\ds)\\s+-\\s+0\\s+-\\s+`));
    expect(human[4]).toContain(shown('ok'));
    const okRow = json.instances.find((i: { id: string }) => i.id === 'ok');
    expect(okRow).toMatchObject({ restarts: 0, uptimeSeconds: expect.any(Number) });
    expect(okRow.uptimeSeconds).toBeGreaterThanOrEqual(0);
    expect(json.instances.find((i: { id: string }) => i.id === 'bad')).toMatchObject({ uptimeSeconds: null });
    expect(human.slice(5)).toEqual(["not custody's (left alone): notes.txt", '']);
    expect(snapshot(s.stateDir)).toEqual(before);
  });

  it("a dir that does not exist or is not custody's is an error in words; nothing is created", async () => {
    const root = scratch();
    const home = join(root, 'home');
    mkdirSync(home, { mode: 0o700 });
    writeFileSync(join(home, '.bashrc'), '');
    const before = snapshot(root);
    const [missing, notOurs] = await cliAll([
      ['ls', '--state-dir', join(root, 'typo')],
      ['ls', '--state-dir', home],
    ]);
    expect(failure(missing, 'ERR_CUSTODY_NO_STATE_DIR')).toBe(
      `custody: state dir ${join(root, 'typo')} does not exist [ERR_CUSTODY_NO_STATE_DIR]\n`,
    );
    expect(failure(notOurs, 'ERR_CUSTODY_NOT_CUSTODY_DIR')).toContain(`${home} is not a custody state dir`);
    for (const args of [['recover'], ['release', '--all'], ['stop', 'vm'], ['logs', 'vm']]) {
      failure(await cli([...args, '--state-dir', join(root, 'typo')]), 'ERR_CUSTODY_NO_STATE_DIR');
    }
    expect(snapshot(root)).toEqual(before);
  });
});

describe(`custody recover, release, stop (${backend.name})`, () => {
  it('recover prints the report; release ID and release --all clear quarantines and signal nothing', async () => {
    const s = await stateWithQuarantine(['ok', 'bad', 'worse'], ['bad', 'worse']);
    const report = JSON.parse(ok(await cli(['recover', '--state-dir', s.stateDir, '--json'])));
    expect(report).toMatchObject({ stateDir: s.stateDir, upgradedFrom: null, repaired: [], cleaned: [], deferred: [] });
    expect(report.adopted).toEqual([{ id: 'ok', pid: s.pids.ok }]);
    expect(report.quarantined).toEqual([
      { id: 'bad', pid: s.pids.bad, reason: 'reused', field: 'startTicks' },
      { id: 'worse', pid: s.pids.worse, reason: 'reused', field: 'startTicks' },
    ]);
    const human = ok(await cli(['recover', '--state-dir', s.stateDir])).split('\n');
    expect(human[0]).toMatch(/^OUTCOME\s+ID\s+PID\s+REASON$/);
    expect(human.slice(1, 4).map((l) => l.split(/\s+/))).toEqual([
      ['adopted', 'ok', String(s.pids.ok), '-'],
      ['quarantined', 'bad', String(s.pids.bad), 'reused:startTicks'],
      ['quarantined', 'worse', String(s.pids.worse), 'reused:startTicks'],
    ]);

    // The remedy a CLI user can run, not the library's call; the code stays.
    expect(failure(await cli(['stop', 'bad', '--state-dir', s.stateDir]), 'ERR_CUSTODY_QUARANTINED')).toMatch(
      /^custody: instance bad is quarantined \(.+\); run `custody release bad` first \[ERR_CUSTODY_QUARANTINED\]\n$/,
    );
    expect(ok(await cli(['release', 'bad', '--state-dir', s.stateDir]))).toBe(
      `released bad (pid ${s.pids.bad}); nothing was signalled\n`,
    );
    failure(await cli(['release', 'bad', '--state-dir', s.stateDir]), 'ERR_CUSTODY_NOT_FOUND');
    const all = JSON.parse(ok(await cli(['release', '--all', '--state-dir', s.stateDir, '--json'])));
    expect(all).toEqual({ released: [{ id: 'worse', pid: s.pids.worse }] });
    expect(ok(await cli(['release', '--all', '--state-dir', s.stateDir]))).toBe(
      'no instance is quarantined; nothing released\n',
    );
    const after = JSON.parse(ok(await cli(['ls', '--state-dir', s.stateDir, '--json'])));
    expect(after.instances.map((x: { id: string }) => x.id)).toEqual(['ok']);
    expect(loggedSignals(s.log)).toEqual([]);
    expect(Object.values(s.pids).map(isGone)).toEqual([false, false, false]);
  });

  it('refuses to change a dir a running supervisor holds, naming the holder; ls and logs still read it', async () => {
    const s = await stateWithQuarantine();
    const { supervisor } = await Supervisor.open({ stateDir: s.stateDir, onEvent: () => {} });
    cleanups.push(() => supervisor.close());
    const changes = [['recover'], ['release', 'bad'], ['release', '--all'], ['stop', 'ok']];
    const runs = await cliAll(changes.map((a) => [...a, '--state-dir', s.stateDir]));
    for (const r of runs) {
      expect(failure(r, 'ERR_CUSTODY_STATE_LOCKED')).toContain(
        `state dir ${s.stateDir} is locked by pid ${process.pid}`,
      );
    }
    const ls = JSON.parse(ok(await cli(['ls', '--state-dir', s.stateDir, '--json'])));
    expect(ls.instances.map((x: { id: string }) => x.id)).toEqual(['bad', 'ok']);
    // The fake VM writes nothing: its logs exist, and are empty.
    expect(ok(await cli(['logs', 'ok', '--state-dir', s.stateDir]))).toBe('');
    expect(loggedSignals(s.log)).toEqual([]);
    expect(new Map(supervisor.list().map((i) => [i.id, i.status]))).toEqual(
      new Map([
        ['ok', 'running'],
        ['bad', 'quarantined'],
      ]),
    );
  });

  it('stop ends the whole instance and removes its state; logs print it after (post-mortem)', async () => {
    const d = await chattyInstance();
    expect(ok(await cli(['logs', 'vm', '--state-dir', d.stateDir, '--stream', 'stderr']))).toBe('err 1\n');
    const r = await cli(['stop', 'vm', '--grace-ms', '5000', '--state-dir', d.stateDir]);
    expect(ok(r)).toMatch(
      new RegExp(
        `^stopped vm \\(pid ${d.pid}\\): exited \\((signal SIGTERM|status unknown)\\); its state is removed\\n$`,
      ),
    );
    // The whole instance: its child went with it.
    await waitFor(() => isGone(d.pid) && isGone(d.child), 10_000, 'the instance to be gone');
    expect(existsSync(join(d.stateDir, 'vm'))).toBe(false);
    expect(JSON.parse(ok(await cli(['ls', '--state-dir', d.stateDir, '--json']))).instances).toEqual([]);
    failure(await cli(['stop', 'vm', '--state-dir', d.stateDir]), 'ERR_CUSTODY_NOT_FOUND');

    // Its logs outlive it: each log on its namesake stream, -n, one log on stdout, --json.
    const both = await cli(['logs', 'vm', '--state-dir', d.stateDir]);
    expect(both).toEqual({ code: 0, stdout: `out 1\nchild ${d.child}\n`, stderr: 'err 1\n' });
    expect(await cli(['logs', 'vm', '-n', '1', '--state-dir', d.stateDir])).toEqual({
      code: 0,
      stdout: `child ${d.child}\n`,
      stderr: 'err 1\n',
    });
    expect(ok(await cli(['logs', 'vm', '--lines', '1', '--stream', 'stdout', '--state-dir', d.stateDir]))).toBe(
      `child ${d.child}\n`,
    );
    const json = JSON.parse(ok(await cli(['logs', 'vm', '--json', '--state-dir', d.stateDir])));
    expect(json).toEqual({ id: 'vm', dir: d.files.dir, stdout: `out 1\nchild ${d.child}\n`, stderr: 'err 1\n' });
    expect(failure(await cli(['logs', 'other', '--state-dir', d.stateDir]), 'ERR_CUSTODY_NOT_FOUND')).toContain(
      'no logs of other in',
    );
  });

  it('a dir custody 0.1 left: ls says so, recover upgrades it, stop --json stops what it adopted', async () => {
    const root = scratch();
    const stateDir = join(root, 'state');
    mkdirSync(stateDir, { mode: 0o700 });
    const token = randomBytes(16).toString('hex');
    const h = spawn(PERL, ['-e', 'sleep 300', token, MARKER], { stdio: 'ignore' });
    cleanups.push(async () => {
      h.signal('SIGKILL');
      await h.exited;
      h.close();
    });
    const vars = { DIR: root, PERL, SH: '/bin/sh', MARKER, TOKEN: token, ...identityVars(inspect(h.pid)) };
    write01(stateDir, 'vm-a', fill01('running-child.json', vars));
    writeFileSync(join(stateDir, '.lock'), '', { mode: 0o600 });
    const before = snapshot(stateDir);

    const listed = JSON.parse(ok(await cli(['ls', '--state-dir', stateDir, '--json'])));
    expect(listed).toMatchObject({ format: 1, instances: [{ id: 'vm-a', state: 'running', verdict: 'ok' }] });
    const human = ok(await cli(['ls', '--state-dir', stateDir])).split('\n');
    expect(human[0]).toBe(`state dir ${stateDir}: left by custody 0.1; the next open upgrades it`);
    expect(snapshot(stateDir)).toEqual(before);

    const recovered = ok(await cli(['recover', '--state-dir', stateDir])).split('\n');
    expect(recovered[0]).toBe(`state dir ${stateDir}: upgraded from custody 0.1's format`);
    expect(recovered[2]!.split(/\s+/)).toEqual(['adopted', 'vm-a', String(h.pid), '-']);
    expect(existsSync(join(stateDir, '.custody'))).toBe(true);
    expect(JSON.parse(ok(await cli(['ls', '--state-dir', stateDir, '--json']))).format).toBe(3);

    const stopped = JSON.parse(
      ok(await cli(['stop', 'vm-a', '--json', '--grace-ms', '5000', '--state-dir', stateDir])),
    );
    expect(stopped).toMatchObject({ id: 'vm-a', pid: h.pid, outcome: 'exited', escalated: false });
    // Our child: its status is ours to read, and it is what the kernel said.
    expect(await h.exited).toEqual({ code: null, signal: 'SIGTERM' });
    expect(existsSync(join(stateDir, 'vm-a'))).toBe(false);
  });
});

/** Runs argv with stdin, stdout and stderr on one new terminal (a pty): what a user at a shell sees, \r\n as \n. */
const ON_TERMINAL = `
import os, pty, sys
pid, fd = pty.fork()
if pid == 0:
    os.execv(sys.argv[1], sys.argv[1:])
out = b''
while True:
    try:
        d = os.read(fd, 65536)
    except OSError:
        break
    if not d:
        break
    out += d
_, status = os.waitpid(pid, 0)
sys.stdout.buffer.write(out)
sys.exit(os.waitstatus_to_exitcode(status))
`;

async function cliOnTerminal(args: string[]): Promise<Run> {
  const r = await run(PYTHON, ['-c', ON_TERMINAL, process.execPath, CLI, ...args]);
  return { ...r, stdout: r.stdout.replaceAll('\r\n', '\n') };
}

describe(`custody logs on one terminal (${backend.name})`, () => {
  it('both logs to one terminal: each line says its log (stdout| or stderr|); --stream and a pipe stay plain', async () => {
    const d = await chattyInstance();
    const both = await cliOnTerminal(['logs', 'vm', '--state-dir', d.stateDir]);
    expect(both).toEqual({ code: 0, stdout: `stdout|out 1\nstdout|child ${d.child}\nstderr|err 1\n`, stderr: '' });
    const one = await cliOnTerminal(['logs', 'vm', '--stream', 'stderr', '--state-dir', d.stateDir]);
    expect(one).toEqual({ code: 0, stdout: 'err 1\n', stderr: '' });
    // --follow prints chunks that may end mid-line: only a line's start gets the prefix.
    const a = prefixLines('stdout', 'one\ntw', true);
    const b = prefixLines('stdout', 'o\nthree\n', a.atStart);
    expect([a, b]).toEqual([
      { text: 'stdout|one\nstdout|tw', atStart: false },
      { text: 'o\nstdout|three\n', atStart: true },
    ]);
    // Not a terminal (pipes, as here): each log on its namesake stream, as written.
    expect(await cli(['logs', 'vm', '--state-dir', d.stateDir])).toEqual({
      code: 0,
      stdout: `out 1\nchild ${d.child}\n`,
      stderr: 'err 1\n',
    });
  });
});

describe(`custody logs --follow (${backend.name})`, () => {
  it('prints what is appended until SIGTERM, then exits 0', async () => {
    const d = await chattyInstance();
    const f = started(['logs', 'vm', '--follow', '--stream', 'stdout', '--state-dir', d.stateDir]);
    await waitFor(() => f.out.stdout.includes(`child ${d.child}\n`), 20_000, 'the existing lines');
    process.kill(d.pid, 'SIGUSR1');
    await waitFor(() => f.out.stdout.includes('usr1 1\n'), 20_000, 'the appended line');
    f.child.kill('SIGTERM');
    expect(await f.done).toEqual({ code: 0, stdout: `out 1\nchild ${d.child}\nusr1 1\n`, stderr: '' });
  });

  it('--json -n 0 follows both logs, one JSON line per chunk, until SIGINT', async () => {
    const d = await chattyInstance();
    const f = started(['logs', 'vm', '-f', '-n', '0', '--json', '--state-dir', d.stateDir]);
    const seen = () =>
      f.out.stdout
        .split('\n')
        .filter(Boolean)
        .map((l) => JSON.parse(l) as { stream: string; text: string });
    // -n 0 prints only what comes after it opened the files: signal (now and then) until both logs show a line.
    let sent = 0;
    await waitFor(
      () => {
        const streams = new Set(seen().map((c) => c.stream));
        if (streams.size < 2 && Date.now() - sent > 500) {
          process.kill(d.pid, 'SIGUSR1');
          sent = Date.now();
        }
        return streams.size === 2;
      },
      20_000,
      'a line on each log',
    );
    f.child.kill('SIGINT');
    const r = await f.done;
    expect(r).toMatchObject({ code: 0, stderr: '' });
    const chunks = seen();
    const text = (s: string) =>
      chunks
        .filter((c) => c.stream === s)
        .map((c) => c.text)
        .join('');
    // Never a line from before it started; whole lines, as many as the signals it saw.
    expect(text('stdout')).toMatch(/^(usr1 \d+\n)+$/);
    expect(text('stderr')).toMatch(/^(usr1 \d+ err\n)+$/);
    expect(readFileSync(d.files.stdout, 'utf8')).toContain(text('stdout'));
  });
});

describe(`custody logs reads only what a launch would write (${backend.name})`, () => {
  it('a .logs that is a symlink is ERR_CUSTODY_BAD_LOG, with --follow too: nothing through it is printed', async () => {
    const d = await chattyInstance();
    const elsewhere = join(scratch(), 'elsewhere');
    mkdirSync(join(elsewhere, 'vm'), { recursive: true, mode: 0o700 });
    writeFileSync(join(elsewhere, 'vm', 'stdout.log'), "not custody's\n");
    const logs = join(d.stateDir, '.logs');
    renameSync(logs, `${logs}.moved`);
    symlinkSync(elsewhere, logs);
    for (const follow of [[], ['--follow']]) {
      const r = await cli(['logs', 'vm', ...follow, '--stream', 'stdout', '--state-dir', d.stateDir]);
      expect(failure(r, 'ERR_CUSTODY_BAD_LOG')).toContain(`log ${logs}: is a symlink (never followed)`);
    }
  });

  it('an instance log dir another uid replaced with a symlink (its .logs given away by mistake) is refused, not read', async (t) => {
    t.skip(!isRoot(), 'needs root: another uid (setpriv) plants the symlink');
    const d = await chattyInstance();
    // What the symlink points the reader at: a root-only log.
    const secret = join(scratch(), 'secret');
    mkdirSync(secret, { mode: 0o700 });
    writeFileSync(join(secret, 'stdout.log'), 'root only\n', { mode: 0o600 });
    // The mistake: the state dir traversable, and its .logs given to uid 65534 (still 0700).
    chmodSync(join(d.stateDir, '..'), 0o755);
    chmodSync(d.stateDir, 0o711);
    const logs = join(d.stateDir, '.logs');
    chownSync(logs, 65534, 65534);
    const plant = 'cd "$1" && mv vm moved && ln -s "$2" vm';
    const asNobody = ['--reuid=65534', '--regid=65534', '--clear-groups'];
    execFileSync('setpriv', [...asNobody, 'sh', '-c', plant, 'sh', logs, secret], { timeout: 10_000 });
    expect(readlinkSync(join(logs, 'vm'))).toBe(secret);
    const r = await cli(['logs', 'vm', '--stream', 'stdout', '--state-dir', d.stateDir]);
    expect(failure(r, 'ERR_CUSTODY_BAD_LOG')).toContain(`log ${logs}: belongs to uid 65534 with mode 700`);
  });
});

describe(`custody sweep (${backend.name})`, () => {
  it('ends exactly the processes whose argv is ARGV, byte for byte, and spares what a state dir records', async () => {
    // Two with the byte 0xff as their last argument, one with 0xfe: Node decodes both to U+FFFD; custody does not.
    const start = (last: string) => execvPython([SLEEP_300, `b'${MARKER}'`, `b'${last}'`]);
    const kids = [start('\\xff'), start('\\xff'), start('\\xfe')];
    endAtCleanup(() => kids.map((k) => k.pid!));
    const [a, b, other] = kids.map((k) => k.pid!) as [number, number, number];
    await waitFor(() => kids.every((k) => inspect(k.pid!).argv.length === 5), 10_000, 'the execs');
    const argv = [PYTHON, '-c', 'import time; time.sleep(300)', MARKER];
    // The byte as the shell passes it: $'\xff'.
    const sweepFf = (...opts: string[]) =>
      run('bash', [
        '-c',
        `exec "$@" $'\\xff'`,
        'bash',
        process.execPath,
        CLI,
        'sweep',
        '--exact',
        ...opts,
        '--',
        ...argv,
      ]);

    const dry = JSON.parse(ok(await sweepFf('--dry-run', '--json')));
    expect(dry.matched.map((i: { pid: number }) => i.pid).sort()).toEqual([a, b].sort());
    expect(dry.matched[0].argv).toEqual([...argv, '\udcff']);
    expect([a, b, other].map(isGone)).toEqual([false, false, false]);

    const human = ok(await sweepFf('--grace-ms', '2000', '--deadline-ms', '10000')).split('\n');
    expect(human[0]).toMatch(/^RESULT\s+PID\s+UID\s+ARGV$/);
    expect(human.slice(1, 3).map((l) => l.split(/\s+/).slice(0, 2))).toEqual(
      expect.arrayContaining([
        ['terminated', String(a)],
        ['terminated', String(b)],
      ]),
    );
    expect(human[1]).toContain(`${PYTHON} -c "import time; time.sleep(300)" ${MARKER} "\\xff"`);
    await waitFor(() => isGone(a) && isGone(b), 10_000, 'the swept processes');
    expect(isGone(other)).toBe(false);
    expect(ok(await sweepFf('--dry-run'))).toBe('no process matched\n');
  });

  it('with --state-dir, never a process an instance there records', async () => {
    const s = await stateWithQuarantine(['ok'], []);
    const m = JSON.parse(readFileSync(join(s.stateDir, 'ok', 'manifest.json'), 'utf8'));
    const argv: string[] = m.identity.argv;
    const spared = JSON.parse(
      ok(await cli(['sweep', '--exact', '--dry-run', '--json', '--state-dir', s.stateDir, '--', ...argv])),
    );
    expect(spared.matched).toEqual([]);
    const found = JSON.parse(ok(await cli(['sweep', '--exact', '--dry-run', '--json', '--', ...argv])));
    expect(found.matched.map((i: { pid: number }) => i.pid)).toEqual([s.pids.ok]);
    expect(loggedSignals(s.log)).toEqual([]);
  });
});
