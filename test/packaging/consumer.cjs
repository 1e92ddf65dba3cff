// A CommonJS consumer of the installed package: require('custody') must give
// the real API, synchronous functions included (no async wrapper).
'use strict';
const { mkdtempSync, rmSync } = require('node:fs');
const { tmpdir } = require('node:os');
const { join } = require('node:path');
const custody = require('custody');
const { capabilities, inspect, spawn, verify, Supervisor, CustodyError } = custody;

function fail(msg) {
  console.error(`consumer.cjs: ${msg}`);
  process.exit(1);
}
if (typeof CustodyError !== 'function') fail('CustodyError is not exported');
const caps = capabilities();
const expect = process.env.EXPECT_BACKEND || 'native';
if (caps.backend !== expect) fail(`backend ${caps.backend} (${caps.reason || 'no reason'}), expected ${expect}`);
if (expect === 'js') {
  if (!caps.reason) fail('js backend without a reason');
  if (process.env.EXPECT_REASON && !new RegExp(process.env.EXPECT_REASON).test(caps.reason)) {
    fail(`reason ${JSON.stringify(caps.reason)} does not match /${process.env.EXPECT_REASON}/`);
  }
}
if (caps.platform === 'linux') {
  const id = inspect(process.pid); // synchronous, straight from require()
  if (id.pid !== process.pid || !id.argv.length) fail(`inspect(self) returned ${JSON.stringify(id)}`);
  if (verify(id).verdict !== 'ok') fail(`verify(self) = ${JSON.stringify(verify(id))}`);
}

(async () => {
  const child = spawn('/bin/sh', ['-c', 'exit 7'], { stdio: 'ignore' });
  const status = await child.exited;
  if (status.code !== 7) fail(`spawn exit status ${JSON.stringify(status)}`);
  const stateDir = mkdtempSync(join(tmpdir(), 'custody-consumer-'));
  try {
    const { supervisor } = await Supervisor.open({ stateDir, onEvent: () => {} });
    await supervisor.close();
  } finally {
    rmSync(stateDir, { recursive: true, force: true });
  }
  console.log(`consumer.cjs: ${caps.platform} backend=${caps.backend}${caps.reason ? ` reason="${caps.reason}"` : ''}`);
})().catch((err) => fail(err.stack || String(err)));
