// A walk-through of custody on real processes: `npm run demo`
// (add CUSTODY_BACKEND=js to see the pure-JS backend do the same work).
//
// It launches fake VM monitors (examples/fake-vm.py) through a launcher that
// reports a pid before that pid has exec'd (examples/launcher.sh), stops one
// gracefully, escalates another to SIGKILL, shows a failed launch being
// abandoned, and checks that nothing is left behind.
import { execFileSync } from 'node:child_process';
import { existsSync, mkdtempSync, readdirSync, readFileSync, readlinkSync, rmSync } from 'node:fs';
import { connect } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { setTimeout as sleep } from 'node:timers/promises';

const { Supervisor, capabilities, inspect } = await import('custody').catch((err) => {
  console.error(`cannot load custody (${err.message}); build it first: npm run build`);
  process.exit(1);
});

const HERE = fileURLToPath(new URL('.', import.meta.url));
const LAUNCHER = join(HERE, 'launcher.sh');
const FAKE_VM = join(HERE, 'fake-vm.py');
// `python3` on PATH may be a shim script (pyenv); custody compares the
// confirmed process's /proc/<pid>/exe with `executable`, so name the real one.
const PYTHON = execFileSync('python3', ['-c', 'import sys; print(sys.executable)'], { encoding: 'utf8' }).trim();

const DEMO = mkdtempSync(join(tmpdir(), 'custody-demo-'));
const stateDir = join(DEMO, 'state');
const say = (line = '') => console.log(line.replaceAll(DEMO, '$DEMO'));
const clip = (s, n = 150) => (s.length > n ? `${s.slice(0, n - 1)}…` : s);
const events = [];

// ---------------------------------------------------------------------------
console.log(`custody demo; $DEMO below is the temporary dir ${DEMO}`);
const { supervisor, report } = await Supervisor.open({
  stateDir,
  onEvent: (e) => {
    events.push(e);
    say(
      clip(
        `     event ${e.type.padEnd(8)} id=${e.id ?? '-'}${e.pid ? ` pid=${e.pid}` : ''}${e.message ? `  ${e.message}` : ''}`,
      ),
    );
  },
});
const counts = Object.entries(report)
  .map(([k, v]) => `${k} ${v.length}`)
  .join(', ');
say(`1. Supervisor.open() created $DEMO/state, took its lock and recovered the manifests there: ${counts}.`);

/** A launch spec for a fake VM started through launcher.sh, which reports the pid in a pidfile. */
function vmSpec(id, extraArgs = []) {
  const socket = join(DEMO, `${id}.sock`);
  const pidfile = join(DEMO, `${id}.pid`);
  return {
    id,
    command: '/bin/sh',
    args: (token) => [
      LAUNCHER,
      pidfile,
      PYTHON,
      FAKE_VM,
      '--name',
      id,
      '--custody-token',
      token,
      '--control',
      socket,
      ...extraArgs,
    ],
    executable: PYTHON, // the pid only counts once it runs this program...
    expect: [FAKE_VM, socket], // ...with these argv elements (besides the token)
    pid: { file: pidfile },
    launcherExits: false, // launcher.sh stays to reap the program
    ready: { socket, timeoutMs: 5000 },
    stderr: { file: join(DEMO, `${id}.log`) },
  };
}

/** Sends one line to a fake VM's control socket and resolves with its reply. */
function control(socketPath, line, signal) {
  return new Promise((resolve, reject) => {
    const s = connect({ path: socketPath, signal });
    let reply = '';
    s.on('connect', () => s.write(`${line}\n`));
    s.on('data', (d) => (reply += d));
    s.on('end', () => resolve(reply.trim()));
    s.on('error', reject);
  });
}

/** Polls a pidfile the way a user would, and inspects the pid the moment it appears. */
async function firstLookAt(pidfile) {
  for (let i = 0; i < 2000; i++) {
    try {
      const text = readFileSync(pidfile, 'utf8').trim();
      if (/^\d+$/.test(text)) {
        const pid = Number(text);
        const at = Date.now();
        try {
          return { pid, at, exe: readlinkSync(`/proc/${pid}/exe`), identity: inspect(pid) };
        } catch {
          return { pid, at, exe: '(gone already)', identity: null };
        }
      }
    } catch {
      // not written yet
    }
    await sleep(1);
  }
  return null;
}

