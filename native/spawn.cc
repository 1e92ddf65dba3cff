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
// SpawnAndInitChild below picks the path; the child's steps before exec are
// child.cc's.
//
// Instance cgroups: the child writes "0" (itself) into the target cgroup's
// cgroup.procs, through an fd the parent opened, before it does anything
// else, so the program it execs, and everything that forks, double-forks or
// setsids from it, starts inside. The same before-exec guarantee as clone3
// with CLONE_INTO_CGROUP (Linux 5.7), on every architecture and on the
// clone() fallback too; probeCloneIntoCgroup() reports whether the kernel
// has that flag, for capabilities().
#include "spawn.h"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <sys/resource.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <cstdio>
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
// The exec attributes' array (spawn()'s tenth argument, built by
// src/backend/native-spawn.ts): [which, umask, oomScoreAdj, uid, gid,
// groupCount, ...groups, (resource, soft, hard)...]; `which` says which of
// the first four are given (exported as constants.EXEC_*).
constexpr int64_t kExecUmask = 1;
constexpr int64_t kExecOomScoreAdj = 2;
constexpr int64_t kExecNoNewPrivs = 4;
constexpr int64_t kExecRunAs = 8;
constexpr int64_t kExecAll = kExecUmask | kExecOomScoreAdj | kExecNoNewPrivs | kExecRunAs;
constexpr uint32_t kExecHeader = 6;
// NGROUPS_MAX of the kernel (include/uapi/linux/limits.h).
constexpr int64_t kMaxGroups = 65536;
// A uid or gid of -1 (4294967295) means "unchanged" to setresuid: never one to set.
constexpr int64_t kMaxId = 4294967294;
// spawn() returns pid * kSpawnPidScale + pidfd (exported as SPAWN_PID_SCALE).
constexpr double kSpawnPidScale = 2147483648.0;  // 2^31

// ---- The clone --------------------------------------------------------------

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

// The flags both clone paths share. CLONE_PIDFD (Linux 5.2) hands back the
// pidfd with the pid; SIGCHLD as the exit signal keeps the child an ordinary
// child for waitid and for whoever inherits it if we die.
constexpr int kCloneFlags = CLONE_VM | CLONE_VFORK | CLONE_PIDFD | SIGCHLD;

// The same child, with every handler cleared by the kernel at clone time,
// atomically, instead of one rt_sigaction per signal in the child. Returns
// the pid, or -1 with *err: the errno, or 0 when clone3 is refused here.
pid_t CloneWithClone3(AddonData* data, int flags, char* stack, size_t stack_size, ChildArgs* a, int* pidfd,
                      int* err) {
  CloneArgs args;
  memset(&args, 0, sizeof args);
  args.flags = static_cast<__u64>(flags & ~CSIGNAL) | kCloneClearSighand;
  args.pidfd = reinterpret_cast<__u64>(pidfd);
  args.exit_signal = SIGCHLD;
  args.stack = reinterpret_cast<__u64>(stack);
  args.stack_size = stack_size;
  a->handlers_cleared = true;
  long r = Clone3(&args, a);
  if (r >= 0) return static_cast<pid_t>(r);
  if (r == -ENOSYS || r == -EPERM || r == -EINVAL) {
    // No clone3 (before 5.3, valgrind), a seccomp filter refusing it, or no
    // CLONE_CLEAR_SIGHAND (before 5.5): no child exists; clone() from now on.
    data->clone3_refused = true;
  } else {
    *err = static_cast<int>(-r);
  }
  return -1;
}

// glibc's clone() switches to the new stack for us; CLONE_PIDFD stores the
// pidfd through the parent_tid argument. Returns the pid, or -1 with *err.
pid_t CloneWithClone(int flags, char* stack_top, ChildArgs* a, int* pidfd, int* err) {
  a->handlers_cleared = false;
  pid_t pid = clone(ChildMain, stack_top, flags, a, pidfd);
  *err = errno;
  return pid;
}

// ---- The parent -------------------------------------------------------------

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

