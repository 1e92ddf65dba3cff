// The API reference, checked: TypeDoc (pinned in devDependencies, config in
// typedoc.json) builds it from src/index.ts with every warning an error, and
// its own validation requires every exported name (function, class, method,
// interface, type) to be documented and every type the API refers to to be
// exported. TypeDoc cannot require documentation of one interface's members
// without requiring it of all, so this script does that for what a user
// writes and reads most: every member of the option interfaces below, and
// every field of every event. It prints `check-api: N names, M members
// documented` or each undocumented one, and exits 1.
//
//   node scripts/check-api.mjs [--out DIR]   (default: a temporary dir, removed after)
import { execFileSync } from 'node:child_process';
import { mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';

const outAt = process.argv.indexOf('--out');
const keep = outAt > 0 ? process.argv[outAt + 1] : null;
const work = mkdtempSync(join(tmpdir(), 'custody-api-'));
const out = keep ?? join(work, 'api');
const json = join(work, 'api.json');
try {
  // The HTML and the JSON model in one run; any warning fails it (treatWarningsAsErrors in typedoc.json).
  execFileSync(
    process.execPath,
    ['node_modules/typedoc/bin/typedoc', '--out', out, '--json', json, '--logLevel', 'Warn'],
    {
      stdio: 'inherit',
    },
  );
  const project = JSON.parse(readFileSync(json, 'utf8'));
  const byName = new Map(project.children.map((c) => [c.name, c]));

  /** Options a user writes: each member, and each member of an inline object type in them. */
  const OPTIONS = [
    'LaunchSpec',
    'SocketReady',
    'HealthSpec',
    'RestartOptions',
    'StopOptions',
    'SupervisorOptions',
    'LogOptions',
    'LogFiles',
    'Instance',
    'TerminateOptions',
    'SweepOptions',
  ];
  const LOG_HELPERS = ['readLogTail', 'followLog', 'logPaths'];
  const missing = [];
  let members = 0;

  const documented = (r) =>
    Boolean(
      r.comment?.summary?.some((p) => p.text.trim()) ||
        r.comment?.blockTags?.length ||
        r.signatures?.some((s) => documented(s)),
    );
  const walk = (r, path) => {
    for (const c of r.children ?? []) {
      members += 1;
      if (!documented(c)) missing.push(`${path}.${c.name}`);
      const inline = c.type?.type === 'reflection' ? c.type.declaration : null;
      if (inline?.children) walk(inline, `${path}.${c.name}`);
    }
  };
  const need = (name) => {
    const r = byName.get(name);
    if (!r) missing.push(`${name} (not exported)`);
    else if (!documented(r)) missing.push(name);
    return r;
  };
  for (const name of OPTIONS) {
    const r = need(name);
    if (r) walk(r, name);
  }
  for (const name of LOG_HELPERS) need(name);
  // Every event of the CustodyEvent union: exported, documented, and so is each of its fields.
  const union = need('CustodyEvent');
  const events = union?.type?.types?.map((t) => t.name) ?? [];
  if (events.length < 10) missing.push(`CustodyEvent: ${events.length} members found, expected every event`);
  for (const name of events) {
    const r = need(name);
    if (r?.children) walk(r, name);
    // An alias of a base (`InstanceEvent<'ready'>`): its fields are the base's.
    else if (r?.type?.type === 'reference') walk(need(r.type.name) ?? {}, r.type.name);
  }
  if (missing.length) {
    console.error(`check-api: undocumented in the API reference:\n  ${missing.join('\n  ')}`);
    process.exit(1);
  }
  console.log(
    `check-api: ${project.children.length} exported names documented; ${members} members of ${OPTIONS.length} option types and ${events.length} events documented${keep ? `; reference in ${keep}` : ''}`,
  );
} finally {
  rmSync(work, { recursive: true, force: true });
}
