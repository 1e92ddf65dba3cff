// Restart policies (`node examples/restart.js`): systemd's Restart=, in the spec.
// A program that crashes after a moment is restarted with a growing delay, until
// more than `limit.count` ends within `limit.withinMs` leave it `failed`.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { Supervisor } from 'custody';

const dir = mkdtempSync(join(tmpdir(), 'custody-restart-'));
const { supervisor } = await Supervisor.open({
  stateDir: join(dir, 'state'),
  onEvent: (e) => {
    if (e.type === 'exit') console.log(`exit     pid ${e.pid}: ${e.result} (code ${e.code})`);
    if (e.type === 'restart') console.log(`restart  #${e.attempt} in ${e.delayMs} ms`);
    if (e.type === 'gave-up') console.log(`gave-up  after ${e.restarts} restarts`);
  },
});
const crashy = await supervisor.launch({
  id: 'crashy',
  command: '/bin/sh',
  // Crashes once it runs: exit 3 is a failure; exit 0 would be clean (no restart under on-failure).
  args: (token) => ['-c', 'sleep 0.2; exit 3', token],
  restart: { when: 'on-failure', delayMs: 50, maxDelayMs: 200, limit: { count: 3, withinMs: 60_000 } },
});
await crashy.exited; // settles once, for good: here when the policy gives up
const status = supervisor.list().find((i) => i.id === 'crashy')?.status;
console.log(`crashy is ${status}: ${crashy.restarts} restarts, the last end ${crashy.lastExit?.result}`);
await supervisor.remove('crashy'); // forget the failed instance (launch() would start it afresh)
await supervisor.close();
rmSync(dir, { recursive: true, force: true });
