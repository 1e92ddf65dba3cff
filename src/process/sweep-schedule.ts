/**
 * A supervisor's sweeps as it reports them (a sweep event for findings,
 * warnings for SIGKILLs and survivors), and the periodic ones that heal
 * leaked helpers while it is idle (`SupervisorOptions.sweep`).
 */
import { displayArg } from '../bytes.js';
import type { Emit } from '../events.js';
import type { ProcessIdentity } from '../types.js';
import { validateSweep, type SweepOptions, type SweepResult } from './sweep.js';

export function reportSweep(emit: Emit, options: SweepOptions, r: SweepResult): void {
  const pids = (l: ProcessIdentity[]) => l.map((i) => i.pid);
  if (r.matched.length === 0) return;
  const argv = validateSweep(options);
  emit('sweep', {
    argv,
    dryRun: options.dryRun === true,
    matched: pids(r.matched),
    terminated: pids(r.terminated),
    killed: pids(r.killed),
    survivors: pids(r.survivors),
    message: `${options.dryRun ? 'would end' : 'ended'} ${r.matched.length} orphan(s) matching ${JSON.stringify(argv.map(displayArg)).slice(0, 120)}`,
  });
  if (r.killed.length)
    emit('warning', { message: `sweep: pids ${pids(r.killed).join(', ')} ignored SIGTERM and were killed` });
  if (r.survivors.length)
    emit('warning', { message: `sweep: pids ${pids(r.survivors).join(', ')} survived the sweep's deadline` });
}

/**
 * Sweeps every pattern each intervalMs, one round at a time (a round still
 * running skips the tick); a failed sweep is a warning. The timer never holds
 * the process open. Returns the function that stops it.
 */
export function scheduleSweeps(
  config: { intervalMs: number; patterns: SweepOptions[] },
  sweep: (pattern: SweepOptions) => Promise<unknown>,
  emit: Emit,
): () => void {
  let sweeping = false;
  let stopped = false;
  const timer = setInterval(() => {
    if (sweeping || stopped) return;
    sweeping = true;
    void (async () => {
      for (const pattern of config.patterns) {
        try {
          await sweep(pattern);
        } catch (err) {
          emit('warning', { message: `periodic sweep failed: ${(err as Error).message}` });
        }
      }
    })().finally(() => (sweeping = false));
  }, config.intervalMs);
  timer.unref();
  return () => {
    stopped = true;
    clearInterval(timer);
  };
}
