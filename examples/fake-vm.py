#!/usr/bin/env python3
"""A stand-in for a VM monitor (think QEMU), used by examples/demo.js.

    fake-vm.py --name NAME --custody-token TOKEN --control SOCKET
               [--ignore-sigterm] [--fail MESSAGE] [--boot-delay SECONDS]

It "boots" for --boot-delay seconds, then listens on a unix control socket.
A client that sends the line "powerdown" gets "ok" and the monitor exits 0;
"status" gets "running". SIGTERM makes it exit 0, unless --ignore-sigterm is
given (then only SIGKILL ends it, like a wedged monitor). With --fail it
prints MESSAGE on stderr and exits 3 before the socket ever appears, like a
monitor that cannot open its disk image.

--custody-token is not used by the program: it is there so that the launched
argv carries custody's per-launch token, which is how custody proves the
process is the one it launched.
"""
import argparse
import signal
import socket
import sys
import time


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument('--name', required=True)
    ap.add_argument('--custody-token', required=True)
    ap.add_argument('--control', required=True, help='unix socket path')
    ap.add_argument('--ignore-sigterm', action='store_true')
    ap.add_argument('--fail', metavar='MESSAGE')
    ap.add_argument('--boot-delay', type=float, default=0.1)
    args = ap.parse_args()

    if args.ignore_sigterm:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    else:
        signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))

    time.sleep(args.boot_delay)
    if args.fail:
        print(f'fake-vm {args.name}: {args.fail}', file=sys.stderr, flush=True)
        return 3

    srv = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    srv.bind(args.control)
    srv.listen(8)
    print(f'fake-vm {args.name}: listening on {args.control}', file=sys.stderr, flush=True)
    while True:
        conn, _ = srv.accept()
        with conn:
            try:
                line = conn.makefile('r').readline().strip()
                if line == 'powerdown':
                    conn.sendall(b'ok\n')
                    print(f'fake-vm {args.name}: powerdown requested, exiting', file=sys.stderr, flush=True)
                    return 0
                if line == 'status':
                    conn.sendall(b'running\n')
                elif line:
                    conn.sendall(b'error unknown command\n')
                # An empty line is a client that connected and left (a readiness probe).
            except OSError:
                pass


if __name__ == '__main__':
    sys.exit(main())
