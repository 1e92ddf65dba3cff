// The C limit for custody's inspect(pid): the same syscall sequence as
// native/identity.cc InspectOne() and ReadIdentity(), with no JavaScript around it:
// pidfd_open, a dir fd on /proc/<pid>, then the exec-safe read (stat,
// cmdline, exe, uid, pid namespace, then cmdline and stat again, compared with the first:
// a process that exec'd mid-read is read again), the pidfs id, signal 0.
//
//   identity <pid> <iterations> [rounds [warmup]]
//
// Runs `warmup` untimed calls, then `rounds` timed rounds of `iterations`
// calls each on the same pid, and prints one JSON line: ns per call for each
// round, their median as "ns_per_call", and what the last call read (so the
// harness can check this loop really read the same process custody did).
//
// Build: cc -O2 -Wall -Werror -o identity identity.c
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/vfs.h>
#include <time.h>
#include <unistd.h>

// Same fallbacks as native/common.h: the build machine's headers may predate these.
#ifndef __NR_pidfd_open
#define __NR_pidfd_open 434
#endif
#ifndef __NR_pidfd_send_signal
#define __NR_pidfd_send_signal 424
#endif
#ifndef PIDFS_MAGIC
#define PIDFS_MAGIC 0x50494446
#endif

#define MAX_ROUNDS 64

// What one inspect() call learns; the addon turns the same into JS values.
struct identity {
  char state;
  long long ppid;
  unsigned long long start_ticks;
  long long uid;
  int argc;
  int has_exe;
  unsigned long long exe_dev, exe_ino;
  int has_pidfs_id;
  unsigned long long pidfs_id;
  unsigned long long pid_ns;
};

// A growable buffer, reused across calls (the addon reuses nothing, but its
// std::string appends cost about the same as a memcpy into this).
struct buf {
  char* data;
  size_t len, cap;
};

static void die(const char* what) {
  fprintf(stderr, "identity: %s: %s\n", what, strerror(errno));
  exit(1);
}

static int retry_open(int dirfd, const char* name, int flags) {
  int fd;
  do fd = openat(dirfd, name, flags);
  while (fd == -1 && errno == EINTR);
  return fd;
}

// ReadAt() in procfs.cc: openat, read 4096-byte chunks until EOF, close.
// Returns 0 or an errno. The text is NUL-terminated for the parsers.
static int read_at(int dirfd, const char* name, struct buf* out) {
  int fd = retry_open(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd == -1) return errno;
  out->len = 0;
  char chunk[4096];
  for (;;) {
    ssize_t n;
    do n = read(fd, chunk, sizeof chunk);
    while (n == -1 && errno == EINTR);
    if (n == -1) {
      int err = errno;
      close(fd);
      return err;
    }
    if (n == 0) break;
    if (out->len + (size_t)n + 1 > out->cap) {
      size_t cap = out->cap ? out->cap * 2 : 8192;
      while (cap < out->len + (size_t)n + 1) cap *= 2;
      char* grown = realloc(out->data, cap);
      if (grown == NULL) {
        close(fd);
        return ENOMEM;
      }
      out->data = grown;
      out->cap = cap;
    }
    memcpy(out->data + out->len, chunk, (size_t)n);
    out->len += (size_t)n;
  }
  close(fd);
  out->data[out->len] = '\0';
  return 0;
}

// ParseStat() in procfs.cc: comm may hold spaces and parentheses, so fields are
// counted from the LAST ')'. Field 0 after it is state, 1 ppid, 19 starttime.
static int parse_stat(const char* text, size_t len, struct identity* id) {
  const char* close = NULL;
  for (const char* p = text + len; p > text;) {
    if (*--p == ')') {
      close = p;
      break;
    }
  }
  if (close == NULL || strchr(text, '(') == NULL) return -1;
  const char* p = close + 1;
  for (int field = 0; field <= 19; field++) {
    while (*p == ' ') p++;
    if (*p == '\0' || *p == '\n') return -1;
    const char* start = p;
    while (*p != ' ' && *p != '\0' && *p != '\n') p++;
    if (field == 0) {
      if (p - start != 1) return -1;
      id->state = *start;
    } else if (field == 1) {
      id->ppid = strtoll(start, NULL, 10);
    } else if (field == 19) {
      char* end;
      id->start_ticks = strtoull(start, &end, 10);
      if (end != p) return -1;
    }
  }
  return 0;
}

