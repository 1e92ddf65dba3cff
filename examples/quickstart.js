// launch → ready → stop → recover, in one page (`node examples/quickstart.js`).
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Supervisor } from 'custody';

const dir = mkdtempSync(join(tmpdir(), 'custody-quickstart-'));
const stateDir = join(dir, 'state');
const socket = join(dir, 'app.sock');
// The daemon: any program. Here a node one-liner that serves a unix socket.
const daemon = "require('node:net').createServer((c) => c.on('error', () => {}).end('hi\\n')).listen(process.argv[1])";

const { supervisor } = await Supervisor.open({ stateDir });
const app = await supervisor.launch({
  id: 'app',
  command: process.execPath,
  args: (token) => ['-e', daemon, socket, token], // the argv carries the launch token: proof it is ours
  ready: { socket }, // launch() resolves once the socket accepts
});
console.log(`launched app: pid ${app.pid}`);
await supervisor.close(); // the agent goes away; the daemon keeps running

// A new agent (after a crash or an upgrade) opens the same state dir and adopts it.
const { supervisor: again, report } = await Supervisor.open({ stateDir });
console.log(`adopted: ${report.adopted.map((e) => `${e.id} (pid ${e.pid})`).join(', ')}`);
const stopped = await again.stop('app'); // SIGTERM, a bounded wait, SIGKILL; proven gone
console.log(`stopped app: ${stopped.outcome}, ${stopped.result}`);
await again.close();
rmSync(dir, { recursive: true, force: true });
