// QEMU under custody (`node examples/qemu.js`; Debian: apt-get install qemu-system-x86).
import { chmodSync, chownSync, mkdirSync, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Supervisor } from 'custody';
import { qmpQuit, qmpReady, qmpStatus } from './qmp.js';

const dir = mkdtempSync(join(tmpdir(), 'custody-qemu-'));
// As root, QEMU runs as nobody with the limits a VM needs, set by custody between clone and exec
// (no shell or setpriv around it); as anyone else it runs as you, as written.
const asRoot = process.getuid?.() === 0;
const vmDir = join(dir, 'vm-1'); // QEMU's own: its QMP socket and pidfile
mkdirSync(vmDir);
if (asRoot) {
  chmodSync(dir, 0o711);
  chownSync(vmDir, 65534, 65534);
}
const qmp = join(vmDir, 'qmp.sock');
const pidfile = join(vmDir, 'qemu.pid');
// No machine, no devices, no display: idles cheaply under TCG (no KVM, firmware or disk image needed).
const VM = ['-machine', 'none', '-nodefaults', '-display', 'none', '-qmp', `unix:${qmp},server=on,wait=off`];

const { supervisor } = await Supervisor.open({
  stateDir: join(dir, 'state'),
  onEvent: (e) => console.log(`${e.type.padEnd(8)} ${e.message ?? ''}`),
});
const vm = await supervisor.launch({
  id: 'vm-1',
  command: 'qemu-system-x86_64',
  // The token names the VM, so the process carries it.
  args: (token) => ['-name', `vm-1-${token}`, ...VM, '-daemonize', '-pidfile', pidfile],
  executable: 'qemu-system-x86_64', // the pid only counts once it runs QEMU
  // -daemonize is systemd's Type=forking: QEMU forks, initializes, writes the pidfile,
  // and the first process exits 0 (non-zero, with its stderr, if initialization failed).
  pid: { file: pidfile },
  // A connect proves the socket is bound; QMP answering query-status proves QEMU serves it.
  ready: { socket: qmp, probe: qmpReady },
  readyTimeoutMs: 30_000,
  // memlock: a VFIO guest's RAM (above the hard limit needs CAP_SYS_RESOURCE); nofile: its disks, taps, vhost fds.
  ...(asRoot ? { runAs: { uid: 65534, gid: 65534 }, rlimits: { memlock: 8 << 20, nofile: 4096 } } : {}),
});
console.log(`vm-1 is pid ${vm.pid}; QMP says ${await qmpStatus(qmp)}`);

// The graceful stop asks QEMU to quit over QMP; SIGTERM, then SIGKILL, only if it does not.
const stopped = await supervisor.stop('vm-1', { graceMs: 10_000, graceful: (_vm, signal) => qmpQuit(qmp, { signal }) });
console.log(`vm-1 stopped: ${stopped.outcome}${stopped.escalated ? ', after SIGKILL' : ''}`);
await supervisor.close(); // without stop(), QEMU keeps running and the next open() adopts it
rmSync(dir, { recursive: true, force: true });
