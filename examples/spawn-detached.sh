#!/bin/sh
# spawn-detached.sh PROGRAM [ARGS...]
#
# A launcher in the shape of systemd-run (a transient unit's MainPID) and of
# Firecracker's jailer with --daemonize: it starts PROGRAM in a session of
# its own, prints "MAINPID=<pid>" on stdout at once and exits 0 without
# waiting. The pid it reports is not PROGRAM yet: for a moment it is a copy
# of this shell (setsid, then sh, then PROGRAM, all under that one pid),
# whose argv already carries PROGRAM's arguments. custody takes such a pid
# from a pid function and confirms it only once it has exec'd PROGRAM:
#
#   supervisor.launch({ command: 'examples/spawn-detached.sh', args: (t) => [qemu, '-name', t, ...],
#     stdout: { file: out }, pid: () => mainPidFrom(out), executable: qemu, ... })
#
# PROGRAM's own output goes to this script's stderr (the instance's stderr log).
[ $# -gt 0 ] || { echo "usage: $0 PROGRAM [ARGS...]" >&2; exit 2; }
setsid sh -c 'sleep 0.2; exec "$@"' sh "$@" </dev/null >&2 &
echo "MAINPID=$!"
