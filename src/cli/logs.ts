/**
 * custody logs: an instance's log files, read without the state dir's lock
 * (a running supervisor keeps writing them) and after the instance stopped
 * (stop removes its state and keeps its logs).
 */
import { fstatSync } from 'node:fs';
import { followLog, hasLogDirs, logPaths, readLogTail } from '../state/logs.js';
import { readStateDir } from '../state/reads.js';
import { type Command, flag, idArg, JSON_OPTION, oneOf, STATE_DIR_OPTION, stateDirOf, wholeNumber } from './args.js';
import { CliError, print } from './output.js';

const STREAMS = ['stdout', 'stderr'] as const;
type Stream = (typeof STREAMS)[number];

/** Without -n: every line within the last MiB (the most followLog starts from). */
const ALL = Number.MAX_SAFE_INTEGER;

/**
 * Whether stdout and stderr are one terminal: then each log's namesake stream
 * would not tell them apart, and every line says its log instead.
 */
function oneTerminal(): boolean {
  if (!process.stdout.isTTY || !process.stderr.isTTY) return false;
  try {
    const [out, err] = [fstatSync(1), fstatSync(2)];
    return out.rdev === err.rdev && out.dev === err.dev && out.ino === err.ino;
  } catch {
    return false;
  }
}

/**
 * Prefixes each line of a stream's text with `stream|`. `atStart` is whether
 * the text begins a line (a chunk that --follow prints may end mid-line); it
 * returns whether the next chunk does.
 */
export function prefixLines(stream: string, text: string, atStart: boolean): { text: string; atStart: boolean } {
  if (text === '') return { text, atStart };
  const body = text.replace(/\n(?!$)/g, `\n${stream}|`);
  return { text: `${atStart ? `${stream}|` : ''}${body}`, atStart: text.endsWith('\n') };
}

function absent(err: unknown): boolean {
  return (err as NodeJS.ErrnoException)?.code === 'ENOENT';
}

export const logsCommand: Command = {
  name: 'logs',
  synopsis: 'logs ID [--follow] [-n N] [--stream stdout|stderr] [--state-dir DIR] [--json]',
  summary: "an instance's stdout and stderr, also after it stopped (takes no lock)",
  description: `Prints what the instance ID wrote to its stdout and stderr, from the files custody
keeps for it (<state dir>/.logs/ID/): its stdout log on stdout and its stderr log on
stderr, or only the one --stream names, on stdout. When stdout and stderr are one
terminal, both logs go to it with each line prefixed "stdout|" or "stderr|". Without -n, every line of the last
MiB. Takes no lock, so it works while a supervisor runs the instance, and after the
instance stopped (until its next launch starts new files, the previous run's becoming
stdout.log.1 and stderr.log.1). --follow keeps printing what is appended, across the
size cap's rotation, until SIGINT or SIGTERM. With --json: one document, or with
--follow one JSON line per chunk ({"stream", "text"}).`,
  options: [
    { name: '--follow', short: '-f', help: 'keep printing what is appended, until SIGINT or SIGTERM' },
    {
      name: '--lines',
      short: '-n',
      value: 'N',
      help: 'only the last N lines (0: none; with --follow, only what comes)',
    },
    { name: '--stream', value: 'stdout|stderr', help: 'only this log, printed on stdout' },
    STATE_DIR_OPTION,
    JSON_OPTION,
  ],
  async run(p) {
    const id = idArg(p);
    const lines = wholeNumber(p, 'lines') ?? ALL;
    const only = oneOf(p, 'stream', STREAMS);
    const json = flag(p, 'json');
    // Read-only, as ls: the dir must be custody's and safe to read; nothing is created or locked.
    const stateDir = readStateDir(stateDirOf(p)).stateDir;
    const files = logPaths(stateDir, id);
    const wanted = only ? [only] : [...STREAMS];
    const none = () =>
      new CliError(
        `no logs of ${id} in ${files.dir} (never launched here with logs, or pruned)`,
        'ERR_CUSTODY_NOT_FOUND',
      );
    // Read where a launch would write, or not at all: a symlinked or foreign dir is refused.
    if (!hasLogDirs(stateDir, id)) throw none();
    // With --stream the one log goes to stdout; otherwise each to its namesake, or, where both are one
    // terminal, each line prefixed with the log it is from.
    const merged = !only && !json && oneTerminal();
    const sink = (s: Stream) => (only || merged || s === 'stdout' ? process.stdout : process.stderr);
    const atStart: Record<Stream, boolean> = { stdout: true, stderr: true };
    const shown = (s: Stream, text: string) => {
      if (!merged) return text;
      const r = prefixLines(s, text, atStart[s]);
      atStart[s] = r.atStart;
      return r.text;
    };
    if (!flag(p, 'follow')) {
      const texts: Partial<Record<Stream, string | null>> = {};
      for (const s of wanted) {
        try {
          texts[s] = readLogTail(files[s], { lines });
        } catch (err) {
          if (!absent(err)) throw err;
          texts[s] = null;
        }
      }
      if (wanted.every((s) => texts[s] === null)) throw none();
      if (json) print(true, { id, dir: files.dir, ...texts }, () => '');
      else {
        for (const s of wanted) {
          const text = shown(s, texts[s] ?? '');
          // One terminal: the other log's lines start on a line of their own.
          sink(s).write(merged && text !== '' && !text.endsWith('\n') ? `${text}\n` : text);
        }
      }
      return 0;
    }
    const ac = new AbortController();
    const stop = () => ac.abort();
    process.once('SIGINT', stop);
    process.once('SIGTERM', stop);
    const write = (s: Stream, text: string) => {
      if (json) process.stdout.write(`${JSON.stringify({ stream: s, text })}\n`);
      else sink(s).write(shown(s, text));
    };
    /** Follows one log until the abort; false when it does not exist (followLog opens it on its first step). */
    const follow = async (s: Stream): Promise<boolean> => {
      let started = false;
      try {
        for await (const text of followLog(files[s], { lines, signal: ac.signal })) {
          started = true;
          if (text !== '') write(s, text);
        }
        return true;
      } catch (err) {
        if (started || !absent(err)) throw err;
        return false;
      }
    };
    try {
      // Both at once: a log that stays quiet never holds up the other.
      const found = await Promise.all(wanted.map(follow));
      if (!found.includes(true)) throw none();
    } finally {
      process.removeListener('SIGINT', stop);
      process.removeListener('SIGTERM', stop);
    }
    return 0;
  },
};
