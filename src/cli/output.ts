/**
 * What the CLI prints: a human table or one JSON document on stdout, and
 * errors as one line on stderr, in words, with the stable code after them.
 */
import { getSystemErrorMap } from 'node:util';
import { displayArg } from '../bytes.js';
import { CustodyError } from '../errors.js';

/** An error the CLI words itself (a raw errno error, said in terms of what was asked). */
export class CliError extends Error {
  readonly code: string;
  constructor(message: string, code: string) {
    super(message);
    this.code = code;
  }
}

/**
 * The result of a command: `value` is what --json prints (JSON keeps
 * custody's lossless argv strings as they are, lone surrogates escaped);
 * `human` is built only when it is the one shown.
 */
export function print(json: boolean, value: unknown, human: () => string): void {
  process.stdout.write(`${json ? JSON.stringify(value, null, 2) : human()}\n`);
}

/** A note about what happened (a warning event, an escalation), on stderr in both output modes. */
export function note(message: string): void {
  process.stderr.write(`custody: ${oneLine(message)}\n`);
}

const CONTROL: Record<string, string> = { '\n': '\\n', '\r': '\\r', '\t': '\\t' };
// biome-ignore lint/suspicious/noControlCharactersInRegex: control characters are what it escapes
const CONTROL_RE = /[\x00-\x1f\x7f]/g;
const escapeControl = (s: string) =>
  s.replace(CONTROL_RE, (c) => CONTROL[c] ?? `\\x${c.charCodeAt(0).toString(16).padStart(2, '0')}`);

/** For one line of a table or a message: control characters and bytes that are not UTF-8 shown as escapes. */
export function oneLine(s: string): string {
  return displayArg(escapeControl(s));
}

/**
 * One argument for people, unambiguous: as it is when it is plain, else
 * double-quoted with `\\`, `\"`, control characters and each byte that is
 * not UTF-8 (`\xNN`, as displayArg shows it) escaped.
 */
export function shownArg(arg: string): string {
  if (/^[\p{L}\p{N}_@%+=:,./-]+$/u.test(arg)) return arg;
  return `"${displayArg(escapeControl(arg.replace(/[\\"]/g, '\\$&')))}"`;
}

/** `reason:field`, or `reason` alone. */
export const joined = (a: string | undefined, b: string | undefined) => (a && b ? `${a}:${b}` : (a ?? null));

export const shownArgv = (argv: readonly string[]) => argv.map(shownArg).join(' ');

/** Columns padded to their widest cell; `-` for an empty one; `empty` when there are no rows. */
export function table(rows: Array<Record<string, unknown>>, columns: string[], empty = '(none)'): string {
  if (rows.length === 0) return empty;
  const cells = rows.map((r) =>
    columns.map((c) => (r[c] === undefined || r[c] === null ? '-' : oneLine(String(r[c])))),
  );
  const widths = columns.map((c, i) => Math.max(c.length, ...cells.map((row) => (row[i] ?? '').length)));
  const line = (vals: string[]) =>
    vals
      .map((v, i) => v.padEnd(widths[i] ?? 0))
      .join('  ')
      .trimEnd();
  return [line(columns.map((c) => c.toUpperCase())), ...cells.map(line)].join('\n');
}

const systemErrors = getSystemErrorMap();

/** An errno code in words ('no such process'), from libuv's table; undefined for a code it does not know. */
function errnoWords(e: NodeJS.ErrnoException): string | undefined {
  if (typeof e.errno === 'number') {
    const known = systemErrors.get(e.errno);
    if (known && known[0] === e.code) return known[1];
  }
  for (const [name, words] of systemErrors.values()) if (name === e.code) return words;
  return undefined;
}

const firstLine = (s: string) => s.split('\n', 1)[0] ?? '';

/** An error as the CLI reports it: what went wrong in words, and its stable code. */
export interface ErrorReport {
  message: string;
  code: string;
}

/**
 * What went wrong, in words, and its code. custody's own errors already say
 * it in words; a raw errno error (`pidfd_open ESRCH (No such process)`) is
 * said as `cannot pidfd_open: no such process`.
 */
export function errorReport(err: unknown): ErrorReport {
  if (err instanceof CliError || err instanceof CustodyError)
    return { message: firstLine(err.message), code: err.code };
  const e = err as NodeJS.ErrnoException;
  if (e instanceof Error && typeof e.code === 'string') {
    const words = /^E[A-Z0-9]+$/.test(e.code) ? errnoWords(e) : undefined;
    if (words) {
      const what = [e.syscall, e.path].filter(Boolean).join(' ');
      return { message: what ? `cannot ${what}: ${words}` : words, code: e.code };
    }
    return { message: firstLine(e.message), code: e.code };
  }
  if (e instanceof Error) return { message: firstLine(e.message), code: e.name };
  return { message: String(err), code: 'ERROR' };
}

/** The error line: `<what went wrong, in words> [<code>]`. */
export function errorLine(err: unknown): string {
  const r = errorReport(err);
  return `${oneLine(r.message)} [${r.code}]`;
}

/** The error under --json: one JSON object on one line (for stderr), `{ "error": { message, code } }`. */
export function errorJson(report: ErrorReport): string {
  return JSON.stringify({ error: report });
}