// spawn()'s arguments, decoded and range-checked on the JavaScript thread:
// the bytes the child's pointers point into, and the child's arguments.
// Neither copied nor moved once decoded (a moved short string moves its bytes).
struct SpawnRequest {
  std::string file;
  std::vector<std::string> argv_bytes;
  std::vector<std::string> envp_bytes;
  std::string cwd;
  std::vector<char*> argv;
  std::vector<char*> envp;
  // SPAWN_COPY_FD_TABLE: clone without CLONE_FILES (the child gets a full
  // copy of the table at clone), for tools that cannot follow a child
  // sharing it, such as valgrind, which refuses such a clone outright.
  bool copy_fd_table = false;
  std::vector<gid_t> groups;
  ChildExecAttrs exec_attrs;
  ChildArgs child;

  SpawnRequest() = default;
  SpawnRequest(const SpawnRequest&) = delete;
  SpawnRequest& operator=(const SpawnRequest&) = delete;
};

// An rlimit value: +Infinity is RLIM64_INFINITY; anything else an exact
// integer a double holds (up to 2^53 - 1).
uint64_t RlimitValue(const Napi::Env& env, const Napi::Value& v) {
  if (v.IsNumber() && std::isinf(v.As<Napi::Number>().DoubleValue()) && v.As<Napi::Number>().DoubleValue() > 0) {
    return ~0ULL;
  }
  return static_cast<uint64_t>(IntegerValue(env, v, "rlimit", 0, (int64_t{1} << 53) - 1));
}

// The exec attributes' array (see kExecUmask), every integer range-checked
// here: the TypeScript layer has checked them (and refused what it must),
// so a failure here is a wrong call, never the user's input.
void DecodeExecAttrs(const Napi::Env& env, const Napi::Value& v, SpawnRequest* req) {
  if (!v.IsArray()) throw Napi::TypeError::New(env, "exec must be an array of numbers or null");
  Napi::Array arr = v.As<Napi::Array>();
  uint32_t n = arr.Length();
  if (n < kExecHeader) throw Napi::TypeError::New(env, "exec is too short");
  ChildExecAttrs& x = req->exec_attrs;
  memset(&x, 0, sizeof x);
  int64_t which = IntegerValue(env, arr.Get(0u), "exec flags", 0, kExecAll);
  x.umask = (which & kExecUmask) ? static_cast<int>(IntegerValue(env, arr.Get(1u), "umask", 0, 0777)) : -1;
  if (which & kExecOomScoreAdj) {
    int64_t adj = IntegerValue(env, arr.Get(2u), "oomScoreAdj", -1000, 1000);
    int len = snprintf(x.oom_score_adj, sizeof x.oom_score_adj, "%d", static_cast<int>(adj));
    x.oom_score_adj_len = static_cast<size_t>(len);
    x.set_oom_score_adj = true;
  }
  x.no_new_privs = (which & kExecNoNewPrivs) != 0;
  x.run_as = (which & kExecRunAs) != 0;
  int64_t group_count = IntegerValue(env, arr.Get(5u), "groups length", 0, kMaxGroups);
  if (x.run_as) {
    x.uid = static_cast<uid_t>(IntegerValue(env, arr.Get(3u), "uid", 0, kMaxId));
    x.gid = static_cast<gid_t>(IntegerValue(env, arr.Get(4u), "gid", 0, kMaxId));
  } else if (group_count != 0) {
    throw Napi::TypeError::New(env, "exec groups without runAs");
  }
  uint32_t at = kExecHeader + static_cast<uint32_t>(group_count);
  if (n < at || (n - at) % 3 != 0 || (n - at) / 3 > kMaxChildRlimits) {
    throw Napi::TypeError::New(env, "exec: groups and rlimit triples do not fit its length");
  }
  req->groups.reserve(static_cast<size_t>(group_count));
  for (uint32_t i = kExecHeader; i < at; i++) {
    req->groups.push_back(static_cast<gid_t>(IntegerValue(env, arr.Get(i), "group", 0, kMaxId)));
  }
  x.groups = req->groups.data();
  x.groups_count = req->groups.size();
  for (uint32_t i = at; i < n; i += 3) {
    ChildRlimit& r = x.rlimits[x.rlimit_count++];
    r.resource = static_cast<int>(IntegerValue(env, arr.Get(i), "rlimit resource", 0, RLIM_NLIMITS - 1));
    r.soft = RlimitValue(env, arr.Get(i + 1));
    r.hard = RlimitValue(env, arr.Get(i + 2));
  }
  req->child.exec_attrs = &x;
}

