// The C limit for custody's process-table scan (listProcesses): a readdir
// loop over /proc with the same syscall sequence as native/scan.cc
// ListProcesses(), and no JavaScript around it.
//
//   scan <cmdline|stat-cmdline|stat-cmdline-owner|stat-cmdline-status> <rounds> <warmup> [argv...]
//
// For every numeric entry of /proc: openat(/proc, "<pid>", O_DIRECTORY),
// then openat + read-until-EOF + close of "stat" (parsed: state, ppid, pgrp,
// session, starttime) and "cmdline" (kept: copied into a per-scan arena with
// its length, as the addon copies it into JS strings) and, in the
// "stat-cmdline-owner" mode, an fstat of the directory (its owner), or in the
// "stat-cmdline-status" mode a read of "status" (parsed: the real uid), then
// close of the directory. Processes that vanish mid-scan are skipped.
// "stat-cmdline-owner" is the same work as ListProcesses; "stat-cmdline-status"
// is what it did before (status is the costliest file the kernel renders).
// "cmdline" is the least a sweep by argv can read: one openat of
// "<pid>/cmdline" relative to /proc, read, close, and nothing else (no
// per-process directory fd, no stat): the floor for an argv-first scan.
//
// Runs `warmup` untimed scans, then `rounds` timed scans, and prints one JSON
// line: ms per scan for each round, their median as "ms_per_scan", how many
// processes each round listed (the table is the whole machine's: other work
// may change its size), how many the last scan listed and how many of them
// have exactly `argv`
// (the idle processes' argv: the harness checks every variant saw them all).
//
// Build: cc -O2 -Wall -Werror -o scan scan.c
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <sys/stat.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#define MAX_ROUNDS 256

// What the scan keeps per process; the addon turns the same into a JS object.
struct entry {
  long long pid, ppid, pgrp, session, uid;
  unsigned long long start_ticks;
  char state;
  size_t argv_off, argv_len;  // into the arena
};

// A growable buffer, reused across scans (as a long-lived sweeper would).
struct buf {
  char* data;
  size_t len, cap;
};

static void die(const char* what) {
  fprintf(stderr, "scan: %s: %s\n", what, strerror(errno));
  exit(1);
}

static void reserve(struct buf* b, size_t extra) {
  if (b->len + extra <= b->cap) return;
  size_t cap = b->cap ? b->cap : 4096;
  while (cap < b->len + extra) cap *= 2;
  b->data = realloc(b->data, cap);
  if (b->data == NULL) die("realloc");
  b->cap = cap;
}

static int retry_open(int dirfd, const char* name, int flags) {
  int fd;
  do fd = openat(dirfd, name, flags);
  while (fd == -1 && errno == EINTR);
  return fd;
}

// ReadAt() in procfs.cc: openat, read 4096-byte chunks until EOF, close.
// Appends to `out` (len is not reset) and NUL-terminates what it appended.
// Returns 0 or an errno; on error `out` is as it was.
static int read_at(int dirfd, const char* name, struct buf* out) {
  int fd = retry_open(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW);
  if (fd == -1) return errno;
  size_t start = out->len;
  for (;;) {
    reserve(out, 4096 + 1);
    ssize_t n = read(fd, out->data + out->len, 4096);
    if (n == -1) {
      if (errno == EINTR) continue;
      int err = errno;
      close(fd);
      out->len = start;
      return err;
    }
    if (n == 0) break;
    out->len += (size_t)n;
  }
  close(fd);
  out->data[out->len] = '\0';
  return 0;
}

// ParseStat() in procfs.cc: fields counted from the LAST ')'.
static int parse_stat(const char* text, struct entry* e) {
  const char* close = strrchr(text, ')');
  if (strchr(text, '(') == NULL || close == NULL) return 0;
  char* end;
  e->pid = strtoll(text, &end, 10);
  if (end == text) return 0;
  const char* p = close + 1;
  for (int field = 0; field <= 19; field++) {
    while (*p == ' ') p++;
    if (*p == '\0' || *p == '\n') return 0;
    const char* start = p;
    while (*p != ' ' && *p != '\0' && *p != '\n') p++;
    switch (field) {
      case 0:
        if (p - start != 1) return 0;
        e->state = *start;
        break;
      case 1:
        e->ppid = strtoll(start, NULL, 10);
        break;
      case 2:
        e->pgrp = strtoll(start, NULL, 10);
        break;
      case 3:
        e->session = strtoll(start, NULL, 10);
        break;
      case 19:
        e->start_ticks = strtoull(start, &end, 10);
        if (end != p) return 0;
        break;
      default:
        break;
    }
  }
  return 1;
}

static long long parse_status_uid(const char* status) {
  const char* at = strstr(status, "\nUid:");
  return at ? strtoll(at + 5, NULL, 10) : -1;
}

struct scan {
  struct entry* entries;
  size_t n, cap;
  struct buf arena;  // every argv, NUL-separated as read
  struct buf text;   // stat / status text, reused
};

// The next /proc entry that is a process (a name starting with 1-9), or
// NULL at the end of the directory.
static const char* next_pid(DIR* d) {
  for (;;) {
    errno = 0;
    struct dirent* de = readdir(d);
    if (de == NULL) {
      if (errno != 0) die("readdir");
      return NULL;
    }
    if (de->d_name[0] >= '1' && de->d_name[0] <= '9') return de->d_name;
  }
}

// The entry after the last kept one, growing the array if needed.
static struct entry* next_slot(struct scan* s) {
  if (s->n == s->cap) {
    s->cap = s->cap ? s->cap * 2 : 1024;
    s->entries = realloc(s->entries, s->cap * sizeof *s->entries);
    if (s->entries == NULL) die("realloc");
  }
  return &s->entries[s->n];
}

