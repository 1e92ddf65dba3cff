// An sd_notify daemon (`node examples/notify-daemon.js`): systemd's Type=notify.
// custody binds a socket for the launch and passes it as NOTIFY_SOCKET; the
// daemon says READY=1 when it is ready (and STATUS= lines as it goes). Native
// backend only: capabilities().notify says whether it is here.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { capabilities, Supervisor } from 'custody';

if (!capabilities().notify) {
  console.log(`skipped: ready: 'notify' needs the native backend (this is ${capabilities().backend})`);
  process.exit(0);
}
// The daemon, in Python here: any program that speaks sd_notify(3) (libsystemd, systemd-notify) works.
const DAEMON = `
import os, socket, sys, time
addr = os.environ['NOTIFY_SOCKET']
addr = '\\0' + addr[1:] if addr.startswith('@') else addr
s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
s.sendto(b'STATUS=loading', addr)
time.sleep(0.2)
s.sendto(b'STATUS=serving\\nREADY=1', addr)
time.sleep(300)
`;
const dir = mkdtempSync(join(tmpdir(), 'custody-notify-'));
const { supervisor } = await Supervisor.open({
  stateDir: join(dir, 'state'),
  onEvent: (e) => {
    if (e.type === 'status' || e.type === 'ready')
      console.log(`${e.type.padEnd(7)}${e.type === 'status' ? e.status : ''}`);
  },
});
const daemon = await supervisor.launch({
  id: 'daemon',
  command: 'python3',
  args: (token) => ['-c', DAEMON, token],
  ready: 'notify', // launch() resolves at READY=1; an exit before it fails the launch with the daemon's stderr
  readyTimeoutMs: 10_000,
});
console.log(`daemon ready: pid ${daemon.pid}`);
const stopped = await supervisor.stop('daemon');
console.log(`stopped: ${stopped.outcome}, ${stopped.result}`);
await supervisor.close();
rmSync(dir, { recursive: true, force: true });