// Throws a TypeError or a RangeError (ERR_OUT_OF_RANGE) for a bad argument,
// before anything is opened or cloned.
void DecodeSpawnArgs(const Napi::CallbackInfo& info, SpawnRequest* req) {
  Napi::Env env = info.Env();
  if (info.Length() < 9 || !info[0].IsString()) {
    throw Napi::TypeError::New(env, "spawn(file, argv, envp, cwd, stdin, stdout, stderr, flags, cgroupProcs)");
  }
  // Paths are bytes as argv is: a string's escaped bytes (U+DC80..U+DCFF)
  // name the file they stand for, never the U+FFFD file Utf8Value would.
  req->file = EncodeBytes(info[0], "file");
  req->argv_bytes = StringList(env, info[1], "argv");
  // null envp: the child gets this process's environ, which Node keeps in
  // step with process.env (setenv/unsetenv), without copying it through
  // JavaScript on every spawn.
  bool inherit_env = info[2].IsNull() || info[2].IsUndefined();
  if (!inherit_env) req->envp_bytes = StringList(env, info[2], "envp");
  bool has_cwd = info[3].IsString();
  if (has_cwd) req->cwd = EncodeBytes(info[3], "cwd");
  req->argv = CPointers(req->argv_bytes);
  req->envp = CPointers(req->envp_bytes);

  ChildArgs& a = req->child;
  memset(&a, 0, sizeof a);
  a.file = req->file.c_str();
  a.argv = req->argv.data();
  a.envp = inherit_env ? environ : req->envp.data();
  a.cwd = has_cwd ? req->cwd.c_str() : nullptr;
  for (size_t i = 0; i < 3; i++) {
    // -1: /dev/null, the addon's own (see InitSpawn).
    a.stdio[i] = static_cast<int>(ArgInteger(info, 4 + i, "stdio fd", -1, INT32_MAX));
  }
  int64_t spawn_flags = ArgInteger(info, 7, "flags", 0, kSpawnFlagsAll);
  a.new_session = (spawn_flags & kSpawnNewSession) != 0;
  a.new_group = (spawn_flags & kSpawnNewGroup) != 0;
  a.cgroup_procs = static_cast<int>(ArgInteger(info, 8, "cgroupProcs", -1, INT32_MAX));
  req->copy_fd_table = (spawn_flags & kSpawnCopyFdTable) != 0;
  // exec attributes: absent or null for none (the common spawn pays one check).
  if (info.Length() > 9 && !info[9].IsNull() && !info[9].IsUndefined()) DecodeExecAttrs(env, info[9], req);
}

// Every signal blocked while it lives, so no handler of ours runs on the
// child's stack in our memory between clone and the child's own reset.
class AllSignalsBlocked {
 public:
  AllSignalsBlocked() {
    sigset_t all;
    sigfillset(&all);
    pthread_sigmask(SIG_SETMASK, &all, &old_);
  }
  ~AllSignalsBlocked() { pthread_sigmask(SIG_SETMASK, &old_, nullptr); }
  AllSignalsBlocked(const AllSignalsBlocked&) = delete;
  AllSignalsBlocked& operator=(const AllSignalsBlocked&) = delete;

 private:
  sigset_t old_;
};

// The fds the child's stdio comes from, put where the child's copy of the fd
// table holds them. Whatever Place() took is given back when this goes, on
// every path: this spawn's own /dev/null closed, the slots back on the
// addon's /dev/null (a slot still holding a pipe's write end would keep its
// reader from ever seeing end-of-file).
class StdioSources {
 public:
  explicit StdioSources(AddonData* data) : data_(data) {}
  ~StdioSources() {
    if (null_fd_ >= 0) close(null_fd_);
    for (int i = 0; i < 3; i++) {
      if (slot_used_[i]) dup3(data_->spawn_slot_null, data_->spawn_slots[i], O_CLOEXEC);
    }
  }
  StdioSources(const StdioSources&) = delete;
  StdioSources& operator=(const StdioSources&) = delete;

