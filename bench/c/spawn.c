// The C limit for custody's spawn(): how many /bin/true children per second
// a process can start and reap with no JavaScript around it.
//
//   spawn <method> <concurrency> <round_ms> <rounds> <warmup_ms> [heap_mib]
//
// method:
//   vfork   vfork + execve, reaped with waitpid (the classic fast path)
//   clone3  clone3(CLONE_PIDFD | CLONE_VM | CLONE_VFORK) + execve, reaped
//           with waitid(P_PIDFD): what native/spawn.cc does, minus the
//           addon. Falls back to glibc clone() with the same flags where
//           clone3 is missing (ENOSYS) or this is not x86-64; the JSON says
//           which ran ("syscall").
//   fork    fork + execve + waitpid: the reference for what copying the
//           parent's page tables costs (libuv's spawn is a fork).
// concurrency: 1 is sequential (start one, reap it, start the next); N keeps
//   N children in flight (vfork/fork: waitpid(-1) for any; clone3: epoll on
//   the pidfds, then waitid(P_PIDFD, WNOHANG) and close, as custody does on
//   the libuv loop).
// Each round starts children for round_ms, then reaps the ones in flight;
// its rate is children reaped / elapsed time. warmup_ms of the same runs
// untimed first. heap_mib (default 0) maps that much anonymous memory and
// writes every page first, so it is resident (a stand-in for a big parent).
//
// The child does what spawn(..., { stdio: 'ignore' }) needs: /dev/null on
// 0, 1, 2, then execve with this process's environment.
//
// Prints one JSON line: spawns per second for each round, their median as
// "spawns_per_s", counts, and the resident set size after the heap was
// touched. Every child is reaped before the program exits.
//
// Build: cc -O2 -Wall -Werror -o spawn spawn.c
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
#include <sys/mman.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#ifndef CLONE_PIDFD
#define CLONE_PIDFD 0x00001000  // Linux 5.2
#endif
#ifndef __NR_clone3
#define __NR_clone3 435  // Linux 5.3
#endif
#ifndef P_PIDFD
#define P_PIDFD 3  // Linux 5.4; glibc names it only since 2.36
#endif

#define MAX_ROUNDS 64
#define MAX_CONCURRENCY 1024
#define CHILD_STACK_SIZE (64 * 1024)

extern char** environ;

static const char* const kFile = "/bin/true";
static char* kArgv[] = {"/bin/true", NULL};
static int dev_null = -1;

// The child's stack for clone3/clone. One is enough: CLONE_VFORK keeps us
// suspended until the child has exec'd (or exited), so no two children ever
// run on it at once.
static char child_stack[CHILD_STACK_SIZE] __attribute__((aligned(64)));

