/**
 * Declared paths (sockets, pidfiles a launch names): removed on abandon,
 * stop, exit and recovery, and before a launch so a stale socket cannot make
 * readiness lie. A manifest names them, so they are treated as hostile:
 * only a socket or a regular file is removed (by lstat, never through a
 * symlink at the path), and whatever could not be removed is reported.
 */
import { lstatSync, type Stats, unlinkSync } from 'node:fs';
import type { Emit } from '../events.js';
import { fileKind } from './files.js';
import { errnoCode } from './statedir.js';

/** Removes what is a socket or regular file; every other finding is a warning event. Returns the paths removed. */
export function removeDeclaredPaths(paths: readonly string[], emit: Emit, id?: string): string[] {
  const removed: string[] = [];
  const warn = (path: string, why: string) => emit('warning', { id, path, message: `declared path ${path} ${why}` });
  for (const path of paths) {
    let st: Stats;
    try {
      st = lstatSync(path);
    } catch (err) {
      if (errnoCode(err) !== 'ENOENT') warn(path, `could not be inspected: ${(err as Error).message}`);
      continue;
    }
    if (!st.isSocket() && !st.isFile()) {
      warn(path, `is ${fileKind(st)}, not a socket or regular file: left alone`);
      continue;
    }
    try {
      unlinkSync(path);
      removed.push(path);
    } catch (err) {
      if (errnoCode(err) !== 'ENOENT') warn(path, `could not be removed: ${(err as Error).message}`);
    }
  }
  return removed;
}