  // Rewrites a->stdio (and with slots a->keep_below). Returns 0, or an errno
  // with *call naming the call that failed.
  int Place(ChildArgs* a, bool use_slots, const char** call) {
    for (int i = 0; i < 3; i++) {
      if (a->stdio[i] != -1) continue;
      if (data_->spawn_slot_null < 0) {
        // No slots on this kernel: a /dev/null of this spawn's own.
        null_fd_ = null_fd_ >= 0 ? null_fd_ : open("/dev/null", O_RDWR | O_CLOEXEC);
        if (null_fd_ == -1) {
          *call = "open";
          return errno;
        }
        a->stdio[i] = null_fd_;
      } else {
        // The addon's /dev/null sits below the slots, so it is in the child's
        // copy of the table: no dup3 needed.
        a->stdio[i] = data_->spawn_slot_null;
      }
    }
    if (!use_slots) return 0;
    // Sources above the slots are dup3()'d onto them (dup3, not dup2: the
    // slot must stay close-on-exec, or another thread's child would inherit
    // it), so that everything the child needs sits below keep_below.
    // A source already below keep_below (the addon's /dev/null, an fd
    // opened before the slots) is in the child's copy as it is.
    unsigned int keep_below = 3;
    for (int slot : data_->spawn_slots) keep_below = std::max(keep_below, static_cast<unsigned int>(slot) + 1);
    for (int i = 0; i < 3; i++) {
      if (static_cast<unsigned int>(a->stdio[i]) < keep_below) continue;
      if (dup3(a->stdio[i], data_->spawn_slots[i], O_CLOEXEC) == -1) {
        *call = "dup3";
        return errno;
      }
      a->stdio[i] = data_->spawn_slots[i];
      slot_used_[i] = true;
    }
    a->keep_below = keep_below;
    return 0;
  }

 private:
  AddonData* data_;
  int null_fd_ = -1;
  // Slots that hold something other than /dev/null for this spawn.
  bool slot_used_[3] = {false, false, false};
};

// Starts the child and returns its pid, with *pidfd; or -1 with *err and
// *call. On return the child has exec'd or has exited after a failed step.
//
// The exec race: a parent that gets a pid back while its child still runs
// our code before execve could signal or wait for a process that is not yet
// the program (libuv closes that window with a close-on-exec pipe it reads
// until EOF). CLONE_VFORK closes it in the kernel: this thread resumes only
// once the child's execve has replaced its memory or the child has exited,
// so the pid is the program's from the first instant we see it, and a
// failed step is already written into *a (ReportChildFailure). CLONE_PIDFD
// closes the other window, between learning the pid and pinning it.
//
// The strategy: clone3 with CLONE_CLEAR_SIGHAND where it works, else clone();
// the same child either way. A refusal is remembered per addon instance, so
// a kernel without clone3 pays for one failed syscall.
pid_t SpawnAndInitChild(AddonData* data, ChildArgs* a, bool copy_fd_table, int* pidfd, int* err, const char** call) {
  // The child's stack lives in this frame: CLONE_VFORK keeps this thread
  // suspended, and so off this memory, until the child execs or exits.
  constexpr size_t kStackSize = 64 * 1024;
  alignas(64) char stack[kStackSize];

  AllSignalsBlocked blocked;
  StdioSources sources(data);
  bool use_slots = data->spawn_slot_null >= 0 && !copy_fd_table;
  if ((*err = sources.Place(a, use_slots, call)) != 0) return -1;
  int flags = kCloneFlags | (use_slots ? CLONE_FILES : 0);
  *call = "clone";
  pid_t pid = -1;
  *err = 0;
  if (!data->clone3_refused) pid = CloneWithClone3(data, flags, stack, kStackSize, a, pidfd, err);
  if (pid == -1 && *err == 0) pid = CloneWithClone(flags, stack + kStackSize, a, pidfd, err);
#if defined(__SANITIZE_ADDRESS__)
  // The child ran on this array and exec'd without returning: AddressSanitizer
  // still holds its frames' redzones as poisoned. Clear them, or later uses of
  // this stack memory look like overflows.
  ASAN_UNPOISON_MEMORY_REGION(stack, kStackSize);
#endif
  return pid;
}

