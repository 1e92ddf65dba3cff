// A perl program that plays one line of a plan per run, for restart tests:
// run n (counted in DIR/runs, one pid a line) waits (at most 20 s) for
// DIR/go, prints `run n`, then does line n of DIR/plan: `exit N`, `late
// SECONDS N` (exit N after that long), `sig NAME` (to itself), or (no line,
// or `run`) sleeps 30 s. Its argv is [DIR/player.pl, token, MARKER, DIR].
import { existsSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import type { LaunchSpec } from '../../src/index.js';
import { MARKER, tmpDir } from './procs.js';
import { PERL } from './supervisor.js';

const PLAYER = `
my ($tok, $mark, $dir) = @ARGV;
open(my $f, '>>', "$dir/runs") or die; print $f "$$\\n"; close $f;
open($f, '<', "$dir/runs") or die; my @r = <$f>; close $f; my $n = @r;
my @p = (); if (open($f, '<', "$dir/plan")) { @p = <$f>; close $f; chomp @p; }
for (1 .. 1000) { last if -e "$dir/go"; select(undef, undef, undef, 0.02) }
$| = 1; print "run $n\\n";
my $a = $p[$n - 1] // 'run';
exit $1 if $a =~ /^exit (\\d+)$/;
if ($a =~ /^late (\\S+) (\\d+)$/) { select(undef, undef, undef, $1); exit $2 }
if ($a =~ /^sig (\\w+)$/) { kill $1, $$; sleep 5; exit 99 }
sleep 30;
`;

export interface Player {
  dir: string;
  /** The program, for a fixture that builds its own spec. */
  script: string;
  spec: LaunchSpec;
  /** The pids of its runs so far. */
  runs: () => number[];
  /** Lets the first run (and every later one at once) play its line. */
  go: () => void;
  cleanup: () => void;
}

export function playerOf(id: string, plan: string[], extra: Partial<LaunchSpec> = {}): Player {
  const dir = tmpDir('custody-restart-');
  const script = join(dir.path, 'player.pl');
  writeFileSync(script, PLAYER);
  writeFileSync(join(dir.path, 'plan'), plan.map((l) => `${l}\n`).join(''));
  const runsFile = join(dir.path, 'runs');
  return {
    dir: dir.path,
    script,
    spec: { id, command: PERL, args: (t) => [script, t, MARKER, dir.path], ...extra },
    runs: () => (existsSync(runsFile) ? readFileSync(runsFile, 'utf8').trim().split('\n').map(Number) : []),
    go: () => writeFileSync(join(dir.path, 'go'), ''),
    cleanup: () => dir.cleanup(),
  };
}
