// exits: the C limit for exit notification at scale. With N idle children
// alive, their pidfds held in one epoll set, how long does it take to start
// a short-lived child and see its exit?
//
//   exits <plain|files> <idle_bin> <marker> <short_lived> <rounds> <warmup> <idle_count>...
//
// For each idle count, in ascending order: start idle children (idle_bin
// 3600 marker) until that many are alive, each pidfd added to the epoll set;
// then, `rounds` times, start `short_lived` /bin/true children one after the
// other, each: clone, add its pidfd to the epoll set, epoll_wait until it is
// readable, waitid(P_PIDFD, WNOHANG), close. `warmup` untimed ones first.
//
// How the child gets its fd table, which is what differs with the number of
// pidfds held (every idle child is one more open fd). Both modes do what the
// native backend does for stdio 'ignore': open /dev/null for the spawn (so it
// lands above every pidfd, as openSync does in src/backend/native.ts), have
// the child put it on 0, 1, 2 and close everything above, execve with this
// process's environment, and close /dev/null again.
//   plain  clone(CLONE_VM | CLONE_VFORK | CLONE_PIDFD): the kernel copies
//          the whole fd table into the child (every open fd: a pointer copy
//          and a reference), and the child closes them all again
//          (close_range(3, ~0U)) before exec. What native/spawn.cc did first.
//   files  what native/spawn.cc does now. Three reserved slots, opened on /dev/null
//          (O_CLOEXEC) before any pidfd so they sit low; per spawn the stdio
//          sources are dup3'd onto them (O_CLOEXEC), then
//          clone(CLONE_FILES | CLONE_VM | CLONE_VFORK | CLONE_PIDFD): the
//          child shares our table, and its first act on it is
//          close_range(last slot + 1, ~0U, CLOSE_RANGE_UNSHARE) (Linux 5.9),
//          which copies only the fds up to the last slot (the kernel copies
//          up to the last open fd below the range when the range covers the
//          table's last open fd). Then dup2 of the slots onto 0..2 and
//          close_range(3, ~0U) on the now private, small table, as plain
//          does. Back in the parent the slots are pointed at /dev/null again
//          (so a pipe end would not stay open here).
// Prints one JSON line: for each idle count, per round, microseconds per
// short-lived child (whole cycle) and the part of it spent in clone (which,
// with CLONE_VFORK, returns once the child has exec'd). At the end every
// idle child is killed (pidfd_send_signal) and reaped; the program checks
// that no child is left.
//
// Build: cc -O2 -Wall -Werror -o exits exits.c
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef CLONE_PIDFD
#define CLONE_PIDFD 0x00001000  // Linux 5.2
#endif
#ifndef P_PIDFD
#define P_PIDFD 3  // Linux 5.4
#endif
#ifndef __NR_close_range
#define __NR_close_range 436  // Linux 5.9
#endif
#ifndef __NR_pidfd_send_signal
#define __NR_pidfd_send_signal 424
#endif
#ifndef CLOSE_RANGE_UNSHARE
#define CLOSE_RANGE_UNSHARE (1U << 1)
#endif

#define MAX_ROUNDS 64
#define MAX_COUNTS 16
#define MAX_IDLE 100000
#define CHILD_STACK_SIZE (64 * 1024)

extern char** environ;

static int files_mode = 0;
static int slots[3] = {-1, -1, -1};  // files mode: reserved low stdio slots
static int slot_null = -1;           // files mode: what the slots hold between spawns
static int epfd = -1;
static char child_stack[CHILD_STACK_SIZE] __attribute__((aligned(64)));

struct child_args {
  const char* file;
  char* const* argv;
  int stdio[3];
  unsigned int keep_below;  // files mode: the unshare copies fds < this
  int err;
  const char* failed;
};

static void die(const char* what) {
  fprintf(stderr, "exits: %s: %s\n", what, strerror(errno));
  exit(1);
}

static double now_us(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e6 + ts.tv_nsec / 1e3;
}

// In the child, in our memory: async-signal-safe calls only.
static int child_main(void* raw) {
  struct child_args* a = raw;
  if (files_mode) {
    // Still sharing our table: nothing may touch it before this unshare.
    if (syscall(__NR_close_range, a->keep_below, ~0U, CLOSE_RANGE_UNSHARE) == -1) {
      a->failed = "close_range(CLOSE_RANGE_UNSHARE)";
      goto fail;
    }
  }
  for (int i = 0; i < 3; i++) {
    if (dup2(a->stdio[i], i) == -1) {
      a->failed = "dup2";
      goto fail;
    }
  }
  if (syscall(__NR_close_range, 3U, ~0U, 0U) == -1) {
    a->failed = "close_range";
    goto fail;
  }
  execve(a->file, a->argv, environ);
  a->failed = "execve";
fail:
  a->err = errno;
  _exit(127);
}