// The parent's side of a failed step: the child has already exited (_exit
// after the step), so it is reaped, leaving no zombie, and the step's errno
// is thrown.
[[noreturn]] void ThrowChildFailure(const Napi::Env& env, int pidfd, const ChildArgs& a) {
  siginfo_t si;
  CUSTODY_RETRY_EINTR(waitid(kPidfdIdtype, pidfd, &si, WEXITED));
  close(pidfd);
  Napi::Error error = ErrnoError(env, a.err, a.failed_call);
  if (a.failed_path != nullptr) error.Set("path", Napi::String::New(env, a.failed_path));
  throw error;
}

// spawn(file, argv, envp | null, cwd | null, stdin, stdout, stderr, flags,
// cgroupProcs, exec | null) -> pid * SPAWN_PID_SCALE + pidfd. Positional, and one number
// back: named properties cost a string internalization each, per spawn. `file` is an
// absolute or relative path (PATH search is the caller's policy); the stdio
// fds become 0..2 (-1: the addon's /dev/null); flags are SPAWN_NEW_SESSION,
// SPAWN_NEW_GROUP and SPAWN_COPY_FD_TABLE; cgroupProcs is an fd on a
// cgroup's cgroup.procs, or -1; exec is the exec attributes' array (see
// kExecUmask) or null. Exec failure is thrown as the errno of the
// step that failed (execve ENOENT, chdir ENOENT...), after the child has
// been reaped.
Napi::Value Spawn(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  SpawnRequest req;
  DecodeSpawnArgs(info, &req);
  AddonData* data = GetData(env);
  int pidfd = -1;
  int err = 0;
  const char* call = nullptr;
  pid_t pid = SpawnAndInitChild(data, &req.child, req.copy_fd_table, &pidfd, &err, &call);
  if (pid == -1) ThrowErrno(env, err, call);
  if (req.child.failed_call != nullptr) ThrowChildFailure(env, pidfd, req.child);

  data->pidfds.insert(pidfd);
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
  constants.Set("EXEC_UMASK", Napi::Number::New(env, static_cast<double>(kExecUmask)));
  constants.Set("EXEC_OOM_SCORE_ADJ", Napi::Number::New(env, static_cast<double>(kExecOomScoreAdj)));
  constants.Set("EXEC_NO_NEW_PRIVS", Napi::Number::New(env, static_cast<double>(kExecNoNewPrivs)));
  constants.Set("EXEC_RUN_AS", Napi::Number::New(env, static_cast<double>(kExecRunAs)));
  // The RLIMIT_* numbers of this architecture (mips, sparc and alpha number some otherwise).
  constants.Set("RLIMIT_CPU", Napi::Number::New(env, RLIMIT_CPU));
  constants.Set("RLIMIT_FSIZE", Napi::Number::New(env, RLIMIT_FSIZE));
  constants.Set("RLIMIT_STACK", Napi::Number::New(env, RLIMIT_STACK));
  constants.Set("RLIMIT_CORE", Napi::Number::New(env, RLIMIT_CORE));
  constants.Set("RLIMIT_NPROC", Napi::Number::New(env, RLIMIT_NPROC));
  constants.Set("RLIMIT_NOFILE", Napi::Number::New(env, RLIMIT_NOFILE));
  constants.Set("RLIMIT_MEMLOCK", Napi::Number::New(env, RLIMIT_MEMLOCK));
  constants.Set("RLIMIT_AS", Napi::Number::New(env, RLIMIT_AS));
  exports.Set("probeCloneIntoCgroup", Napi::Function::New(env, ProbeCloneIntoCgroup, "probeCloneIntoCgroup"));
}

}  // namespace custody
