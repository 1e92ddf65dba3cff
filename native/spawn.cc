// spawn: a child with a pidfd from birth.
//
// clone(CLONE_VM | CLONE_VFORK | CLONE_PIDFD): the child borrows the parent's
// memory instead of copying its page tables, so the cost does not grow with
// the parent's heap (fork of a 2 GiB Node is ~50x slower than vfork), and the
// kernel hands back a pidfd atomically with the pid, so there is no window in
// which the pid could be reaped and reused before we hold it. CLONE_VFORK
// suspends this thread until the child has exec'd or exited, which is what
// makes sharing memory safe and lets the child report exec failure by writing
// into our memory. On x86_64 the same clone goes through clone3, adding
// CLONE_CLEAR_SIGHAND (see Clone3 below); clone() is the fallback.
//
// Instance cgroups: the child writes "0" (itself) into the target cgroup's
// cgroup.procs, through an fd the parent opened, before it does anything
// else, so the program it execs, and everything that forks, double-forks or
// setsids from it, starts inside. The same before-exec guarantee as clone3
// with CLONE_INTO_CGROUP (Linux 5.7), on every architecture and on the
// clone() fallback too; probeCloneIntoCgroup() reports whether the kernel
// has that flag, for capabilities().
#include "common.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>

#include <algorithm>
#include <cstddef>
#include <cstring>
#include <vector>

#if defined(__SANITIZE_ADDRESS__)
#include <sanitizer/asan_interface.h>
#endif

#ifndef __NR_clone3
#define __NR_clone3 435  // Linux 5.3, the same number on every architecture
#endif

