// Exec attributes (`node examples/exec-attrs.js`): what a service manager sets before exec
// (systemd's User=, UMask=, LimitNOFILE=, OOMScoreAdjust=, NoNewPrivileges=), given in the spec
// instead of a wrapper shell. capabilities().exec says which this backend applies; the rest
// would be ERR_CUSTODY_UNSUPPORTED, so the spec asks only for those. runAs needs root.
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { capabilities, Supervisor } from 'custody';

const can = capabilities().exec;
const asRoot = process.getuid?.() === 0;
// Only root may raise a hard limit or lower an OOM score: stay within the agent's own.
const hardNofile = Number(readFileSync('/proc/self/limits', 'utf8').match(/^Max open files\s+\S+\s+(\S+)/m)[1]);
const ownOom = Number(readFileSync('/proc/self/oom_score_adj', 'utf8'));
const attrs = {
  umask: 0o027,
  ...(can.rlimits.includes('nofile')
    ? { rlimits: { nofile: [Math.min(1024, hardNofile), Math.min(4096, hardNofile)] } }
    : {}),
  ...(can.oomScoreAdj ? { oomScoreAdj: Math.max(ownOom, 500) } : {}),
  ...(can.noNewPrivileges ? { noNewPrivileges: true } : {}),
  ...(asRoot && can.runAs ? { runAs: { uid: 65534, gid: 65534 } } : {}), // nobody
};
console.log(`backend: ${capabilities().backend}; asking for ${Object.keys(attrs).join(', ')}`);

const dir = mkdtempSync(join(tmpdir(), 'custody-exec-'));
const { supervisor } = await Supervisor.open({ stateDir: join(dir, 'state') });
try {
  const nap = await supervisor.launch({ id: 'nap', command: 'sleep', args: ['300'], token: 'env', ...attrs });
  // What the kernel says the process got.
  const status = readFileSync(`/proc/${nap.pid}/status`, 'utf8');
  const field = (name) => status.match(new RegExp(`^${name}:\\s*(.*)$`, 'm'))?.[1].split(/\s+/)[0];
  const limits = readFileSync(`/proc/${nap.pid}/limits`, 'utf8').match(/^Max open files\s+(\S+)\s+(\S+)/m);
  const oom = readFileSync(`/proc/${nap.pid}/oom_score_adj`, 'utf8').trim();
  console.log(`uid ${field('Uid')}, umask ${field('Umask')}, nofile ${limits[1]}/${limits[2]}`);
  console.log(`oom_score_adj ${oom}, no_new_privs ${field('NoNewPrivs')}`);
  const stopped = await supervisor.stop('nap');
  console.log(`stopped nap: ${stopped.outcome}, ${stopped.result}`);
} finally {
  await supervisor.close();
  rmSync(dir, { recursive: true, force: true });
}
