// Counters a bench worker installs around custody, without changing it, to
// say where a measured call's time goes: the fsyncs it makes through
// node:fs, and the backend calls it makes (process-table scans,
// inspections). Each wrapper costs well under a microsecond per call, next
// to an fsync (tens of microseconds on tmpfs, a millisecond on a disk) or a
// scan (tens of milliseconds): the counts do not move the timings.
import fs from 'node:fs';
import { syncBuiltinESMExports } from 'node:module';

const FSYNC_CALLS = ['fsync', 'fsyncSync', 'fdatasync', 'fdatasyncSync'];

/**
 * Counts node:fs fsync and fdatasync calls from now on. Install it before
 * custody is imported: custody's state store binds fsync when it loads.
 * Returns count(): the calls so far, all four functions together.
 */
export function countFsyncs() {
  let n = 0;
  for (const name of FSYNC_CALLS) {
    const original = fs[name];
    fs[name] = function counted(...args) {
      n++;
      return original.apply(this, args);
    };
  }
  // Named imports of node:fs (import { fsync } from 'node:fs') see the wrappers too.
  syncBuiltinESMExports();
  return { count: () => n };
}

/**
 * Counts the calls of every method of custody's backend object and the time
 * each spends: a synchronous call until it returns, an asynchronous one
 * until its promise settles (concurrent calls overlap, so their times can
 * sum to more than the wall clock). A call made from inside another
 * backend method (the js backend's inspectPinned calls its inspect) is
 * counted apart, as nested. Returns snapshot(): { method: { calls, nested,
 * ms } } for the methods called so far, `calls` being those custody made.
 */
export function profileBackend(backend) {
  const stats = {};
  let depth = 0;
  const names = new Set();
  for (let proto = backend; proto && proto !== Object.prototype; proto = Object.getPrototypeOf(proto)) {
    for (const name of Object.getOwnPropertyNames(proto)) {
      const d = Object.getOwnPropertyDescriptor(proto, name);
      if (name !== 'constructor' && typeof d.value === 'function') names.add(name);
    }
  }
  for (const name of names) {
    const original = backend[name];
    const s = { calls: 0, nested: 0, ms: 0 };
    stats[name] = s;
    backend[name] = function profiled(...args) {
      if (depth > 0) {
        s.nested++;
        return original.apply(this, args);
      }
      s.calls++;
      const t0 = performance.now();
      let out;
      depth++;
      try {
        out = original.apply(this, args);
      } catch (err) {
        s.ms += performance.now() - t0;
        throw err;
      } finally {
        depth--;
      }
      if (out && typeof out.then === 'function') {
        return out.finally(() => {
          s.ms += performance.now() - t0;
        });
      }
      s.ms += performance.now() - t0;
      return out;
    };
  }
  return {
    snapshot: () =>
      Object.fromEntries(
        Object.entries(stats)
          .filter(([, s]) => s.calls + s.nested > 0)
          .map(([k, s]) => [k, { ...s }]),
      ),
  };
}
