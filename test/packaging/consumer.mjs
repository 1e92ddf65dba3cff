// An ESM consumer of the installed package (test/packaging/run.sh copies it
// into a folder with custody in node_modules). Checks the backend against
// EXPECT_BACKEND (and EXPECT_REASON, a regex, for js), then drives the API.
import { createRequire } from 'node:module';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { CustodyError, capabilities, inspect, spawn, verify, Supervisor } from 'custody';

const fail = (msg) => {
  console.error(`consumer.mjs: ${msg}`);
  process.exit(1);
};
const caps = capabilities();
const expect = process.env.EXPECT_BACKEND ?? 'native';
if (caps.backend !== expect) fail(`backend ${caps.backend} (${caps.reason ?? 'no reason'}), expected ${expect}`);
if (expect === 'js') {
  if (!caps.reason) fail('js backend without a reason');
  if (process.env.EXPECT_REASON && !new RegExp(process.env.EXPECT_REASON).test(caps.reason)) {
    fail(`reason ${JSON.stringify(caps.reason)} does not match /${process.env.EXPECT_REASON}/`);
  }
}
if (caps.platform === 'linux') {
  const id = inspect(process.pid); // synchronous
  if (id.pid !== process.pid || !id.argv.length) fail(`inspect(self) returned ${JSON.stringify(id)}`);
  const v = verify(id);
  if (v.verdict !== 'ok') fail(`verify(self) = ${JSON.stringify(v)}`);
}
const child = spawn('/bin/sh', ['-c', 'exit 7'], { stdio: 'ignore' });
const status = await child.exited;
if (status.code !== 7) fail(`spawn exit status ${JSON.stringify(status)}`);

const stateDir = mkdtempSync(join(tmpdir(), 'custody-consumer-'));
try {
  const { supervisor } = await Supervisor.open({ stateDir, onEvent: () => {} });
  if (supervisor.list().length !== 0) fail('fresh state dir is not empty');
  await supervisor.close();
} finally {
  rmSync(stateDir, { recursive: true, force: true });
}

// require('custody') in the same process: the import entry re-exports the
// CommonJS build, so both are one instance, classes and all.
const cjs = createRequire(import.meta.url)('custody');
if (cjs.capabilities().backend !== caps.backend) fail(`require('custody') chose ${cjs.capabilities().backend}`);
if (cjs.CustodyError !== CustodyError || cjs.Supervisor !== Supervisor || cjs.spawn !== spawn) {
  fail("import and require('custody') are two instances: an error from one is not instanceof the other's class");
}
// import and require spawning at once, in both orders: one addon, so each
// exit must still reach the build whose handle waits for it.
const both = [
  spawn('/bin/sh', ['-c', 'exit 3'], { stdio: 'ignore' }),
  cjs.spawn('/bin/sh', ['-c', 'exit 4'], { stdio: 'ignore' }),
  spawn('/bin/sh', ['-c', 'exit 5'], { stdio: 'ignore' }),
];
const codes = await Promise.race([
  Promise.all(both.map(async (h) => (await h.exited).code)),
  new Promise((resolve) => setTimeout(() => resolve('timed out'), 10_000).unref()),
]);
if (JSON.stringify(codes) !== '[3,4,5]') fail(`ESM and CommonJS spawns in one process ended ${JSON.stringify(codes)}`);

console.log(`consumer.mjs: ${caps.platform} backend=${caps.backend}${caps.reason ? ` reason="${caps.reason}"` : ''}`);
