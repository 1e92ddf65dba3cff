/**
 * Proof that nothing happened, without sleeping: a test that sleeps and then
 * asserts that nothing happened passes as well on a machine too loaded for
 * the thing to have had its chance. These wait instead for a positive event
 * that can only come after the thing would have shown.
 */
import { spawn as cpSpawn } from 'node:child_process';
import { readFileSync, writeFileSync } from 'node:fs';
import { isGone, killAndWait, loggedSignals, MARKER, waitFor } from './procs.js';

/**
 * The signals a signal-logging process (SIGNAL_LOGGER or fake-vm.py's
 * `--signal-log`) had received before this call. Sends it SIGUSR2, and once
 * that is logged SIGUSR1: Python runs the handlers of signals pending
 * together in signal-number order, so a SIGTERM pending with the first probe
 * is logged just after it; the second probe is sent only once the first was
 * handled, so when it is logged every signal sent before this call has been.
 * A process that died meanwhile (a SIGTERM it does not ignore) returns all
 * it logged.
 */
export async function signalsBeforeProbes(pid: number, log: string): Promise<string[]> {
  const probes = ['SIGUSR2', 'SIGUSR1'] as const;
  const times = (probe: string) => loggedSignals(log).filter((s) => s === probe).length;
  for (const probe of probes) {
    const before = times(probe);
    process.kill(pid, probe);
    await waitFor(() => times(probe) > before || isGone(pid), 10_000, `${probe} to be logged`);
    if (isGone(pid)) return loggedSignals(log);
  }
  const logged = loggedSignals(log);
  for (const probe of probes) logged.splice(logged.lastIndexOf(probe), 1);
  return logged;
}

/**
 * A process outside any cgroup under test that counts into its own file
 * every 10 ms: its count advancing by `ticks` proves that much time passed
 * with the CPU available, so a process next to it that did not advance was
 * stopped (frozen), not merely unscheduled.
 */
export async function counterWitness(file: string) {
  writeFileSync(file, '0');
  const counter = cpSpawn(
    'perl',
    [
      '-e',
      `my $n = 0; while (1) { open(my $f, '>', $ARGV[0]); print $f ++$n; close $f; select(undef, undef, undef, 0.01) }`,
      file,
      MARKER,
    ],
    { stdio: 'ignore' },
  );
  const count = () => Number(readFileSync(file, 'utf8') || '0');
  await waitFor(() => count() > 0, 10_000, 'the witness to count');
  return {
    /** Resolves once the witness counted `ticks` more times from now. */
    async advance(ticks: number): Promise<void> {
      const from = count();
      await waitFor(() => count() >= from + ticks, 10_000, `the witness to count ${ticks} more`);
    },
    stop: () => killAndWait(counter),
  };
}
