#!/bin/sh
# launcher.sh PIDFILE PROGRAM [ARGS...] -- used by examples/demo.js.
#
# A stand-in for launchers such as systemd-run or a daemonizing wrapper that
# report a pid before that pid runs the program: it forks, writes the fork's
# pid to PIDFILE at once, and only 0.3 s later does the fork exec PROGRAM.
# Until then the pid in PIDFILE is a copy of this shell, whose argv (this
# script's arguments) already contains PROGRAM's arguments. The launcher
# waits for the program and exits with its status.
pidfile=$1
shift
( sleep 0.3; exec "$@" ) &
child=$!
echo "$child" > "$pidfile"
wait "$child"
exit $?
