// idle: an idle supervised process for the benchmarks, cheaper to start
// than sleep(1) and unable to outlive the bench that started it.
//
//   idle [seconds] [marker...]
//
// Sleeps `seconds` (default 3600) and exits 0; SIGTERM and SIGKILL end it
// at once (default dispositions). Arguments after the first are ignored:
// they carry a launch token or a marker the bench sweeps by. It dies with
// its parent (PR_SET_PDEATHSIG SIGKILL), so a bench worker killed by a
// timeout leaves no idle process behind for an hour.
//
// Build: cc -O2 -Wall -Werror -o idle idle.c
#define _GNU_SOURCE
#include <signal.h>
#include <stdlib.h>
#include <sys/prctl.h>
#include <time.h>
#include <unistd.h>

int main(int argc, char** argv) {
  pid_t parent = getppid();
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) == -1) return 1;
  // The parent may have died before the prctl: then nobody would kill us.
  if (getppid() != parent) return 1;
  long seconds = argc > 1 ? strtol(argv[1], NULL, 10) : 3600;
  if (seconds <= 0) seconds = 3600;
  struct timespec ts = {.tv_sec = seconds, .tv_nsec = 0};
  while (nanosleep(&ts, &ts) == -1) {
    // EINTR from a stop/continue: sleep the rest.
  }
  return 0;
}
