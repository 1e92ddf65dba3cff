#!/usr/bin/env node
/**
 * custody's command line (bin `custody`, `npx custody`): the library's API
 * on a state dir or a pid. Exit status 0 on success; 1 on an error, one line
 * on stderr saying it in words with its code in brackets; 2 on a usage
 * error, one line on stderr. Help (`--help`, `help [COMMAND]`, `COMMAND
 * --help`) and `--version` print on stdout and exit 0.
 */
import { readFileSync } from 'node:fs';
import { inspect } from '../process/identity.js';
import {
  type Command,
  HELP_OPTION,
  JSON_OPTION,
  type OptionSpec,
  parse,
  STATE_DIR_OPTION,
  USAGE_CODE,
  UsageError,
} from './args.js';
import { logsCommand } from './logs.js';
import { errorJson, errorLine, errorReport } from './output.js';
import { inspectCommand, sweepCommand } from './process.js';
import { lsCommand } from './ls.js';
import { recoverCommand, releaseCommand, removeCommand, stopCommand } from './state.js';

const COMMANDS: Command[] = [
  lsCommand,
  inspectCommand,
  logsCommand,
  stopCommand,
  recoverCommand,
  releaseCommand,
  removeCommand,
  sweepCommand,
];

/** The package's version, from the package.json beside dist/ (this file is dist/cli/main.js). */
function version(): string {
  const pkg = JSON.parse(readFileSync(new URL('../../package.json', import.meta.url), 'utf8')) as { version?: unknown };
  return String(pkg.version);
}

function optionLines(options: OptionSpec[]): string {
  const rows = options.map(
    (o) => [`${o.short ? `${o.short}, ` : ''}${o.name}${o.value ? ` ${o.value}` : ''}`, o.help] as const,
  );
  const width = Math.max(...rows.map(([left]) => left.length)) + 2;
  return rows.map(([left, help]) => `  ${left.padEnd(width)}${help}`).join('\n');
}

function overview(): string {
  const width = Math.max(...COMMANDS.map((c) => c.name.length)) + 2;
  return `usage: custody <command> [options]        (or: npx custody <command> [options])

The state dir is --state-dir DIR, or $CUSTODY_STATE_DIR when that is not given.

Supervised processes from the shell: the state dir a custody Supervisor keeps,
and the same proofs of identity the library makes before it signals anything.

commands:
${COMMANDS.map((c) => `  ${c.name.padEnd(width)}${c.summary}`).join('\n')}
  ${'help'.padEnd(width)}this overview, or a command's help: custody help COMMAND

options:
${optionLines([
  STATE_DIR_OPTION,
  JSON_OPTION,
  { ...HELP_OPTION, help: 'help (also custody COMMAND --help)' },
  { name: '--version', help: "custody's version" },
])}

Exit status: 0 on success; 1 on an error, one line on stderr saying what went
wrong in words with its code in brackets (custody: ... [ERR_CUSTODY_STATE_LOCKED]);
2 on a usage error, one line on stderr. With --json, an error is one JSON object
on stderr instead: {"error":{"message":...,"code":...}} (code ${USAGE_CODE}
for a usage error).`;
}

function commandHelp(c: Command): string {
  return `usage: custody ${c.synopsis}\n\n${c.description}\n\noptions:\n${optionLines([...c.options, HELP_OPTION])}`;
}

function find(name: string): Command {
  const c = COMMANDS.find((x) => x.name === name);
  if (!c) throw new UsageError(`unknown command ${JSON.stringify(name)}`);
  return c;
}

/**
 * Options may come before the command (`custody --state-dir D ls`): they
 * are moved after it, where the command's own parsing judges them.
 */
function splitCommand(args: string[]): { name: string | undefined; rest: string[] } {
  let i = 0;
  for (let a = args[0]; a?.startsWith('-') && a !== '--'; a = args[i]) i += a === STATE_DIR_OPTION.name ? 2 : 1;
  return { name: args[i], rest: [...args.slice(0, i), ...args.slice(i + 1)] };
}

async function main(args: string[]): Promise<number> {
  const first = args[0];
  if (first === '--version') {
    if (args.length > 1) throw new UsageError('--version takes nothing else');
    process.stdout.write(`${version()}\n`);
    return 0;
  }
  if (first === '--help' || first === '-h') {
    process.stdout.write(`${overview()}\n`);
    return 0;
  }
  const { name, rest } = splitCommand(args);
  if (name === undefined || name === '--') throw new UsageError('no command given');
  if (name === 'help') {
    const [topic, ...more] = rest;
    if (more.length) throw new UsageError('help takes at most one COMMAND');
    process.stdout.write(`${topic ? commandHelp(find(topic)) : overview()}\n`);
    return 0;
  }
  const command = find(name);
  const parsed = parse(command, rest);
  if (parsed.help) {
    process.stdout.write(`${commandHelp(command)}\n`);
    return 0;
  }
  return command.run(parsed);
}

/**
 * The arguments as the bytes they are. Node decodes argv as UTF-8 and turns
 * each invalid byte into U+FFFD, losing it; only then are they read again
 * from the identity of this process (custody's lossless form), so that
 * `sweep --exact -- ARGV` compares the bytes that were typed.
 */
function ownArgs(): string[] {
  const given = process.argv.slice(2);
  if (!given.some((a) => a.includes('\ufffd'))) return given;
  try {
    const own = inspect(process.pid).argv;
    const tail = own.slice(own.length - given.length);
    const aligned =
      own.length >= given.length + 2 && tail.every((a, i) => a === given[i] || given[i]?.includes('\ufffd'));
    if (aligned) return tail;
  } catch {
    // No /proc to read it from: Node's decoding is all there is.
  }
  return given;
}

// A reader that went away (custody logs ... | head) is not an error.
process.stdout.on('error', (err: NodeJS.ErrnoException) => process.exit(err.code === 'EPIPE' ? 0 : 1));

/** --json was asked for (before any `--`): then an error, too, is one JSON object on stderr. */
function wantsJson(args: string[]): boolean {
  const end = args.indexOf('--');
  return (end < 0 ? args : args.slice(0, end)).includes(JSON_OPTION.name);
}

const args = ownArgs();
main(args).then(
  (code) => process.exit(code),
  (err: unknown) => {
    const json = wantsJson(args);
    if (err instanceof UsageError) {
      const help = err.command ? `custody help ${err.command}` : 'custody --help';
      const message = `${err.message} (see ${help})`;
      process.stderr.write(json ? `${errorJson({ message, code: USAGE_CODE })}\n` : `custody: ${message}\n`);
      process.exit(2);
    }
    process.stderr.write(json ? `${errorJson(errorReport(err))}\n` : `custody: ${errorLine(err)}\n`);
    process.exit(1);
  },
);