// ParseStatusUid() in identity.cc: the real uid, first number of the Uid: line.
static long long parse_status_uid(const char* status) {
  const char* at = strstr(status, "\nUid:");
  return at ? strtoll(at + 5, NULL, 10) : -1;
}

// The argv split of InspectionValue() in identity.cc, minus building JS
// strings: count the NUL-separated pieces, a last piece without a trailing
// NUL included.
static int count_argv(const char* raw, size_t len) {
  int n = 0;
  for (size_t start = 0; start < len;) {
    const char* nul = memchr(raw + start, '\0', len - start);
    size_t end = nul ? (size_t)(nul - raw) : len;
    n++;
    start = end + 1;
  }
  return n;
}

struct bufs {
  struct buf text, cmdline, again;
};

// PIDFD_GET_INFO, as native/common.h defines it (Linux 6.13).
struct pidfd_info_v0 {
  unsigned long long mask, cgroupid;
  unsigned int pid, tgid, ppid, ruid, rgid, euid, egid, suid, sgid, fsuid, fsgid;
  int exit_code;
};
#define PIDFD_GET_INFO_V0 _IOWR(0xFF, 11, struct pidfd_info_v0)
#define PIDFD_INFO_CREDS_BIT (1ULL << 1)

// One inspect(pid): the sequence of InspectOne() in identity.cc, step for step.
static void inspect(int pid, const char* dir, struct bufs* b, struct identity* id) {
  int pidfd = (int)syscall(__NR_pidfd_open, pid, 0);
  if (pidfd == -1) die("pidfd_open");
  int piddir;
  do piddir = open(dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  while (piddir == -1 && errno == EINTR);
  if (piddir == -1) die("open");

  for (int attempt = 0;; attempt++) {
    if (attempt == 8) errno = EAGAIN, die("exec-safe read");
    int err = read_at(piddir, "stat", &b->text);
    if (err != 0) errno = err, die("read stat");
    if (parse_stat(b->text.data, b->text.len, id) != 0) errno = EPROTO, die("parse stat");

    err = read_at(piddir, "cmdline", &b->cmdline);
    if (err != 0) errno = err, die("read cmdline");
    id->argc = count_argv(b->cmdline.data, b->cmdline.len);

    struct stat exe_st;
    id->has_exe = fstatat(piddir, "exe", &exe_st, 0) == 0;
    if (id->has_exe) {
      id->exe_dev = (unsigned long long)exe_st.st_dev;
      id->exe_ino = (unsigned long long)exe_st.st_ino;
    }

    // The real uid from the pidfd (Linux 6.13), else from status.
    struct pidfd_info_v0 pi;
    memset(&pi, 0, sizeof pi);
    pi.mask = PIDFD_INFO_CREDS_BIT;
    if (ioctl(pidfd, PIDFD_GET_INFO_V0, &pi) == 0 && (pi.mask & PIDFD_INFO_CREDS_BIT)) {
      id->uid = pi.ruid;
    } else {
      err = read_at(piddir, "status", &b->text);
      if (err != 0) errno = err, die("read status");
      id->uid = parse_status_uid(b->text.data);
    }

    // The pid namespace it lives in, from the ns/pid link's text.
    char link[64];
    ssize_t n = readlinkat(piddir, "ns/pid", link, sizeof link - 1);
    if (n <= 0) die("readlink ns/pid");
    link[n] = '\0';
    if (sscanf(link, "pid:[%llu]", &id->pid_ns) != 1) errno = EPROTO, die("parse ns/pid");

    // The second read: the same argv and the same comm, or read it all again.
    err = read_at(piddir, "cmdline", &b->again);
    if (err != 0) errno = err, die("read cmdline");
    err = read_at(piddir, "stat", &b->text);
    if (err != 0) errno = err, die("read stat");
    struct identity second;
    if (parse_stat(b->text.data, b->text.len, &second) != 0) errno = EPROTO, die("parse stat");
    if (b->again.len == b->cmdline.len && memcmp(b->again.data, b->cmdline.data, b->cmdline.len) == 0 &&
        second.start_ticks == id->start_ticks)
      break;
  }

  struct statfs sfs;
  struct stat pidfd_st;
  id->has_pidfs_id = fstatfs(pidfd, &sfs) == 0 && (unsigned long)sfs.f_type == PIDFS_MAGIC &&
                     fstat(pidfd, &pidfd_st) == 0;
  if (id->has_pidfs_id) id->pidfs_id = (unsigned long long)pidfd_st.st_ino;

  if (syscall(__NR_pidfd_send_signal, pidfd, 0, NULL, 0) == -1 && errno == ESRCH) die("pidfd_send_signal");

  close(piddir);
  close(pidfd);
}

static long long now_ns(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return (long long)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

static long parse_arg(const char* s, const char* what, long min) {
  char* end;
  errno = 0;
  long v = strtol(s, &end, 10);
  if (errno != 0 || *end != '\0' || v < min) {
    fprintf(stderr, "identity: %s must be an integer >= %ld, got %s\n", what, min, s);
    exit(2);
  }
  return v;
}

int main(int argc, char** argv) {
  if (argc < 3 || argc > 5) {
    fprintf(stderr, "usage: %s <pid> <iterations> [rounds [warmup]]\n", argv[0]);
    return 2;
  }
  int pid = (int)parse_arg(argv[1], "pid", 1);
  long iterations = parse_arg(argv[2], "iterations", 1);
  int rounds = argc > 3 ? (int)parse_arg(argv[3], "rounds", 1) : 1;
  long warmup = argc > 4 ? parse_arg(argv[4], "warmup", 0) : 0;
  if (rounds > MAX_ROUNDS) {
    fprintf(stderr, "identity: at most %d rounds\n", MAX_ROUNDS);
    return 2;
  }

  // The addon builds this path from its procRoot argument on every call;
  // formatting it once here is the only step hoisted out of the loop.
  char dir[64];
  snprintf(dir, sizeof dir, "/proc/%d", pid);

  struct bufs b = {{0}, {0}, {0}};
  struct identity id = {0};
  for (long i = 0; i < warmup; i++) inspect(pid, dir, &b, &id);

  double per_call[MAX_ROUNDS], sorted[MAX_ROUNDS];
  for (int r = 0; r < rounds; r++) {
    long long t0 = now_ns();
    for (long i = 0; i < iterations; i++) inspect(pid, dir, &b, &id);
    per_call[r] = (double)(now_ns() - t0) / (double)iterations;
  }
  memcpy(sorted, per_call, sizeof(double) * (size_t)rounds);
  qsort(sorted, (size_t)rounds, sizeof(double), cmp_double);
  double median = rounds % 2 ? sorted[rounds / 2] : (sorted[rounds / 2 - 1] + sorted[rounds / 2]) / 2;

  printf("{\"variant\":\"c\",\"pid\":%d,\"iterations\":%ld,\"warmup\":%ld,\"ns_per_call\":%.1f,\"rounds_ns\":[", pid,
         iterations, warmup, median);
  for (int r = 0; r < rounds; r++) printf("%s%.1f", r ? "," : "", per_call[r]);
  // The last call's reading, in the field names of custody's ProcessIdentity.
  printf("],\"sample\":{\"state\":\"%c\",\"ppid\":%lld,\"startTicks\":%llu,\"uid\":%lld,\"argc\":%d,", id.state, id.ppid,
         id.start_ticks, id.uid, id.argc);
  if (id.has_exe)
    printf("\"exe\":{\"dev\":%llu,\"ino\":%llu},", id.exe_dev, id.exe_ino);
  else
    printf("\"exe\":null,");
  if (id.has_pidfs_id)
    printf("\"pidfsId\":\"%llu\"}}\n", id.pidfs_id);
  else
    printf("\"pidfsId\":null}}\n");

  free(b.text.data);
  free(b.cmdline.data);
  return 0;
}
