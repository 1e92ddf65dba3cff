#!/usr/bin/env node
/**
 * custody ls | inspect PID | recover | release ID   [--state-dir DIR] [--json]
 *
 * The same API as the library. Exits 0 on success, 1 with a one-line reason
 * on error, 2 on a usage error. Commands that change a state dir take its
 * lock first, so they refuse a dir a running supervisor holds and name it.
 */
import { inspect, Supervisor, sweep, verify } from './index.js';
import { CustodyError } from './errors.js';
import { readStateDir } from './store.js';

const USAGE = `usage: custody <command> [options]
  ls                 instances in the state dir, with what their processes verify as (read-only)
  inspect PID        a process's identity
  recover            open the state dir, recover every manifest, print the report
  release ID         clear a quarantine (never signals the process)
  sweep --exact [--dry-run] [--uid N] [--executable X] [--grace-ms N] [--deadline-ms N] -- ARGV...
                     end orphans whose argv is exactly ARGV (argv[0] included); with --state-dir,
                     never an instance recorded there
options:
  --state-dir DIR    the state dir (default: $CUSTODY_STATE_DIR)
  --json             machine-readable output`;

class UsageError extends Error {}

interface Parsed {
  command: string;
  rest: string[];
  stateDir: string | undefined;
  json: boolean;
  exact: boolean;
  dryRun: boolean;
  /** Everything after `--`: an argv, taken literally. */
  tail: string[] | null;
  numbers: Record<string, number>;
  executable: string | undefined;
}

function parse(argv: string[]): Parsed {
  const rest: string[] = [];
  let stateDir = process.env.CUSTODY_STATE_DIR || undefined;
  let json = false;
  let exact = false;
  let dryRun = false;
  let tail: string[] | null = null;
  let executable: string | undefined;
  const numbers: Record<string, number> = {};
  for (let i = 0; i < argv.length; i++) {
    const a = argv[i]!;
    if (a === '--') {
      tail = argv.slice(i + 1);
      break;
    }
    if (a === '--json') json = true;
    else if (a === '--exact') exact = true;
    else if (a === '--dry-run') dryRun = true;
    else if (a === '--executable') {
      executable = argv[++i];
      if (!executable) throw new UsageError('--executable needs a value');
    } else if (a === '--uid' || a === '--grace-ms' || a === '--deadline-ms') {
      const v = argv[++i];
      if (v === undefined || !/^\d+$/.test(v)) throw new UsageError(`${a} needs a whole number`);
      numbers[a.slice(2)] = Number(v);
    }
    else if (a === '--state-dir') {
      stateDir = argv[++i];
      if (!stateDir) throw new UsageError('--state-dir needs a value');
    } else if (a.startsWith('--state-dir=')) stateDir = a.slice('--state-dir='.length);
    else if (a === '-h' || a === '--help') throw new UsageError('');
    else if (a.startsWith('-')) throw new UsageError(`unknown option ${a}`);
    else rest.push(a);
  }
  const command = rest.shift();
  if (!command) throw new UsageError('');
  return { command, rest, stateDir, json, exact, dryRun, tail, numbers, executable };
}

function table(rows: Array<Record<string, unknown>>, columns: string[]): string {
  if (rows.length === 0) return '(none)';
  const cells = rows.map((r) => columns.map((c) => (r[c] === undefined || r[c] === null ? '-' : String(r[c]))));
  const widths = columns.map((c, i) => Math.max(c.length, ...cells.map((row) => row[i]!.length)));
  const line = (vals: string[]) => vals.map((v, i) => v.padEnd(widths[i]!)).join('  ').trimEnd();
  return [line(columns.map((c) => c.toUpperCase())), ...cells.map(line)].join('\n');
}

function needStateDir(dir: string | undefined): string {
  if (!dir) throw new UsageError('--state-dir DIR (or CUSTODY_STATE_DIR) is required');
  return dir;
}

