// The spawned child's steps before exec. Everything in this file runs in the
// child, on its own stack, in the parent's memory (CLONE_VM), while the
// parent's thread is suspended (CLONE_VFORK, see spawn.cc): only
// async-signal-safe calls and raw syscalls, no allocation, no locks, no
// exceptions, and no write to the parent's memory but ChildArgs (and errno,
// which the parent reads only when clone itself fails). A step returns
// nullptr, or the call that failed with errno still holding its error.
#include "spawn.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include <cstring>

namespace custody {

namespace {

// Reports the failed step to the parent through the memory both share, and
// exits: the parent reads it once clone returns.
[[noreturn]] void ReportChildFailure(ChildArgs* a, const char* call) {
  a->failed_call = call;
  a->err = errno;
  _exit(127);
}

// First of all, before any code of ours that could fail half-way: move into
// the instance's cgroup. "0" names the writer (cgroup v2,
// Documentation/admin-guide/cgroup-v2.rst). A failed move (EBUSY: the cgroup
// has controllers on and children, ENOENT: it was removed, EACCES) fails the
// spawn: nothing of the target ever runs outside.
const char* JoinCgroup(const ChildArgs& a) {
  if (a.cgroup_procs >= 0 && CUSTODY_RETRY_EINTR(write(a.cgroup_procs, "0", 1)) != 1) return "write";
  return nullptr;
}

// Signals back to their defaults: Node ignores SIGPIPE and installs handlers
// that must not run in a VM monitor, nor here, on our memory, once signals
// are unblocked below. The handler table is the child's own (no
// CLONE_SIGHAND), so this does not touch the parent. The classic signals
// 1..31 all go to SIG_DFL, as libuv resets them for child_process; an
// ignored real-time signal stays ignored, as it does there, so the program
// starts the same on either backend and on either clone path. After
// CLONE_CLEAR_SIGHAND no handler is left at all: one rt_sigaction for each
// classic signal, 29 calls on the path the parent waits through. Without it
// (clone), a real-time signal with a handler is reset too: read first, so
// that one ignored is left as it is.
void ResetSignals(const ChildArgs& a) {
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < (a.handlers_cleared ? 32 : NSIG); sig++) {
    if (sig == SIGKILL || sig == SIGSTOP) continue;
    if (sig >= 32) {
      struct sigaction current;
      // EINVAL for the glibc-reserved 32 and 33: glibc keeps those itself.
      if (sigaction(sig, nullptr, &current) == -1 || current.sa_handler == SIG_IGN ||
          current.sa_handler == SIG_DFL) {
        continue;
      }
    }
    sigaction(sig, &dfl, nullptr);
  }
  // The parent blocked everything before clone; the program starts unblocked.
  sigset_t empty;
  sigemptyset(&empty);
  sigprocmask(SIG_SETMASK, &empty, nullptr);
}

// CLONE_FILES: the fd table is still the parent's, so nothing may touch an fd
// before this. close_range(keep_below, ~0U, CLOSE_RANGE_UNSHARE) (Linux 5.9)
// gives the child a private table copied only up to keep_below: the stdio
// sources sit in reserved slots there, every pidfd above. Cloning without
// CLONE_FILES would copy the whole table, thousands of pidfds, on every
// spawn. Without close_range: a full private copy, as before.
const char* UnshareFdTable(const ChildArgs& a) {
  if (a.keep_below != 0 && syscall(__NR_close_range, a.keep_below, ~0U, CLOSE_RANGE_UNSHARE) == -1 &&
      unshare(CLONE_FILES) == -1) {
    return "unshare";
  }
  return nullptr;
}

const char* EnterSessionOrGroup(const ChildArgs& a) {
  if (a.new_session && setsid() == -1) return "setsid";
  if (!a.new_session && a.new_group && setpgid(0, 0) == -1) return "setpgid";
  return nullptr;
}

// The stdio sources onto 0..2. a->stdio is the child's to rewrite: the
// parent never reads it after clone.
const char* InstallStdio(ChildArgs* a) {
  // Move sources that sit on 0..2 out of the way first, so dup2 onto one
  // target never clobbers the source of another.
  for (int i = 0; i < 3; i++) {
    if (a->stdio[i] < 3 && a->stdio[i] != i) {
      int moved = fcntl(a->stdio[i], F_DUPFD_CLOEXEC, 3);
      if (moved == -1) return "fcntl";
      a->stdio[i] = moved;
    }
  }
  for (int i = 0; i < 3; i++) {
    if (a->stdio[i] == i) {
      // Inherited as is: make sure it survives exec.
      if (fcntl(i, F_SETFD, 0) == -1) return "fcntl";
    } else if (dup2(a->stdio[i], i) == -1) {
      return "dup2";
    }
  }
  return nullptr;
}

// Nothing but stdio crosses exec, even an fd someone opened without
// O_CLOEXEC. close_range (Linux 5.9); older kernels get the CLOEXEC sweep of
// a bounded loop.
void CloseAboveStdio() {
  if (syscall(__NR_close_range, 3U, ~0U, 0U) == -1) {
    long max = sysconf(_SC_OPEN_MAX);
    if (max < 0 || max > 65536) max = 65536;
    for (int fd = 3; fd < max; fd++) fcntl(fd, F_SETFD, FD_CLOEXEC);
  }
}

// The 32-bit uid calls where the plain names are the old 16-bit ones (i386, arm).
#if defined(__NR_setresuid32)
constexpr long kSysSetgroups = __NR_setgroups32;
constexpr long kSysSetresgid = __NR_setresgid32;
constexpr long kSysSetresuid = __NR_setresuid32;
#else
constexpr long kSysSetgroups = __NR_setgroups;
constexpr long kSysSetresgid = __NR_setresgid;
constexpr long kSysSetresuid = __NR_setresuid;
#endif

// struct rlimit64 of the uapi (prlimit64, Linux 2.6.36).
struct KernelRlimit64 {
  uint64_t cur;
  uint64_t max;
};

constexpr char kOomScoreAdjPath[] = "/proc/self/oom_score_adj";

// oom_score_adj written whenever given, so an agent's own (-1000) never
// reaches the program. The kernel gives a CLONE_VFORK child its own value
// (__set_oom_adj skips the processes sharing its mm while vfork_done is
// set), so this does not move the parent's. The fd is the child's own: the
// table was unshared before this step.
const char* WriteOomScoreAdj(ChildArgs* a, const ChildExecAttrs& x) {
  int fd = CUSTODY_RETRY_EINTR(open(kOomScoreAdjPath, O_WRONLY | O_CLOEXEC));
  if (fd == -1) {
    a->failed_path = kOomScoreAdjPath;
    return "open";
  }
  ssize_t n = CUSTODY_RETRY_EINTR(write(fd, x.oom_score_adj, x.oom_score_adj_len));
  int saved = errno;
  close(fd);
  if (n == static_cast<ssize_t>(x.oom_score_adj_len)) return nullptr;
  errno = n == -1 ? saved : EIO;
  a->failed_path = kOomScoreAdjPath;
  return "write";
}

// The exec attributes, in this order: rlimits (a raised hard limit still
// needs the privilege dropped below), oom_score_adj (lowering needs
// CAP_SYS_RESOURCE), umask, no_new_privs, then the credentials, groups
// first (setgroups needs CAP_SETGID, which setresuid takes away). Raw
// syscalls: glibc's setuid, setgid and setgroups signal every thread of the
// process they believe they are in (nptl's setxid), which in a CLONE_VM
// child are the parent's; prlimit64 and prctl are plain calls either way.
const char* ApplyExecAttrs(ChildArgs* a) {
  const ChildExecAttrs& x = *a->exec_attrs;
  for (int i = 0; i < x.rlimit_count; i++) {
    KernelRlimit64 limit = {x.rlimits[i].soft, x.rlimits[i].hard};
    if (syscall(__NR_prlimit64, 0, x.rlimits[i].resource, &limit, nullptr) == -1) return "prlimit64";
  }
  if (x.set_oom_score_adj) {
    if (const char* call = WriteOomScoreAdj(a, x)) return call;
  }
  if (x.umask >= 0) umask(static_cast<mode_t>(x.umask));
  if (x.no_new_privs && prctl(PR_SET_NO_NEW_PRIVS, 1UL, 0UL, 0UL, 0UL) == -1) return "prctl";
  if (x.run_as) {
    if (syscall(kSysSetgroups, x.groups_count, x.groups) == -1) return "setgroups";
    if (syscall(kSysSetresgid, x.gid, x.gid, x.gid) == -1) return "setresgid";
    if (syscall(kSysSetresuid, x.uid, x.uid, x.uid) == -1) return "setresuid";
  }
  return nullptr;
}

}  // namespace

// In the order the comments above require. The exec attributes come last,
// after stdio (a low RLIMIT_NOFILE would refuse the dups onto 0..2), and
// chdir after them, as the new uid: a directory only it may enter is
// entered (systemd's WorkingDirectory= for the same reason).
int ChildMain(void* raw) {
  auto* a = static_cast<ChildArgs*>(raw);
  if (const char* call = JoinCgroup(*a)) ReportChildFailure(a, call);
  ResetSignals(*a);
  if (const char* call = UnshareFdTable(*a)) ReportChildFailure(a, call);
  if (const char* call = EnterSessionOrGroup(*a)) ReportChildFailure(a, call);
  if (const char* call = InstallStdio(a)) ReportChildFailure(a, call);
  CloseAboveStdio();
  if (a->exec_attrs != nullptr) {
    if (const char* call = ApplyExecAttrs(a)) ReportChildFailure(a, call);
  }
  if (a->cwd != nullptr && chdir(a->cwd) == -1) ReportChildFailure(a, "chdir");
  execve(a->file, a->argv, a->envp);
  ReportChildFailure(a, "execve");
}

}  // namespace custody