static int spawn_pidfd(const char* file, char* const* argv) {
  // As the native backend does for 'ignore': a /dev/null of its own per spawn.
  int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (null_fd == -1) die("open /dev/null");
  struct child_args a = {.file = file, .argv = argv, .stdio = {null_fd, null_fd, null_fd}, .err = 0, .failed = NULL};
  int pidfd = -1;
  int flags = CLONE_VM | CLONE_VFORK | CLONE_PIDFD | SIGCHLD;
  if (files_mode) {
    flags |= CLONE_FILES;
    for (int i = 0; i < 3; i++) {
      if (dup3(a.stdio[i], slots[i], O_CLOEXEC) == -1) die("dup3");
      a.stdio[i] = slots[i];
    }
    a.keep_below = (unsigned)slots[2] + 1;
  }
  if (clone(child_main, child_stack + CHILD_STACK_SIZE, flags, &a, &pidfd) == -1) die("clone");
  if (files_mode) {
    for (int i = 0; i < 3; i++) {
      if (dup3(slot_null, slots[i], O_CLOEXEC) == -1) die("dup3");
    }
  }
  close(null_fd);
  if (a.failed != NULL) {
    errno = a.err;
    die(a.failed);
  }
  return pidfd;
}

static void watch(int pidfd) {
  struct epoll_event ev = {.events = EPOLLIN, .data.fd = pidfd};
  if (epoll_ctl(epfd, EPOLL_CTL_ADD, pidfd, &ev) == -1) die("epoll_ctl ADD");
}

// Reaps a readable pidfd: WNOHANG must find the exit.
static void reap(int pidfd, int options, int expect_ok) {
  siginfo_t si;
  memset(&si, 0, sizeof si);
  int r;
  do r = waitid((idtype_t)P_PIDFD, (id_t)pidfd, &si, WEXITED | options);
  while (r == -1 && errno == EINTR);
  if (r == -1) die("waitid(P_PIDFD)");
  if (si.si_pid == 0) {
    errno = EAGAIN;
    die("waitid(P_PIDFD) found no exit on a readable pidfd");
  }
  if (expect_ok && (si.si_code != CLD_EXITED || si.si_status != 0)) {
    fprintf(stderr, "exits: child ended with code %d status %d\n", si.si_code, si.si_status);
    exit(1);
  }
}

static char* true_argv[] = {"/bin/true", NULL};

// One short-lived child, start to reaped. Adds the time spent in clone to *clone_us.
static void one_short(double* clone_us) {
  double t0 = now_us();
  int pidfd = spawn_pidfd("/bin/true", true_argv);
  *clone_us += now_us() - t0;
  watch(pidfd);
  struct epoll_event evs[8];
  for (;;) {
    int n = epoll_wait(epfd, evs, 8, -1);
    if (n == -1) {
      if (errno == EINTR) continue;
      die("epoll_wait");
    }
    int seen = 0;
    for (int i = 0; i < n; i++) {
      if (evs[i].data.fd != pidfd) {
        fprintf(stderr, "exits: an idle child (pidfd %d) exited\n", evs[i].data.fd);
        exit(1);
      }
      seen = 1;
    }
    if (seen) break;
  }
  if (epoll_ctl(epfd, EPOLL_CTL_DEL, pidfd, NULL) == -1) die("epoll_ctl DEL");
  reap(pidfd, WNOHANG, 1);
  close(pidfd);
}

static long parse_arg(const char* s, const char* what, long min, long max) {
  char* end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || end == s || v < min || v > max) {
    fprintf(stderr, "exits: %s must be an integer in [%ld, %ld], got %s\n", what, min, max, s);
    exit(2);
  }
  return v;
}

static int idle_fds[MAX_IDLE];
static int idle_n = 0;