async function main(argv: string[]): Promise<number> {
  const parsed = parse(argv);
  const { command, rest, stateDir, json } = parsed;
  const out = (value: unknown, human: () => string) => process.stdout.write(`${json ? JSON.stringify(value, null, 2) : human()}\n`);
  switch (command) {
    case 'inspect': {
      if (rest.length !== 1 || !/^\d+$/.test(rest[0]!)) throw new UsageError('inspect takes one PID');
      const id = inspect(Number(rest[0]));
      out(id, () =>
        [
          `pid         ${id.pid}`,
          `ppid        ${id.ppid}`,
          `uid         ${id.uid}`,
          `state       ${id.state}`,
          `startTicks  ${id.startTicks}`,
          `bootId      ${id.bootId}`,
          `pidfsId     ${id.pidfsId ?? '-'}`,
          `exe         ${id.exe ? `${id.exe.dev}:${id.exe.ino}` : '-'}`,
          `argv        ${JSON.stringify(id.argv)}`,
        ].join('\n'),
      );
      return 0;
    }
    case 'ls': {
      if (rest.length) throw new UsageError('ls takes no arguments');
      const rows: Array<Record<string, unknown>> = [];
      for (const entry of readStateDir(needStateDir(stateDir)).entries) {
        if (entry.manifest) {
          const m = entry.manifest;
          const v = m.identity ? verify(m.identity) : null;
          rows.push({
            id: m.id,
            state: m.state,
            pid: m.identity?.pid ?? null,
            verdict: v ? `${v.verdict}${v.field ? `:${v.field}` : ''}` : null,
            reason: m.quarantine ? `${m.quarantine.reason}${m.quarantine.field ? `:${m.quarantine.field}` : ''}` : null,
            command: m.command,
          });
        } else {
          rows.push({ id: entry.name, state: 'bad-manifest', pid: null, verdict: null, reason: entry.error.message, command: null });
        }
      }
      out(rows, () => table(rows, ['id', 'state', 'pid', 'verdict', 'reason', 'command']));
      return 0;
    }
    case 'recover': {
      if (rest.length) throw new UsageError('recover takes no arguments');
      const { supervisor, report } = await Supervisor.open({ stateDir: needStateDir(stateDir), onEvent: () => {} });
      await supervisor.close();
      const rows = (['adopted', 'repaired', 'cleaned', 'quarantined'] as const).flatMap((outcome) =>
        report[outcome].map((e) => ({ outcome, id: e.id, pid: e.pid, reason: e.reason, field: e.field })),
      );
      out(report, () => table(rows, ['outcome', 'id', 'pid', 'reason', 'field']));
      return 0;
    }
    case 'release': {
      if (rest.length !== 1) throw new UsageError('release takes one ID');
      const { supervisor } = await Supervisor.open({ stateDir: needStateDir(stateDir), onEvent: () => {} });
      try {
        await supervisor.release(rest[0]!);
      } finally {
        await supervisor.close();
      }
      out({ released: rest[0] }, () => `released ${rest[0]} (nothing was signalled)`);
      return 0;
    }
    case 'sweep': {
      if (!parsed.exact || !parsed.tail || parsed.tail.length === 0 || rest.length) {
        throw new UsageError('sweep needs --exact -- ARGV... (the whole argv, argv[0] included)');
      }
      const exclude: number[] = [];
      if (stateDir) {
        // A bad manifest names nothing to spare.
        for (const entry of readStateDir(stateDir).entries) if (entry.manifest?.identity) exclude.push(entry.manifest.identity.pid);
      }
      const r = await sweep({
        argv: parsed.tail,
        executable: parsed.executable,
        uid: parsed.numbers.uid,
        graceMs: parsed.numbers['grace-ms'],
        deadlineMs: parsed.numbers['deadline-ms'],
        dryRun: parsed.dryRun,
        exclude,
      });
      const rows = (['matched', 'terminated', 'killed', 'survivors'] as const).flatMap((k) =>
        k === 'matched' && !parsed.dryRun ? [] : r[k].map((i) => ({ result: parsed.dryRun ? 'would end' : k, pid: i.pid, uid: i.uid, argv: i.argv.join(' ') })),
      );
      out(r, () => table(rows, ['result', 'pid', 'uid', 'argv']));
      return r.survivors.length ? 1 : 0;
    }
    default:
      throw new UsageError(`unknown command ${JSON.stringify(command)}`);
  }
}

main(process.argv.slice(2)).then(
  (code) => process.exit(code),
  (err: unknown) => {
    if (err instanceof UsageError) {
      if (err.message) process.stderr.write(`custody: ${err.message}\n`);
      process.stderr.write(`${USAGE}\n`);
      process.exit(2);
    }
    const code = err instanceof CustodyError ? err.code : ((err as NodeJS.ErrnoException)?.code ?? 'ERROR');
    const message = ((err as Error)?.message ?? String(err)).split('\n')[0];
    process.stderr.write(`custody: ${message} [${code}]\n`);
    process.exit(1);
  },
);
