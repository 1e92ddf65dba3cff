// The CLI as a user runs it (node dist/cli/main.js), on this backend, to its end (bounded).
import { execFile } from 'node:child_process';
import { join } from 'node:path';
import { backend } from '../../src/backend/index.js';

export const CLI = join(import.meta.dirname, '..', '..', 'dist', 'cli', 'main.js');

/** Exit status and both streams; CUSTODY_STATE_DIR is never inherited. */
export function runCli(args: string[]): Promise<{ code: number; stdout: string; stderr: string }> {
  const env: NodeJS.ProcessEnv = { ...process.env, CUSTODY_BACKEND: backend.name };
  delete env.CUSTODY_STATE_DIR;
  return new Promise((resolve, reject) => {
    execFile(process.execPath, [CLI, ...args], { env, timeout: 60_000 }, (err, stdout, stderr) => {
      const code = err ? (err as { code?: unknown }).code : 0;
      if (typeof code !== 'number') reject(err);
      else resolve({ code, stdout, stderr });
    });
  });
}
