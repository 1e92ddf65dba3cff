// custody from CommonJS (`node examples/commonjs.cjs`): the same API through require().
// A program with a fixed argv (sleep takes no extra argument) carries the launch token
// in its environment instead: token: 'env' (CUSTODY_TOKEN, proven from /proc/<pid>/environ).
const { mkdtempSync, rmSync } = require('node:fs');
const { tmpdir } = require('node:os');
const { join } = require('node:path');
const { Supervisor, capabilities } = require('custody');

async function main() {
  console.log(`backend: ${capabilities().backend}`);
  const dir = mkdtempSync(join(tmpdir(), 'custody-cjs-'));
  const { supervisor } = await Supervisor.open({ stateDir: join(dir, 'state') });
  const nap = await supervisor.launch({ id: 'nap', command: 'sleep', args: ['300'], token: 'env' });
  console.log(`nap: pid ${nap.pid}; list: ${JSON.stringify(supervisor.list().map((i) => [i.id, i.status]))}`);
  const stopped = await supervisor.stop('nap');
  console.log(`stopped nap: ${stopped.outcome}, ${stopped.result}`);
  await supervisor.close();
  rmSync(dir, { recursive: true, force: true });
}

main().catch((err) => {
  console.error(err);
  process.exit(1);
});
