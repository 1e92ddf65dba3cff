// Adoption after an agent restart (`node examples/adopt.js`). The agent is this
// file run as a separate process: the first run launches a daemon and exits
// without stopping it (as an agent that crashes or is upgraded does); the
// second opens the same state dir, which proves the daemon is the one launched
// (pidfs id or start time, exe, argv, token) and adopts it, then stops it.
import { execFileSync } from 'node:child_process';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Supervisor } from 'custody';

const [phase, stateDir] = process.argv.slice(2);
if (phase === 'launch') {
  const { supervisor } = await Supervisor.open({ stateDir });
  const nap = await supervisor.launch({ id: 'nap', command: 'sleep', args: ['300'], token: 'env' });
  console.log(`agent 1 (pid ${process.pid}): launched nap, pid ${nap.pid}; exiting without stop()`);
  process.exit(0); // no close(), no stop(): the manifest on disk is all that is left
} else if (phase === 'adopt') {
  const { supervisor, report } = await Supervisor.open({ stateDir });
  for (const e of report.adopted) console.log(`agent 2 (pid ${process.pid}): adopted ${e.id}, pid ${e.pid}`);
  const stopped = await supervisor.stop('nap');
  console.log(`agent 2: stopped nap: ${stopped.outcome}, ${stopped.result}`);
  await supervisor.close();
} else {
  const dir = mkdtempSync(join(tmpdir(), 'custody-adopt-'));
  const self = fileURLToPath(import.meta.url);
  for (const next of ['launch', 'adopt']) {
    process.stdout.write(execFileSync(process.execPath, [self, next, join(dir, 'state')], { encoding: 'utf8' }));
  }
  rmSync(dir, { recursive: true, force: true });
}