static void die(const char* what) {
  fprintf(stderr, "spawn: %s: %s\n", what, strerror(errno));
  exit(1);
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

// Runs in the child, in the parent's memory (vfork, CLONE_VM): only
// async-signal-safe calls, then exec or _exit.
static int child_main(void* unused) {
  (void)unused;
  for (int i = 0; i < 3; i++) {
    if (dup2(dev_null, i) == -1) _exit(126);
  }
  execve(kFile, kArgv, environ);
  _exit(127);
}

// ---- clone3 ----

// struct clone_args (linux/sched.h), spelled out: <linux/sched.h> clashes
// with <sched.h> on some libcs.
struct clone3_args {
  uint64_t flags;
  uint64_t pidfd;
  uint64_t child_tid;
  uint64_t parent_tid;
  uint64_t exit_signal;
  uint64_t stack;
  uint64_t stack_size;
  uint64_t tls;
};

static int have_clone3 = -1;  // -1: not tried yet

#if defined(__x86_64__)
// clone3 returns twice, the second time on the new stack, where there is no
// caller frame to return to: so the child side calls child_main and exits
// from inside this asm, like glibc's own clone() does. The stack pointer the
// kernel gives the child (stack + stack_size) is 16-byte aligned, so the
// call leaves child_main's frame ABI-aligned.
static long raw_clone3(struct clone3_args* args) {
  long ret;
  register void* fn __asm__("r12") = (void*)child_main;
  __asm__ volatile(
      "syscall\n\t"
      "test %%rax, %%rax\n\t"
      "jnz 1f\n\t"
      "xor %%ebp, %%ebp\n\t"
      "xor %%edi, %%edi\n\t"
      "call *%%r12\n\t"
      "mov %%eax, %%edi\n\t"
      "mov $60, %%eax\n\t"  // SYS_exit
      "syscall\n\t"
      "hlt\n"
      "1:\n\t"
      : "=a"(ret)
      : "0"((long)__NR_clone3), "D"(args), "S"(sizeof *args), "r"(fn)
      : "rcx", "r11", "memory", "cc");
  return ret;
}
#endif

// Starts one child with a pidfd from birth; returns the pidfd.
static int spawn_pidfd(void) {
  int pidfd = -1;
#if defined(__x86_64__)
  if (have_clone3 != 0) {
    struct clone3_args args;
    memset(&args, 0, sizeof args);
    args.flags = CLONE_PIDFD | CLONE_VM | CLONE_VFORK;
    args.pidfd = (uint64_t)(uintptr_t)&pidfd;
    args.exit_signal = SIGCHLD;
    args.stack = (uint64_t)(uintptr_t)child_stack;
    args.stack_size = CHILD_STACK_SIZE;
    long r = raw_clone3(&args);
    if (r >= 0) {
      have_clone3 = 1;
      return pidfd;
    }
    if (r != -ENOSYS) {
      errno = (int)-r;
      die("clone3");
    }
    have_clone3 = 0;
  }
#else
  have_clone3 = 0;
#endif
  // glibc's clone(): CLONE_PIDFD stores the pidfd through parent_tid.
  if (clone(child_main, child_stack + CHILD_STACK_SIZE, CLONE_PIDFD | CLONE_VM | CLONE_VFORK | SIGCHLD, NULL,
            &pidfd) == -1) {
    die("clone");
  }
  return pidfd;
}

static void reap_pidfd(int pidfd, int options) {
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
  if (si.si_code != CLD_EXITED || si.si_status != 0) {
    fprintf(stderr, "spawn: child ended with code %d status %d\n", si.si_code, si.si_status);
    exit(1);
  }
  close(pidfd);
}

// ---- vfork / fork ----

static pid_t spawn_forked(int use_vfork) {
  pid_t pid = use_vfork ? vfork() : fork();
  if (pid == -1) die(use_vfork ? "vfork" : "fork");
  if (pid == 0) child_main(NULL);
  return pid;
}

static void reap_any(void) {
  int status;
  pid_t r;
  do r = waitpid(-1, &status, 0);
  while (r == -1 && errno == EINTR);
  if (r == -1) die("waitpid");
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
    fprintf(stderr, "spawn: child %d ended with status 0x%x\n", (int)r, status);
    exit(1);
  }
}

// ---- one timed stretch ----

enum method { VFORK, CLONE3, FORK };

static int epfd = -1;

// Starts children for `ms`, keeping up to `conc` in flight, then reaps the
// rest. Returns how many were started (= reaped); *elapsed gets the time.
static long run_for(enum method m, int conc, double ms, double* elapsed) {
  long done = 0;
  int in_flight = 0;
  double t0 = now_ms();
  double end = t0 + ms;
  if (m == CLONE3) {
    struct epoll_event evs[MAX_CONCURRENCY];
    for (;;) {
      int more = now_ms() < end;
      if (!more && in_flight == 0) break;
      if (more && in_flight < conc) {
        int pidfd = spawn_pidfd();
        if (conc == 1) {
          reap_pidfd(pidfd, 0);
          done++;
          continue;
        }
        struct epoll_event ev = {.events = EPOLLIN, .data.fd = pidfd};
        if (epoll_ctl(epfd, EPOLL_CTL_ADD, pidfd, &ev) == -1) die("epoll_ctl");
        in_flight++;
        continue;
      }
      int n;
      do n = epoll_wait(epfd, evs, MAX_CONCURRENCY, -1);
      while (n == -1 && errno == EINTR);
      if (n == -1) die("epoll_wait");
      for (int i = 0; i < n; i++) {
        if (epoll_ctl(epfd, EPOLL_CTL_DEL, evs[i].data.fd, NULL) == -1) die("epoll_ctl");
        reap_pidfd(evs[i].data.fd, WNOHANG);
        in_flight--;
        done++;
      }
    }
  } else {
    for (;;) {
      int more = now_ms() < end;
      if (!more && in_flight == 0) break;
      if (more && in_flight < conc) {
        spawn_forked(m == VFORK);
        in_flight++;
        continue;
      }
      reap_any();
      in_flight--;
      done++;
    }
  }
  *elapsed = now_ms() - t0;
  return done;
}

