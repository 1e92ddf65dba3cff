// custody from strict TypeScript (`npx tsc -p examples && node examples/.build/typescript.js`
// in this repository; in your project, compile it as any other file). The events
// are a union told apart by `type`, so each branch sees its own fields.
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { type CustodyEvent, CustodyError, type LaunchSpec, Supervisor } from 'custody';

function onEvent(e: CustodyEvent): void {
  if (e.type === 'exit') console.log(`exit: ${e.result}, code ${e.code}`);
  else if (e.type === 'stop') console.log(`stop: ${e.outcome} (${e.escalated ? 'after SIGKILL' : 'at SIGTERM'})`);
}

const dir = mkdtempSync(join(tmpdir(), 'custody-ts-'));
const { supervisor } = await Supervisor.open({ stateDir: join(dir, 'state'), onEvent });
const spec: LaunchSpec = { id: 'nap', command: 'sleep', args: ['300'], token: 'env' };
const nap = await supervisor.launch(spec);
console.log(`nap: pid ${nap.pid}, token ${nap.token.slice(0, 8)}…`);
try {
  await supervisor.launch(spec); // the id is taken
} catch (err) {
  if (err instanceof CustodyError) console.log(`second launch refused: ${err.code}`);
  else throw err;
}
await supervisor.stop('nap');
await supervisor.close();
rmSync(dir, { recursive: true, force: true });
