/**
 * Liveness: a running instance's health probe (LaunchSpec.health), as a
 * service manager's watchdog does for a program that cannot ping one. After
 * readiness, the probe runs every intervalMs (the next one intervalMs after
 * the last settled, so probes never overlap), each cut off at timeoutMs;
 * `failures` failed or timed-out probes in a row end the instance through
 * the stop path, and the stop says `result: 'health'`. A probe that
 * succeeds resets the count. Each failure is a warning. The probing ends
 * with the instance's life as `running` (its exit, a stop, close()); a
 * failure that comes after that ends nothing.
 */
import { InvalidArgError } from '../errors.js';
import { assertDuration, assertKnownKeys } from '../validate.js';
import { TIMED_OUT, within } from '../timing.js';
import { callHook } from './hooks.js';
import type { LifecycleHost } from './host.js';
import type { Running } from './instances.js';
import type { HealthSpec } from './launch.js';
import { stopFor } from './stop.js';

const HEALTH_KEYS: Record<keyof HealthSpec, true> = {
  probe: true,
  intervalMs: true,
  timeoutMs: true,
  failures: true,
  graceMs: true,
};

export function validateHealth(h: unknown): void {
  if (h === undefined) return;
  if (!h || typeof h !== 'object')
    throw new InvalidArgError('health must be { probe, intervalMs, timeoutMs?, failures? }');
  const spec = h as HealthSpec;
  assertKnownKeys(spec, HEALTH_KEYS, 'LaunchSpec.health');
  if (typeof spec.probe !== 'function') throw new InvalidArgError('health.probe must be a function');
  assertDuration(spec.intervalMs, 'health.intervalMs');
  if (spec.intervalMs < 1) throw new InvalidArgError('health.intervalMs must be at least 1 ms');
  if (spec.timeoutMs !== undefined) assertDuration(spec.timeoutMs, 'health.timeoutMs');
  if (spec.graceMs !== undefined) assertDuration(spec.graceMs, 'health.graceMs');
  const f = spec.failures;
  if (f !== undefined && !(Number.isInteger(f) && f >= 1 && f <= 1000)) {
    throw new InvalidArgError('health.failures must be an integer from 1 to 1000');
  }
}

/**
 * Probes a running instance (a launch's, or an adopted one's from specs) until it is no longer the table's
 * `running` record; `failures` in a row end it through the stop path.
 */
export function probeHealth(host: LifecycleHost, t: Running, spec: HealthSpec): void {
  const { id } = t.instance;
  const timeoutMs = spec.timeoutMs ?? Math.min(spec.intervalMs, 30_000);
  const limit = spec.failures ?? 3;
  const current = () => host.table.get(id) === t && !host.closed;
  let failed = 0;
  const round = async (): Promise<void> => {
    if (!current()) return;
    const ac = new AbortController();
    let why: string | null = null;
    try {
      const r = await within(callHook(spec.probe, t.instance, ac.signal), timeoutMs);
      if (r === TIMED_OUT) why = `timed out after ${timeoutMs} ms`;
    } catch (err) {
      why = (err as Error).message;
    } finally {
      ac.abort(new Error(why === null ? 'the probe is over' : `the probe failed: ${why}`));
    }
    // Its life as running ended while the probe ran: what the probe says ends nothing.
    if (!current()) return;
    if (why === null) {
      failed = 0;
    } else {
      failed++;
      host.emit('warning', { id, pid: t.handle.pid, message: `health probe ${failed}/${limit} failed: ${why}` });
      if (failed >= limit) {
        await stopFor(host, t, 'health', spec.graceMs ?? 10_000).catch((err: unknown) =>
          host.emit('warning', { id, message: `ending ${id} after failed health probes: ${(err as Error).message}` }),
        );
        return;
      }
    }
    schedule();
  };
  // Unref'd: probing never keeps the agent alive by itself (its instances' handles do, where they should).
  const schedule = () => setTimeout(() => void round(), spec.intervalMs).unref();
  schedule();
}