// The "cmdline" mode: only /proc/<pid>/cmdline, opened relative to /proc.
static void scan_cmdline_once(struct scan* s) {
  s->n = 0;
  s->arena.len = 0;
  DIR* d = opendir("/proc");
  if (d == NULL) die("opendir /proc");
  int rootfd = dirfd(d);
  char name[64];
  for (const char* pid; (pid = next_pid(d)) != NULL;) {
    if (snprintf(name, sizeof name, "%s/cmdline", pid) >= (int)sizeof name) continue;
    struct entry* e = next_slot(s);
    e->pid = strtoll(pid, NULL, 10);
    size_t off = s->arena.len;
    if (read_at(rootfd, name, &s->arena) != 0) continue;  // vanished mid-scan
    e->argv_off = off;
    e->argv_len = s->arena.len - off;
    s->n++;
  }
  closedir(d);
}

static void scan_once(struct scan* s, int with_status) {
  s->n = 0;
  s->arena.len = 0;
  DIR* d = opendir("/proc");
  if (d == NULL) die("opendir /proc");
  int rootfd = dirfd(d);
  for (const char* pid; (pid = next_pid(d)) != NULL;) {
    int pdir = retry_open(rootfd, pid, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (pdir == -1) continue;
    struct entry* e = next_slot(s);
    e->uid = -1;
    s->text.len = 0;
    if (read_at(pdir, "stat", &s->text) != 0 || !parse_stat(s->text.data, e)) goto skip;
    size_t off = s->arena.len;
    if (read_at(pdir, "cmdline", &s->arena) != 0) goto skip;
    e->argv_off = off;
    e->argv_len = s->arena.len - off;
    if (with_status == 1) {
      s->text.len = 0;
      if (read_at(pdir, "status", &s->text) == 0) e->uid = parse_status_uid(s->text.data);
    } else if (with_status == 2) {
      // What ListProcesses does now: the directory's owner, one fstat.
      struct stat dst;
      if (fstat(pdir, &dst) == 0) e->uid = dst.st_uid;
    }
    s->n++;
  skip:
    close(pdir);
  }
  closedir(d);
}

// How many entries have exactly the argv `want` (want_len bytes, each
// element NUL-terminated, as /proc/<pid>/cmdline has it).
static size_t count_argv(const struct scan* s, const char* want, size_t want_len) {
  size_t count = 0;
  for (size_t i = 0; i < s->n; i++) {
    const struct entry* e = &s->entries[i];
    if (e->argv_len == want_len && memcmp(s->arena.data + e->argv_off, want, want_len) == 0) count++;
  }
  return count;
}

static double now_ms(void) {
  struct timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return ts.tv_sec * 1e3 + ts.tv_nsec / 1e6;
}

static int cmp_double(const void* a, const void* b) {
  double x = *(const double*)a, y = *(const double*)b;
  return (x > y) - (x < y);
}

int main(int argc, char** argv) {
  if (argc < 4) {
    fprintf(stderr, "usage: scan <cmdline|stat-cmdline|stat-cmdline-owner|stat-cmdline-status> <rounds> <warmup> [argv...]\n");
    return 2;
  }
  int with_status;
  if (strcmp(argv[1], "cmdline") == 0) with_status = -1;
  else if (strcmp(argv[1], "stat-cmdline") == 0) with_status = 0;
  else if (strcmp(argv[1], "stat-cmdline-status") == 0) with_status = 1;
  else if (strcmp(argv[1], "stat-cmdline-owner") == 0) with_status = 2;
  else {
    fprintf(stderr, "scan: unknown mode %s\n", argv[1]);
    return 2;
  }
  int rounds = atoi(argv[2]);
  int warmup = atoi(argv[3]);
  // The argv to count, joined as cmdline shows it: "a\0b\0".
  struct buf want = {0};
  for (int i = 4; i < argc; i++) {
    size_t len = strlen(argv[i]) + 1;
    reserve(&want, len);
    memcpy(want.data + want.len, argv[i], len);
    want.len += len;
  }
  if (rounds < 1 || rounds > MAX_ROUNDS || warmup < 0) {
    fprintf(stderr, "scan: rounds must be 1..%d, warmup >= 0\n", MAX_ROUNDS);
    return 2;
  }

  struct scan s = {0};
  for (int i = 0; i < warmup; i++) {
    if (with_status < 0) scan_cmdline_once(&s);
    else scan_once(&s, with_status);
  }
  double ms[MAX_ROUNDS], sorted[MAX_ROUNDS];
  size_t listed[MAX_ROUNDS];
  for (int r = 0; r < rounds; r++) {
    double t0 = now_ms();
    if (with_status < 0) scan_cmdline_once(&s);
    else scan_once(&s, with_status);
    ms[r] = now_ms() - t0;
    listed[r] = s.n;
  }
  memcpy(sorted, ms, sizeof(double) * (size_t)rounds);
  qsort(sorted, (size_t)rounds, sizeof(double), cmp_double);
  double median = rounds % 2 ? sorted[rounds / 2] : (sorted[rounds / 2 - 1] + sorted[rounds / 2]) / 2;

  printf("{\"variant\":\"%s\",\"ms_per_scan\":%.4f,\"rounds_ms\":[", argv[1], median);
  for (int r = 0; r < rounds; r++) printf("%s%.4f", r ? "," : "", ms[r]);
  printf("],\"listed_rounds\":[");
  for (int r = 0; r < rounds; r++) printf("%s%zu", r ? "," : "", listed[r]);
  printf("],\"listed\":%zu,\"marked\":%zu}\n", s.n, want.len ? count_argv(&s, want.data, want.len) : 0);
  return 0;
}
