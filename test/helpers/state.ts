/**
 * For the state dir suites: Node children that drive the built library
 * line by line, and state dirs made as custody 0.1 made them.
 */
import { spawn as cpSpawn, type ChildProcess } from 'node:child_process';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { ProcessIdentity } from '../../src/index.js';
import { MANIFEST_VERSION, type StartingManifest } from '../../src/state/manifest.js';
import { FIXTURES, PERL } from './supervisor.js';

export const DIST = join(import.meta.dirname, '..', '..', 'dist', 'index.js');

/**
 * A Node process running `script` (an ES module body) on the given backend.
 * It reads commands on stdin and answers one line each; `ask` sends one and
 * waits for the answer, bounded.
 */
export class NodeChild {
  readonly child: ChildProcess;
  readonly exited: Promise<void>;
  #lines: string[] = [];
  #waiters: Array<(line: string | null) => void> = [];
  #buf = '';
  #stderr = '';
  #done = false;

  constructor(script: string, backendName: string, options: { shell?: string } = {}) {
    const args = ['--input-type=module', '-e', script];
    // Under a shell when a limit (ulimit) must apply to the child alone.
    this.child = options.shell
      ? cpSpawn('sh', ['-c', `${options.shell} && exec "$0" "$@"`, process.execPath, ...args], {
          stdio: ['pipe', 'pipe', 'pipe'],
          env: { ...process.env, CUSTODY_BACKEND: backendName },
        })
      : cpSpawn(process.execPath, args, {
          stdio: ['pipe', 'pipe', 'pipe'],
          env: { ...process.env, CUSTODY_BACKEND: backendName },
        });
    this.child.stdout!.setEncoding('utf8');
    this.child.stdout!.on('data', (d: string) => {
      this.#buf += d;
      for (let nl = this.#buf.indexOf('\n'); nl >= 0; nl = this.#buf.indexOf('\n')) {
        const line = this.#buf.slice(0, nl);
        this.#buf = this.#buf.slice(nl + 1);
        const w = this.#waiters.shift();
        if (w) w(line);
        else this.#lines.push(line);
      }
    });
    this.child.stderr!.on('data', (d: Buffer) => (this.#stderr = (this.#stderr + d.toString()).slice(-4000)));
    this.exited = new Promise((resolve) =>
      this.child.once('exit', () => {
        this.#done = true;
        for (const w of this.#waiters.splice(0)) w(null);
        resolve();
      }),
    );
  }

  get pid(): number {
    return this.child.pid!;
  }

  /** The next line it prints, within timeoutMs. */
  next(timeoutMs = 30_000): Promise<string> {
    const queued = this.#lines.shift();
    if (queued !== undefined) return Promise.resolve(queued);
    if (this.#done) return Promise.reject(new Error(`child ${this.pid} exited: ${this.#stderr}`));
    return new Promise((resolve, reject) => {
      const timer = setTimeout(
        () => reject(new Error(`no answer from child ${this.pid} within ${timeoutMs} ms: ${this.#stderr}`)),
        timeoutMs,
      );
      this.#waiters.push((line) => {
        clearTimeout(timer);
        if (line === null) reject(new Error(`child ${this.pid} exited: ${this.#stderr}`));
        else resolve(line);
      });
    });
  }

  send(line: string): void {
    this.child.stdin!.write(`${line}\n`);
  }

  ask(line: string, timeoutMs?: number): Promise<string> {
    this.send(line);
    return this.next(timeoutMs);
  }

  /** Closes its stdin and waits for it to end; SIGKILL (by pid) after the bound. */
  async end(ms = 10_000): Promise<void> {
    if (this.#done) return;
    this.child.stdin!.end();
    const timer = setTimeout(() => this.child.kill('SIGKILL'), ms);
    await this.exited;
    clearTimeout(timer);
  }
}

/** The placeholders of the 0.1 fixtures that name a process, from its live identity. */
export function identityVars(id: ProcessIdentity): Record<string, string | number> {
  return {
    PID: id.pid,
    BOOT_ID: id.bootId,
    START_TICKS: id.startTicks,
    EXE_DEV: id.exe!.dev,
    EXE_INO: id.exe!.ino,
    PIDFS_ID: JSON.stringify(id.pidfsId),
    UID: id.uid,
    PPID: id.ppid,
    STATE: id.state,
    SESSION: id.session,
    PID_NS: JSON.stringify(id.pidNs),
    PROCESS_PID_NS: JSON.stringify(id.processPidNs),
  };
}

/** A 0.1 fixture with its placeholders filled: the bytes custody 0.1 would have written. */
export function fill01(name: string, vars: Record<string, string | number>): string {
  return fillFixture('state-0.1', name, vars);
}

/** A fixture of test/fixtures/<dir> with its placeholders filled: the bytes the release that made it would have written. */
export function fillFixture(dir: string, name: string, vars: Record<string, string | number>): string {
  let text = readFileSync(join(FIXTURES, dir, name), 'utf8');
  for (const [k, v] of Object.entries(vars)) text = text.split(`__${k}__`).join(String(v));
  const missing = /__[A-Z_]+__/.exec(text);
  if (missing) throw new Error(`fixture ${name}: ${missing[0]} not filled`);
  return text;
}

/** An instance dir and manifest, as custody 0.1 made them (dir 0700, file 0600). */
export function write01(stateDir: string, id: string, text: string): void {
  mkdirSync(join(stateDir, id), { recursive: true, mode: 0o700 });
  writeFileSync(join(stateDir, id, 'manifest.json'), text, { mode: 0o600 });
}

/**
 * The manifest a launch writes before it spawns (state 'starting'), of a
 * supervisor long gone: what a crash mid-launch leaves. `extra` overrides.
 */
export function startingManifest(id: string, token: string, extra: Partial<StartingManifest> = {}): StartingManifest {
  const now = new Date().toISOString();
  return {
    version: MANIFEST_VERSION,
    id,
    token,
    tokenMode: 'argv',
    command: PERL,
    args: ['-e', 'sleep 300', token],
    expect: [],
    paths: [],
    executable: null,
    uid: null,
    session: null,
    cgroup: null,
    pidSource: 'child',
    pidFile: null,
    createdAt: now,
    updatedAt: now,
    supervisorPid: 2 ** 22 + 1,
    forkImage: null,
    state: 'starting',
    identity: null,
    quarantine: null,
    ...extra,
  } as StartingManifest;
}
