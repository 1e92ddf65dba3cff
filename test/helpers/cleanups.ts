/**
 * The prologue of a suite that makes things a test must undo: the
 * end-of-suite leak check, and a list each test pushes its undo steps onto,
 * run after every test (last pushed first, as each step may rely on what an
 * earlier push made, e.g. a supervisor inside a state dir).
 */
import { afterEach } from 'vitest';
import { expectNoLeaks } from './leaks.js';

export type Cleanup = () => unknown;

/**
 * Registers the leak check (`marker` as for expectNoLeaks) and returns the
 * list of undo steps. Every step runs even when one before it throws, so a
 * failed stop does not leave a state dir or a process to the next test; the
 * first error is rethrown after all have run.
 */
export function cleanupAfterEach(options: { marker?: string } = {}): Cleanup[] {
  expectNoLeaks(options);
  const cleanups: Cleanup[] = [];
  afterEach(async () => {
    const failures: unknown[] = [];
    while (cleanups.length) {
      try {
        await cleanups.pop()!();
      } catch (err) {
        failures.push(err);
      }
    }
    if (failures.length) throw failures[0];
  });
  return cleanups;
}
