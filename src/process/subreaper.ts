/**
 * PR_SET_CHILD_SUBREAPER is process-wide: supervisors share it, counted, and
 * the last one that asked turns it off again, if it was off before the
 * first. The count is the process's, not one copy of custody's (two loaded
 * copies would otherwise each turn it off under the other): processWide.
 */
import { backend } from '../backend/index.js';
import { processWide } from './processwide.js';

/** A contract between versions (see processWide): keep its shape, or take a new name. */
const refs = processWide('subreaper.refs', () => ({ holders: 0, wasOn: false }));

/** Takes a reference on the flag, setting it if nobody holds one; false where it cannot be set (js backend). */
export function acquireSubreaper(): boolean {
  if (refs.holders === 0) {
    refs.wasOn = backend.childSubreaper() === true;
    if (!refs.wasOn && !backend.setChildSubreaper(true)) return false;
  }
  refs.holders++;
  return true;
}

/** Drops a reference; the last one restores the flag as the first found it. */
export function releaseSubreaper(): void {
  if (--refs.holders === 0 && !refs.wasOn) backend.setChildSubreaper(false);
}