int main(int argc, char** argv) {
  if (argc < 8) {
    fprintf(stderr, "usage: %s <plain|files> <idle_bin> <marker> <short_lived> <rounds> <warmup> <idle_count>...\n",
            argv[0]);
    return 2;
  }
  if (strcmp(argv[1], "plain") == 0) files_mode = 0;
  else if (strcmp(argv[1], "files") == 0) files_mode = 1;
  else {
    fprintf(stderr, "exits: unknown mode %s\n", argv[1]);
    return 2;
  }
  char* idle_argv[] = {argv[2], "3600", argv[3], NULL};
  long short_lived = parse_arg(argv[4], "short_lived", 1, 1000000);
  int rounds = (int)parse_arg(argv[5], "rounds", 1, MAX_ROUNDS);
  long warmup = parse_arg(argv[6], "warmup", 0, 1000000);
  int ncounts = argc - 7;
  if (ncounts > MAX_COUNTS) {
    fprintf(stderr, "exits: at most %d idle counts\n", MAX_COUNTS);
    return 2;
  }
  long counts[MAX_COUNTS];
  for (int i = 0; i < ncounts; i++) {
    counts[i] = parse_arg(argv[7 + i], "idle_count", 0, MAX_IDLE);
    if (i > 0 && counts[i] < counts[i - 1]) {
      fprintf(stderr, "exits: idle counts must ascend\n");
      return 2;
    }
  }
  // Room for every pidfd.
  struct rlimit rl;
  if (getrlimit(RLIMIT_NOFILE, &rl) == 0 && rl.rlim_cur < (rlim_t)counts[ncounts - 1] + 256) {
    rl.rlim_cur = (rlim_t)counts[ncounts - 1] + 256;
    if (rl.rlim_max < rl.rlim_cur) rl.rlim_max = rl.rlim_cur;
    if (setrlimit(RLIMIT_NOFILE, &rl) == -1) die("setrlimit(RLIMIT_NOFILE)");
  }

  // Opened first, so they are the lowest fds we hold: see "files" above.
  slot_null = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (slot_null == -1) die("open /dev/null");
  for (int i = 0; i < 3; i++) {
    slots[i] = fcntl(slot_null, F_DUPFD_CLOEXEC, 0);
    if (slots[i] == -1) die("fcntl(F_DUPFD_CLOEXEC)");
  }
  epfd = epoll_create1(EPOLL_CLOEXEC);
  if (epfd == -1) die("epoll_create1");

  printf("{\"variant\":\"c-%s\",\"syscall\":\"clone\",\"last_slot_fd\":%d,\"short_lived\":%ld,\"rounds\":%d,\"warmup\":%ld,\"idle\":[",
         argv[1], slots[2], short_lived, rounds, warmup);
  for (int c = 0; c < ncounts; c++) {
    double t0 = now_us();
    long added = counts[c] - idle_n;
    while (idle_n < counts[c]) {
      int fd = spawn_pidfd(argv[2], idle_argv);
      watch(fd);
      idle_fds[idle_n++] = fd;
    }
    double setup_us = now_us() - t0;
    double clone_us = 0;
    for (long i = 0; i < warmup; i++) one_short(&clone_us);
    printf("%s{\"idle\":%ld,\"setup_us_per_idle\":%.2f,\"rounds_us\":[", c ? "," : "", counts[c],
           added > 0 ? setup_us / added : 0.0);
    double clone_rounds[MAX_ROUNDS];
    for (int r = 0; r < rounds; r++) {
      clone_us = 0;
      double r0 = now_us();
      for (long i = 0; i < short_lived; i++) one_short(&clone_us);
      printf("%s%.2f", r ? "," : "", (now_us() - r0) / short_lived);
      clone_rounds[r] = clone_us / short_lived;
    }
    printf("],\"clone_rounds_us\":[");
    for (int r = 0; r < rounds; r++) printf("%s%.2f", r ? "," : "", clone_rounds[r]);
    printf("]}");
  }
  // Every idle child killed and reaped; nothing else may be left.
  for (int i = 0; i < idle_n; i++) {
    if (syscall(__NR_pidfd_send_signal, idle_fds[i], SIGKILL, NULL, 0) == -1 && errno != ESRCH) die("pidfd_send_signal");
  }
  for (int i = 0; i < idle_n; i++) {
    reap(idle_fds[i], 0, 0);
    close(idle_fds[i]);
  }
  int leftover = !(waitpid(-1, NULL, WNOHANG) == -1 && errno == ECHILD);
  printf("],\"leftover_children\":%d}\n", leftover);
  return leftover ? 1 : 0;
}