const leftovers = (id) =>
  [join(DEMO, `${id}.sock`), join(DEMO, `${id}.pid`), join(stateDir, id)]
    .filter((p) => existsSync(p))
    .map((p) => p.replaceAll(DEMO, '$DEMO'));

let exitCode = 0;
try {
  // -------------------------------------------------------------------------
  say();
  say(
    '2. launch("vm1") through launcher.sh: it writes a fork\'s pid to a pidfile at once; the fork execs python 0.3 s later.',
  );
  const spec1 = vmSpec('vm1');
  const peek = firstLookAt(spec1.pid.file);
  const vm1 = await supervisor.launch(spec1);
  const early = await peek;
  const launcherPid = events.find((e) => e.type === 'spawn' && e.id === 'vm1').pid;
  const confirmedAt = events.find((e) => e.type === 'confirm' && e.id === 'vm1').time;
  const id1 = vm1.identity;
  const pre = early?.identity;
  say(
    `   The launcher (pid ${launcherPid}) reported pid ${early?.pid} while it was still the fork: exe ${early?.exe}, argv "${pre?.argv.slice(0, 2).join(' ')} …",`,
  );
  say(
    "   an argv that already carries the token and the VM's arguments. So custody also requires /proc/<pid>/exe to be `executable`:",
  );
  say(
    `   it confirmed pid ${vm1.pid} ${confirmedAt - early?.at} ms after the pidfile appeared, recorded the identity from that inspection, then waited for the socket.`,
  );
  say(
    `   identity: pid=${id1.pid} startTicks=${id1.startTicks} pidfsId=${id1.pidfsId} exe(dev:ino)=${id1.exe ? `${id1.exe.dev}:${id1.exe.ino}` : null} uid=${id1.uid} ppid=${id1.ppid}`,
  );
  say(`   argv: ${id1.argv.join(' ')}`);
  if (pre && pre.startTicks === id1.startTicks && pre.pidfsId === id1.pidfsId) {
    const same = pre.pidfsId ? `pid, startTicks and pidfsId` : `pid and startTicks`;
    say(
      `   exec kept the fork's ${same} and changed only exe and argv: an identity taken at report time would describe the shell.`,
    );
  }
  const manifest = JSON.parse(readFileSync(join(stateDir, 'vm1', 'manifest.json'), 'utf8'));
  say(`   manifest $DEMO/state/vm1/manifest.json: state=${manifest.state}, identity.pid=${manifest.identity.pid}`);
  const c = capabilities();
  say(
    `   capabilities(): backend=${c.backend} pidfd=${c.pidfd} pidfsId=${c.pidfsId} raceFreeSignals=${c.raceFreeSignals} ` +
      `raceFreeIdentity=${c.raceFreeIdentity} exitInfoOfNonChildren=${c.exitInfoOfNonChildren}`,
  );
  if (c.reason) say(`   (${c.reason})`);

  // -------------------------------------------------------------------------
  say();
  say('3. list(): what this supervisor holds.');
  for (const info of supervisor.list()) say(`   ${JSON.stringify(info)}`);
  say(`   The VM answers on its control socket: status -> "${await control(spec1.ready.socket, 'status')}"`);

  // -------------------------------------------------------------------------
  say();
  say('4. stop("vm1") with a graceful hook that sends "powerdown" over the control socket and waits for the exit.');
  const r1 = await supervisor.stop('vm1', {
    graceMs: 5000,
    graceful: async (instance, signal) => {
      const reply = await control(spec1.ready.socket, 'powerdown', signal);
      say(`   hook: sent "powerdown", the VM replied "${reply}"`);
      // Return only once it has exited: after the hook, stop() goes on to SIGTERM.
      await instance.exited;
    },
  });
  say(`   result: ${JSON.stringify(r1)}`);
  if (r1.code === null && r1.signal === null) {
    say(
      "   (code and signal are null: the VM is not custody's child, and its status comes only with its parent's reaping;",
    );
    say('   stop returns once the process is gone instead of waiting for that)');
  }
  say(
    '   The VM had exited on its own request before the hook returned, so custody had nothing left to signal (escalated=false);',
  );
  say(`   it then removed the declared paths and the state. Left over: [${leftovers('vm1').join(', ')}]`);

  // -------------------------------------------------------------------------
  say();
  say('5. launch("vm2") with --ignore-sigterm, then stop it with graceMs 500 and no hook.');
  const spec2 = vmSpec('vm2', ['--ignore-sigterm']);
  const _vm2 = await supervisor.launch(spec2);
  const t2 = Date.now();
  const r2 = await supervisor.stop('vm2', { graceMs: 500 });
  say(`   result after ${Date.now() - t2} ms: ${JSON.stringify(r2)}`);
  const via = c.pidfd
    ? 'through the pidfd opened when its identity was proven'
    : 'after re-checking its start time (no pidfd on this backend)';
  say(`   SIGTERM was ignored, so after 500 ms custody said so (escalate event) and sent SIGKILL ${via}.`);

  // -------------------------------------------------------------------------
  say();
  say(
    '6. launch("vm3"), python spawned directly this time (pid: \'child\'), whose VM fails before opening its socket.',
  );
  const socket3 = join(DEMO, 'vm3.sock');
  const spec3 = {
    id: 'vm3',
    command: PYTHON,
    args: (token) => [
      FAKE_VM,
      '--name',
      'vm3',
      '--custody-token',
      token,
      '--control',
      socket3,
      '--boot-delay',
      '0.2',
      '--fail',
      'cannot open disk image /var/lib/demo/vm3.img: No such file or directory',
    ],
    ready: { socket: socket3, timeoutMs: 5000 },
    stderr: { file: join(DEMO, 'vm3.log') },
  };
  const t3 = Date.now();
  try {
    await supervisor.launch(spec3);
    throw new Error('vm3 was expected to fail');
  } catch (err) {
    if (err.code !== 'ERR_CUSTODY_LAUNCH_EXITED') throw err;
    say(`   rejected after ${Date.now() - t3} ms (not the 5 s ready timeout): ${err.name} ${err.code}`);
    say(`   message: ${err.message}`);
    say(
      `   err.exitCode=${err.exitCode} err.signal=${err.signal} err.pid=${err.pid}; err.stderrTail holds the stderr the message quotes.`,
    );
  }
  const stray = readdirSync('/proc').filter((p) => /^\d+$/.test(p) && cmdline(p).includes(socket3));
  say(
    `   Abandoned cleanly: list()=${JSON.stringify(supervisor.list())}, leftover paths=[${leftovers('vm3').join(', ')}], processes of vm3=[${stray.join(', ')}]`,
  );
} catch (err) {
  exitCode = 1;
  say(`demo failed: ${err?.stack ?? err}`);
  for (const { id, status } of supervisor.list()) {
    if (status === 'running') await supervisor.stop(id, { graceMs: 500 }).catch(() => {});
  }
}

// ---------------------------------------------------------------------------
say();
say(
  '7. close(): releases the lock and pidfds (processes still running would be left running for a later Supervisor to adopt).',
);
await supervisor.close();
// The launchers end right after their VMs; give them a moment, then look for anything of ours.
let mine = [];
for (let i = 0; i < 100; i++) {
  mine = readdirSync('/proc').filter((p) => /^\d+$/.test(p) && Number(p) !== process.pid && cmdline(p).includes(DEMO));
  if (mine.length === 0) break;
  await sleep(20);
}
rmSync(DEMO, { recursive: true, force: true });
if (mine.length) {
  exitCode = 1;
  say(`   processes left behind: ${mine.join(', ')}`);
} else {
  say('   No process of this demo is left, $DEMO is removed. Done.');
}
process.exitCode = exitCode;

function cmdline(pid) {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').replaceAll('\0', ' ');
  } catch {
    return '';
  }
}
