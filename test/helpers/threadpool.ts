/**
 * A busy threadpool, really busy: each of its threads blocked in the read
 * of a FIFO that has no writer, as a consumer's slow file work would hold
 * them. Nothing custody queues there runs until release().
 */
import { execFileSync } from 'node:child_process';
import { closeSync, constants as fsc, openSync } from 'node:fs';
import { readFile } from 'node:fs/promises';
import { join } from 'node:path';

export interface HeldPool {
  /** Lets every blocked read finish (idempotent). */
  release(): void;
  /** Settles once every read has finished: await it after release(). */
  readonly drained: Promise<unknown>;
}

/** Blocks every thread of the pool on a FIFO made in `dir` (UV_THREADPOOL_SIZE of them, 4 by default). */
export function holdThreadpool(dir: string): HeldPool {
  const threads = Number(process.env.UV_THREADPOOL_SIZE) || 4;
  const fifos = Array.from({ length: threads }, (_, i) => join(dir, `pool-fifo-${i}`));
  for (const f of fifos) execFileSync('mkfifo', [f]);
  const drained = Promise.all(fifos.map((f) => readFile(f).catch(() => null)));
  const release = () => {
    for (const f of fifos) {
      try {
        closeSync(openSync(f, fsc.O_WRONLY | fsc.O_NONBLOCK));
      } catch {
        // its reader is gone already
      }
    }
  };
  return { release, drained };
}
