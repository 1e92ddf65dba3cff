/**
 * The CLI's arguments: each command declares its options, and anything it
 * does not declare is a usage error (exit 2) that names what was wrong, in
 * one line. A usage error is found before anything is opened or read.
 */
import { InvalidArgError } from '../errors.js';
import { assertId } from '../state/manifest.js';

/** The code a usage error carries under --json. */
export const USAGE_CODE = 'ERR_CUSTODY_USAGE';

/** A bad invocation: exit 2, this one line on stderr, pointing at the help that explains it. */
export class UsageError extends Error {
  /** The command whose help to point at; '' for the overview. */
  readonly command: string;
  constructor(message: string, command = '') {
    super(message);
    this.command = command;
  }
}

export interface OptionSpec {
  /** The long name, dashes included: '--grace-ms'. */
  name: string;
  /** A one-letter alias: '-n'. */
  short?: string;
  /** What the value is called in the help ('N', 'DIR'); absent for a flag. */
  value?: string;
  help: string;
}

export interface Parsed {
  command: string;
  /** By long name without its dashes ('grace-ms'): the value given, or true for a flag. */
  options: Map<string, string | true>;
  /** How each option was spelled (`-n` or `--lines`), for messages. */
  spelled: Map<string, string>;
  positionals: string[];
  /** What followed `--`, taken literally; null when there was no `--`. */
  tail: string[] | null;
  /** -h or --help was given: the command's help, and nothing else. */
  help: boolean;
}

export interface Command {
  name: string;
  /** The line after `usage: custody `. */
  synopsis: string;
  /** One line for the overview. */
  summary: string;
  /** What `custody help <name>` says between the usage line and the options. */
  description: string;
  options: OptionSpec[];
  /** Takes `-- ARGV...`; for the others what follows `--` is positionals. */
  takesTail?: boolean;
  /** The exit status. */
  run(p: Parsed): Promise<number>;
}

export const JSON_OPTION: OptionSpec = {
  name: '--json',
  help: 'machine-readable output on stdout (one JSON document); an error is one JSON object on stderr',
};
export const STATE_DIR_OPTION: OptionSpec = {
  name: '--state-dir',
  value: 'DIR',
  help: 'the state dir (default: $CUSTODY_STATE_DIR)',
};
export const HELP_OPTION: OptionSpec = { name: '--help', short: '-h', help: 'this help' };

/** A negative number is a value for the command to judge ("PID must be a positive integer"), never an option. */
const NEGATIVE = /^-\d/;

export function parse(command: Command, args: string[]): Parsed {
  const specs = [...command.options, HELP_OPTION];
  const p: Parsed = {
    command: command.name,
    options: new Map(),
    spelled: new Map(),
    positionals: [],
    tail: null,
    help: false,
  };
  // Help wins over whatever else is wrong with the line.
  const end = args.indexOf('--');
  const options = end < 0 ? args : args.slice(0, end);
  if (options.includes(HELP_OPTION.name) || options.includes(HELP_OPTION.short ?? '')) return { ...p, help: true };
  for (let i = 0, a = args[0]; a !== undefined; a = args[++i]) {
    if (a === '--') {
      const rest = args.slice(i + 1);
      if (command.takesTail) p.tail = rest;
      else p.positionals.push(...rest);
      break;
    }
    if (!a.startsWith('-') || a === '-' || NEGATIVE.test(a)) {
      p.positionals.push(a);
      continue;
    }
    const eq = a.startsWith('--') ? a.indexOf('=') : -1;
    const name = eq > 0 ? a.slice(0, eq) : a;
    const spec = specs.find((s) => s.name === name || s.short === name);
    if (!spec) throw new UsageError(`unknown option ${name} for ${command.name}`, command.name);
    const key = spec.name.slice(2);
    p.spelled.set(key, name);
    if (!spec.value) {
      if (eq > 0) throw new UsageError(`${spec.name} takes no value`, command.name);
      p.options.set(key, true);
      continue;
    }
    const value = eq > 0 ? a.slice(eq + 1) : args[++i];
    if (value === undefined || value === '') {
      throw new UsageError(`${spec.name} needs a value (${spec.value})`, command.name);
    }
    p.options.set(key, value);
  }
  return p;
}

function atMost(p: Parsed, count: number, takes: string): void {
  const extra = p.positionals[count];
  if (extra !== undefined)
    throw new UsageError(`${p.command} ${takes}; unexpected ${JSON.stringify(extra)}`, p.command);
}

/** A command that takes no positional arguments. */
export function noArgs(p: Parsed): void {
  atMost(p, 0, 'takes no arguments');
}

/** The one positional argument, called `name` in messages; undefined when absent and not `required`. */
export function oneArg(p: Parsed, name: string, required: true): string;
export function oneArg(p: Parsed, name: string, required: false): string | undefined;
export function oneArg(p: Parsed, name: string, required: boolean): string | undefined {
  atMost(p, 1, `takes one ${name}`);
  const arg = p.positionals[0];
  if (arg === undefined && required) throw new UsageError(`${p.command} needs ${name}`, p.command);
  return arg;
}

export function flag(p: Parsed, name: string): boolean {
  return p.options.get(name) === true;
}

export function stringOption(p: Parsed, name: string): string | undefined {
  const v = p.options.get(name);
  return typeof v === 'string' ? v : undefined;
}

/** A whole number (digits only: no sign, no unit, no exponent), or undefined when not given. */
export function wholeNumber(p: Parsed, name: string, unit = ''): number | undefined {
  const v = stringOption(p, name);
  if (v === undefined) return undefined;
  const n = Number(v);
  if (!/^\d+$/.test(v) || !Number.isSafeInteger(n)) {
    throw new UsageError(
      `${p.spelled.get(name)} must be a whole number${unit ? ` of ${unit}` : ''}, got ${JSON.stringify(v)}`,
      p.command,
    );
  }
  return n;
}

export function oneOf<T extends string>(p: Parsed, name: string, values: readonly T[]): T | undefined {
  const v = stringOption(p, name);
  if (v === undefined) return undefined;
  if (!(values as readonly string[]).includes(v)) {
    throw new UsageError(`${p.spelled.get(name)} must be ${values.join(' or ')}, got ${JSON.stringify(v)}`, p.command);
  }
  return v as T;
}

/** --state-dir, else $CUSTODY_STATE_DIR; a command that needs one and has neither is a usage error. */
export function stateDirOf(p: Parsed): string {
  const dir = stringOption(p, 'state-dir') ?? (process.env.CUSTODY_STATE_DIR || undefined);
  if (!dir) throw new UsageError(`${p.command} needs --state-dir DIR (or CUSTODY_STATE_DIR)`, p.command);
  return dir;
}

/** Runs one of the library's argument checks on what the user typed: its refusal is a usage error. */
export function checked<T>(p: Parsed, check: () => T): T {
  try {
    return check();
  } catch (err) {
    if (err instanceof InvalidArgError) throw new UsageError(err.message, p.command);
    throw err;
  }
}

/** The one positional argument an instance id, checked by the id rule before anything is opened. */
export function idArg(p: Parsed): string {
  const id = oneArg(p, 'ID', true);
  checked(p, () => assertId(id));
  return id;
}