namespace custody {

namespace {

// spawn()'s flags (exported as constants.SPAWN_*).
constexpr int64_t kSpawnNewSession = 1;  // setsid() in the child
constexpr int64_t kSpawnNewGroup = 2;    // setpgid(0, 0) in the child
constexpr int64_t kSpawnCopyFdTable = 4;  // no CLONE_FILES
constexpr int64_t kSpawnFlagsAll = kSpawnNewSession | kSpawnNewGroup | kSpawnCopyFdTable;
// spawn() returns pid * kSpawnPidScale + pidfd (exported as SPAWN_PID_SCALE).
constexpr double kSpawnPidScale = 2147483648.0;  // 2^31

struct ChildArgs {
  const char* file;
  char* const* argv;
  char* const* envp;
  const char* cwd;  // nullptr: inherit
  int stdio[3];     // fd to become 0, 1, 2
  bool new_session;
  bool new_group;
  // cgroup.procs of the cgroup to start in (opened O_WRONLY by the parent),
  // or -1 to stay in ours.
  int cgroup_procs;
  // Non-zero when cloned with CLONE_FILES: the child's first act on the
  // shared fd table is to take a private copy of only the fds below this.
  unsigned int keep_below;
  // Cloned with CLONE_CLEAR_SIGHAND: the kernel has already put every
  // handled signal back to SIG_DFL, so no real-time signal needs a look.
  bool handlers_cleared;
  // Written by the child on failure; read by the parent after clone returns.
  int err;
  const char* failed_call;
};

// Runs in the child, on its own stack, in the parent's memory: only
// async-signal-safe calls, no allocation, no locks.
int ChildMain(void* raw) {
  auto* a = static_cast<ChildArgs*>(raw);

  // First of all, before any code of ours that could fail half-way: move
  // into the instance's cgroup. "0" names the writer (cgroup v2,
  // Documentation/admin-guide/cgroup-v2.rst). A failed move (EBUSY: the
  // cgroup has controllers on and children, ENOENT: it was removed, EACCES)
  // fails the spawn: nothing of the target ever runs outside.
  if (a->cgroup_procs >= 0 && CUSTODY_RETRY_EINTR(write(a->cgroup_procs, "0", 1)) != 1) {
    a->failed_call = "write";
    goto fail;
  }

  // Signals back to their defaults: Node ignores SIGPIPE and installs
  // handlers that must not run in a VM monitor, nor here, on our memory,
  // once signals are unblocked below. The handler table is the child's own
  // (no CLONE_SIGHAND), so this does not touch the parent. The classic
  // signals 1..31 all go to SIG_DFL, as libuv resets them for child_process;
  // an ignored real-time signal stays ignored, as it does there, so the
  // program starts the same on either backend and on either clone path.
  // After CLONE_CLEAR_SIGHAND no handler is left at all: one rt_sigaction
  // for each classic signal, 29 calls on the path the parent waits through.
  // Without it (clone), a real-time signal with a handler is reset too: read
  // first, so that one ignored is left as it is.
  struct sigaction dfl;
  memset(&dfl, 0, sizeof dfl);
  dfl.sa_handler = SIG_DFL;
  for (int sig = 1; sig < (a->handlers_cleared ? 32 : NSIG); sig++) {
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

  // CLONE_FILES: the fd table is still the parent's, so nothing may touch an
  // fd before this. close_range(keep_below, ~0U, CLOSE_RANGE_UNSHARE) (Linux
  // 5.9) gives the child a private table copied only up to keep_below: the
  // stdio sources sit in reserved slots there, every pidfd above. Cloning
  // without CLONE_FILES would copy the whole table, thousands of pidfds,
  // on every spawn. Without close_range: a full private copy, as before.
  if (a->keep_below != 0 && syscall(__NR_close_range, a->keep_below, ~0U, CLOSE_RANGE_UNSHARE) == -1 &&
      unshare(CLONE_FILES) == -1) {
    a->failed_call = "unshare";
    goto fail;
  }

  if (a->new_session && setsid() == -1) {
    a->failed_call = "setsid";
    goto fail;
  }
  if (!a->new_session && a->new_group && setpgid(0, 0) == -1) {
    a->failed_call = "setpgid";
    goto fail;
  }

  // Move sources that sit on 0..2 out of the way first, so dup2 onto one
  // target never clobbers the source of another.
  for (int i = 0; i < 3; i++) {
    if (a->stdio[i] < 3 && a->stdio[i] != i) {
      int moved = fcntl(a->stdio[i], F_DUPFD_CLOEXEC, 3);
      if (moved == -1) {
        a->failed_call = "fcntl";
        goto fail;
      }
      a->stdio[i] = moved;
    }
  }
  for (int i = 0; i < 3; i++) {
    if (a->stdio[i] == i) {
      // Inherited as is: make sure it survives exec.
      if (fcntl(i, F_SETFD, 0) == -1) {
        a->failed_call = "fcntl";
        goto fail;
      }
    } else if (dup2(a->stdio[i], i) == -1) {
      a->failed_call = "dup2";
      goto fail;
    }
  }
  // Nothing but stdio crosses exec, even an fd someone opened without
  // O_CLOEXEC. close_range (Linux 5.9); older kernels get the CLOEXEC sweep
  // of a bounded loop.
  if (syscall(__NR_close_range, 3U, ~0U, 0U) == -1) {
    long max = sysconf(_SC_OPEN_MAX);
    if (max < 0 || max > 65536) max = 65536;
    for (int fd = 3; fd < max; fd++) fcntl(fd, F_SETFD, FD_CLOEXEC);
  }

  if (a->cwd != nullptr && chdir(a->cwd) == -1) {
    a->failed_call = "chdir";
    goto fail;
  }
  execve(a->file, a->argv, a->envp);
  a->failed_call = "execve";

fail:
  a->err = errno;
  _exit(127);
}

// clone3 (Linux 5.3) with CLONE_CLEAR_SIGHAND (5.5), x86_64 only: the one
// architecture whose trampoline runs in this project's tests. clone3 returns
// twice, the second time on the child's new stack, where there is no caller
// frame to return to, so the child side calls ChildMain from inside the asm
// and exits with its result (SYS_exit), as glibc's clone() does. The kernel
// keeps every register but rax (0 in the child), rcx and r11 across the
// syscall, and sets rsp to the top of the stack we give it (16-byte aligned,
// so the call leaves ChildMain's frame ABI-aligned). Returns the child's pid,
// or -errno.
//
// struct clone_args as of Linux 5.7 (set_tid 5.5, cgroup 5.7); a caller
// passes the size of the fields it uses, and the kernel reads only those.
struct CloneArgs {
  __u64 flags, pidfd, child_tid, parent_tid, exit_signal, stack, stack_size, tls, set_tid, set_tid_size, cgroup;
};
// The size of the first version (CLONE_ARGS_SIZE_VER0): up to tls.
constexpr size_t kCloneArgsSizeVer0 = offsetof(CloneArgs, set_tid);
// Flags only clone3 has; the uapi headers of older toolchains lack them.
constexpr __u64 kCloneClearSighand = 0x100000000ULL;  // Linux 5.5
constexpr __u64 kCloneIntoCgroup = 0x200000000ULL;    // Linux 5.7

#if defined(__x86_64__)
long Clone3(CloneArgs* args, ChildArgs* child) {
  long ret;
  register int (*fn)(void*) asm("r12") = ChildMain;
  register ChildArgs* arg asm("r13") = child;
  asm volatile(
      "syscall\n\t"
      "test %%rax, %%rax\n\t"
      "jnz 1f\n\t"
      "xor %%ebp, %%ebp\n\t"  // the child's frame chain ends here
      "mov %%r13, %%rdi\n\t"
      "call *%%r12\n\t"
      "mov %%eax, %%edi\n\t"
      "mov $60, %%eax\n\t"  // SYS_exit: ChildMain execs or _exits, this is a guard
      "syscall\n\t"
      "hlt\n\t"
      "1:\n\t"
      : "=a"(ret)
      : "a"(static_cast<long>(__NR_clone3)), "D"(args), "S"(kCloneArgsSizeVer0), "r"(fn), "r"(arg)
      : "rcx", "r11", "memory");
  return ret;
}
#else
// No trampoline here: the first spawn takes this as clone3's absence and
// uses clone() from then on, without a syscall.
long Clone3(CloneArgs*, ChildArgs*) { return -ENOSYS; }
#endif

std::vector<std::string> StringList(const Napi::Env& env, const Napi::Value& v, const char* name) {
  if (!v.IsArray()) throw Napi::TypeError::New(env, std::string(name) + " must be an array of strings");
  Napi::Array arr = v.As<Napi::Array>();
  // Length() is a call into the engine: once, not once per element.
  uint32_t n = arr.Length();
  std::vector<std::string> out;
  out.reserve(n);
  for (uint32_t i = 0; i < n; i++) {
    Napi::Value item = arr.Get(i);
    // EncodeBytes: a string is the surrogateescape form of its bytes (or a
    // Buffer is the bytes), so an argv read from /proc is re-exec'd exactly.
    out.push_back(EncodeBytes(item, name));
  }
  return out;
}

std::vector<char*> CPointers(std::vector<std::string>& strings) {
  std::vector<char*> out;
  out.reserve(strings.size() + 1);
  for (auto& s : strings) out.push_back(&s[0]);
  out.push_back(nullptr);
  return out;
}

// spawn(file, argv, envp | null, cwd | null, stdin, stdout, stderr, flags,
// cgroupProcs) -> pid * SPAWN_PID_SCALE + pidfd. Positional, and one number
// back: named properties cost a string internalization each, per spawn. `file` is an
// absolute or relative path (PATH search is the caller's policy); the stdio
// fds become 0..2 (-1: the addon's /dev/null); flags are SPAWN_NEW_SESSION,
// SPAWN_NEW_GROUP and SPAWN_COPY_FD_TABLE; cgroupProcs is an fd on a
// cgroup's cgroup.procs, or -1. Exec failure is thrown as the errno of the
// step that failed (execve ENOENT, chdir ENOENT...), after the child has
// been reaped.
Napi::Value Spawn(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 9 || !info[0].IsString()) {
    throw Napi::TypeError::New(env, "spawn(file, argv, envp, cwd, stdin, stdout, stderr, flags, cgroupProcs)");
  }
  // Paths are bytes as argv is: a string's escaped bytes (U+DC80..U+DCFF)
  // name the file they stand for, never the U+FFFD file Utf8Value would.
  std::string file = EncodeBytes(info[0], "file");
  std::vector<std::string> argv_s = StringList(env, info[1], "argv");
  // null envp: the child gets this process's environ, which Node keeps in
  // step with process.env (setenv/unsetenv), without copying it through
  // JavaScript on every spawn.
  bool inherit_env = info[2].IsNull() || info[2].IsUndefined();
  std::vector<std::string> envp_s = inherit_env ? std::vector<std::string>() : StringList(env, info[2], "envp");
  std::string cwd;
  bool has_cwd = info[3].IsString();
  if (has_cwd) cwd = EncodeBytes(info[3], "cwd");
  std::vector<char*> argv = CPointers(argv_s);
  std::vector<char*> envp = CPointers(envp_s);

  ChildArgs a;
  memset(&a, 0, sizeof a);
  a.file = file.c_str();
  a.argv = argv.data();
  a.envp = inherit_env ? environ : envp.data();
  a.cwd = has_cwd ? cwd.c_str() : nullptr;
  for (size_t i = 0; i < 3; i++) {
    // -1: /dev/null, the addon's own (see InitSpawn).
    a.stdio[i] = static_cast<int>(ArgInteger(info, 4 + i, "stdio fd", -1, INT32_MAX));
  }
  int64_t spawn_flags = ArgInteger(info, 7, "flags", 0, kSpawnFlagsAll);
  a.new_session = (spawn_flags & kSpawnNewSession) != 0;
  a.new_group = (spawn_flags & kSpawnNewGroup) != 0;
  a.cgroup_procs = static_cast<int>(ArgInteger(info, 8, "cgroupProcs", -1, INT32_MAX));
  // SPAWN_COPY_FD_TABLE: clone without CLONE_FILES (the child gets a full
  // copy of the table at clone), for tools that cannot follow a child
  // sharing it, such as valgrind, which refuses such a clone outright.
  bool copy_fd_table = (spawn_flags & kSpawnCopyFdTable) != 0;

  // The child's stack lives in this frame: CLONE_VFORK keeps this thread
  // suspended, and so off this memory, until the child execs or exits.
  constexpr size_t kStackSize = 64 * 1024;
  alignas(64) char stack[kStackSize];

  // Block every signal so no handler of ours runs on the child's stack in
  // our memory between clone and the child's own reset.
  sigset_t all;
  sigset_t old;
  sigfillset(&all);
  pthread_sigmask(SIG_SETMASK, &all, &old);
  int pidfd = -1;
  int null_fd = -1;
  // glibc's clone() switches to the new stack for us; CLONE_PIDFD (Linux 5.2)
  // stores the pidfd through the parent_tid argument. SIGCHLD as the exit
  // signal keeps the child an ordinary child for waitid and for whoever
  // inherits it if we die.
  int flags = CLONE_VM | CLONE_VFORK | CLONE_PIDFD | SIGCHLD;
  AddonData* data = GetData(env);
  bool use_slots = data->spawn_slot_null >= 0 && !copy_fd_table;
  // Slots that hold something other than /dev/null for this spawn.
  bool slot_used[3] = {false, false, false};
  for (int i = 0; i < 3; i++) {
    if (a.stdio[i] != -1) continue;
    if (data->spawn_slot_null < 0) {
      // No slots on this kernel: a /dev/null of this spawn's own.
      null_fd = null_fd >= 0 ? null_fd : open("/dev/null", O_RDWR | O_CLOEXEC);
      if (null_fd == -1) {
        int err = errno;
        pthread_sigmask(SIG_SETMASK, &old, nullptr);
        ThrowErrno(env, err, "open");
      }
      a.stdio[i] = null_fd;
    } else {
      // The addon's /dev/null sits below the slots, so it is in the child's
      // copy of the table: no dup3 needed.
      a.stdio[i] = data->spawn_slot_null;
    }
  }
  if (use_slots) {
    // Sources above the slots are dup3()'d onto them (dup3, not dup2: the
    // slot must stay close-on-exec, or another thread's child would inherit
    // it), so that everything the child needs sits below keep_below.
    // A source already below keep_below (the addon's /dev/null, an fd
    // opened before the slots) is in the child's copy as it is.
    unsigned int keep_below = 3;
    for (int slot : data->spawn_slots) keep_below = std::max(keep_below, static_cast<unsigned int>(slot) + 1);
    for (int i = 0; i < 3; i++) {
      if (static_cast<unsigned int>(a.stdio[i]) < keep_below) continue;
      if (dup3(a.stdio[i], data->spawn_slots[i], O_CLOEXEC) == -1) {
        int err = errno;
        for (int j = 0; j < i; j++) {
          if (slot_used[j]) dup3(data->spawn_slot_null, data->spawn_slots[j], O_CLOEXEC);
        }
        pthread_sigmask(SIG_SETMASK, &old, nullptr);
        ThrowErrno(env, err, "dup3");
      }
      a.stdio[i] = data->spawn_slots[i];
      slot_used[i] = true;
    }
    a.keep_below = keep_below;
    flags |= CLONE_FILES;
  }
  pid_t pid = -1;
  int clone_errno = 0;
  if (!data->clone3_refused) {
    // The same child, with every handler cleared by the kernel at clone time,
    // atomically, instead of one rt_sigaction per signal in the child.
    CloneArgs args;
    memset(&args, 0, sizeof args);
    args.flags = static_cast<__u64>(flags & ~CSIGNAL) | kCloneClearSighand;
    args.pidfd = reinterpret_cast<__u64>(&pidfd);
    args.exit_signal = SIGCHLD;
    args.stack = reinterpret_cast<__u64>(stack);
    args.stack_size = kStackSize;
    a.handlers_cleared = true;
    long r = Clone3(&args, &a);
    if (r >= 0) {
      pid = static_cast<pid_t>(r);
    } else if (r == -ENOSYS || r == -EPERM || r == -EINVAL) {
      // No clone3 (before 5.3, valgrind), a seccomp filter refusing it, or no
      // CLONE_CLEAR_SIGHAND (before 5.5): no child exists; clone() from now on.
      data->clone3_refused = true;
    } else {
      clone_errno = static_cast<int>(-r);
    }
  }
  if (pid == -1 && clone_errno == 0) {
    a.handlers_cleared = false;
    pid = clone(ChildMain, stack + kStackSize, flags, &a, &pidfd);
    clone_errno = errno;
  }
  if (null_fd >= 0) close(null_fd);
  // Back to /dev/null: a slot still holding a pipe's write end would keep
  // its reader from ever seeing end-of-file.
  for (int i = 0; i < 3; i++) {
    if (slot_used[i]) dup3(data->spawn_slot_null, data->spawn_slots[i], O_CLOEXEC);
  }
#if defined(__SANITIZE_ADDRESS__)
  // The child ran on this array and exec'd without returning: AddressSanitizer
  // still holds its frames' redzones as poisoned. Clear them, or later uses of
  // this stack memory look like overflows.
  ASAN_UNPOISON_MEMORY_REGION(stack, kStackSize);
#endif
  pthread_sigmask(SIG_SETMASK, &old, nullptr);
  if (pid == -1) ThrowErrno(env, clone_errno, "clone");

  if (a.failed_call != nullptr) {
    // The child has already exited (_exit after the failed step): reap it so
    // a failed spawn leaves no zombie, then report the step's errno.
    siginfo_t si;
    CUSTODY_RETRY_EINTR(waitid(kPidfdIdtype, pidfd, &si, WEXITED));
    close(pidfd);
    ThrowErrno(env, a.err, a.failed_call);
  }

  GetData(env)->pidfds.insert(pidfd);
  // One number, not a [pid, pidfd] array: an array and its two elements are
  // three calls into the engine on every spawn. A pid is below PID_MAX_LIMIT
  // (2^22, include/linux/threads.h) and an fd below 2^31, so pid * 2^31 +
  // pidfd is at most 2^53 - 1: exact in a double.
  return Napi::Number::New(env, static_cast<double>(pid) * kSpawnPidScale + static_cast<double>(pidfd));
}

// probeCloneIntoCgroup() -> "" when clone3 knows CLONE_INTO_CGROUP (Linux
// 5.7), else the errno name. It asks for a clone into an fd that is not a
// cgroup (/dev/null): a kernel with the flag refuses the fd (EBADF) before
// any process exists; one without refuses the flag (EINVAL), one without
// clone3 says ENOSYS (or EPERM under a seccomp filter).
Napi::Value ProbeCloneIntoCgroup(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
  if (fd == -1) ThrowErrno(env, errno, "open");
  CloneArgs args;
  memset(&args, 0, sizeof args);
  args.flags = kCloneIntoCgroup;
  args.exit_signal = SIGCHLD;
  args.cgroup = static_cast<__u64>(fd);
  long pid = syscall(__NR_clone3, &args, sizeof args);
  int err = pid == -1 ? errno : 0;
  if (pid == 0) _exit(0);  // cannot happen (the fd is no cgroup), but never run on as a fork of Node
  if (pid > 0) CUSTODY_RETRY_EINTR(waitpid(static_cast<pid_t>(pid), nullptr, 0));
  close(fd);
  // Success would mean /dev/null was taken for a cgroup: nothing to trust.
  return Napi::String::New(env, err == EBADF ? std::string() : ErrnoName(err != 0 ? err : EINVAL));
}

}  // namespace

void CleanupSpawn(AddonData* data) {
  for (int& fd : data->spawn_slots) {
    if (fd >= 0) close(fd);
    fd = -1;
  }
  if (data->spawn_slot_null >= 0) close(data->spawn_slot_null);
  data->spawn_slot_null = -1;
}

void InitSpawn(Napi::Env env, Napi::Object exports) {
  // The slots exist only where the child can unshare cheaply (close_range,
  // Linux 5.9); elsewhere spawn copies the table at clone, as before.
  AddonData* data = GetData(env);
  if (syscall(__NR_close_range, ~0U, ~0U, 0) == 0) {
    int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
    if (null_fd >= 0) {
      bool ok = true;
      for (int i = 0; i < 3; i++) {
        data->spawn_slots[i] = fcntl(null_fd, F_DUPFD_CLOEXEC, 0);
        ok = ok && data->spawn_slots[i] >= 0;
      }
      data->spawn_slot_null = null_fd;
      if (!ok) CleanupSpawn(data);
    }
  }
  exports.Set("spawn", Napi::Function::New(env, Spawn, "spawn"));
  Napi::Object constants = exports.Get("constants").As<Napi::Object>();
  constants.Set("SPAWN_NEW_SESSION", Napi::Number::New(env, static_cast<double>(kSpawnNewSession)));
  constants.Set("SPAWN_NEW_GROUP", Napi::Number::New(env, static_cast<double>(kSpawnNewGroup)));
  constants.Set("SPAWN_COPY_FD_TABLE", Napi::Number::New(env, static_cast<double>(kSpawnCopyFdTable)));
  constants.Set("SPAWN_PID_SCALE", Napi::Number::New(env, kSpawnPidScale));
  exports.Set("probeCloneIntoCgroup", Napi::Function::New(env, ProbeCloneIntoCgroup, "probeCloneIntoCgroup"));
}

}  // namespace custody