static long parse_arg(const char* s, const char* what, long min, long max) {
  char* end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno || *end || end == s || v < min || v > max) {
    fprintf(stderr, "spawn: %s must be an integer in [%ld, %ld], got %s\n", what, min, max, s);
    exit(2);
  }
  return v;
}

static long rss_kib(void) {
  FILE* f = fopen("/proc/self/statm", "r");
  long size = 0, resident = 0;
  if (f == NULL) return -1;
  if (fscanf(f, "%ld %ld", &size, &resident) != 2) resident = -1;
  fclose(f);
  return resident < 0 ? -1 : resident * (sysconf(_SC_PAGESIZE) / 1024);
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  if (argc < 6) {
    fprintf(stderr, "usage: %s <vfork|clone3|fork> <concurrency> <round_ms> <rounds> <warmup_ms> [heap_mib]\n",
            argv[0]);
    return 2;
  }
  enum method m;
  if (strcmp(argv[1], "vfork") == 0) m = VFORK;
  else if (strcmp(argv[1], "clone3") == 0) m = CLONE3;
  else if (strcmp(argv[1], "fork") == 0) m = FORK;
  else {
    fprintf(stderr, "spawn: unknown method %s\n", argv[1]);
    return 2;
  }
  int conc = (int)parse_arg(argv[2], "concurrency", 1, MAX_CONCURRENCY);
  long round_ms = parse_arg(argv[3], "round_ms", 1, 600000);
  int rounds = (int)parse_arg(argv[4], "rounds", 1, MAX_ROUNDS);
  long warmup_ms = parse_arg(argv[5], "warmup_ms", 0, 600000);
  long heap_mib = argc > 6 ? parse_arg(argv[6], "heap_mib", 0, 1 << 20) : 0;

  if (heap_mib > 0) {
    size_t len = (size_t)heap_mib << 20;
    char* heap = mmap(NULL, len, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
    if (heap == MAP_FAILED) die("mmap");
    long page = sysconf(_SC_PAGESIZE);
    for (size_t off = 0; off < len; off += (size_t)page) heap[off] = (char)(off >> 12 | 1);
    // Never unmapped: it must stay resident for every round.
  }
  long rss = rss_kib();

  dev_null = open("/dev/null", O_RDWR | O_CLOEXEC);
  if (dev_null == -1) die("open /dev/null");
  if (m == CLONE3) {
    epfd = epoll_create1(EPOLL_CLOEXEC);
    if (epfd == -1) die("epoll_create1");
  }

  double elapsed;
  long warm = warmup_ms > 0 ? run_for(m, conc, (double)warmup_ms, &elapsed) : 0;
  double rate[MAX_ROUNDS];
  long count[MAX_ROUNDS];
  double ms[MAX_ROUNDS];
  for (int r = 0; r < rounds; r++) {
    count[r] = run_for(m, conc, (double)round_ms, &ms[r]);
    rate[r] = count[r] * 1000.0 / ms[r];
  }
  double sorted[MAX_ROUNDS];
  memcpy(sorted, rate, sizeof rate);
  qsort(sorted, (size_t)rounds, sizeof sorted[0], cmp_double);
  double med = rounds % 2 ? sorted[rounds / 2] : (sorted[rounds / 2 - 1] + sorted[rounds / 2]) / 2;

  // Nothing may be left: every child was reaped by run_for.
  if (waitpid(-1, NULL, WNOHANG) != -1 || errno != ECHILD) {
    fprintf(stderr, "spawn: a child was left unreaped\n");
    return 1;
  }

  const char* syscall_name = m == VFORK ? "vfork" : m == FORK ? "fork" : have_clone3 == 1 ? "clone3" : "clone";
  printf("{\"variant\":\"c-%s\",\"syscall\":\"%s\",\"concurrency\":%d,\"heap_mib\":%ld,\"rss_kib\":%ld,", argv[1],
         syscall_name, conc, heap_mib, rss);
  printf("\"round_ms\":%ld,\"warmup_ms\":%ld,\"warmup_spawns\":%ld,\"spawns_per_s\":%.1f,\"rounds_per_s\":[", round_ms,
         warmup_ms, warm, med);
  for (int r = 0; r < rounds; r++) printf("%s%.1f", r ? "," : "", rate[r]);
  printf("],\"counts\":[");
  for (int r = 0; r < rounds; r++) printf("%s%ld", r ? "," : "", count[r]);
  printf("],\"elapsed_ms\":[");
  for (int r = 0; r < rounds; r++) printf("%s%.1f", r ? "," : "", ms[r]);
  printf("],\"leftover_children\":0}\n");
  return 0;
}
