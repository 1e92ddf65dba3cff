// Shared plumbing for the custody addon: errno errors shaped like Node's,
// per-environment state, and the kernel constants older libc headers lack.
//
// The addon is a thin syscall layer. It decides nothing: every function does
// one kernel operation (or one fixed race-free sequence of them) and returns
// plain values or throws an Error with `code`, `errno` and `syscall`.
#pragma once

#include <napi.h>
#include <uv.h>

#include <cerrno>
#include <cstdint>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include <linux/types.h>
#include <sys/ioctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

// Syscall numbers are stable per architecture; define them when the build
// machine's headers predate the call so a prebuild still carries them.
#ifndef __NR_pidfd_open
#define __NR_pidfd_open 434  // Linux 5.3
#endif
#ifndef __NR_pidfd_send_signal
#define __NR_pidfd_send_signal 424  // Linux 5.1
#endif
#ifndef __NR_close_range
#define __NR_close_range 436  // Linux 5.9
#endif
#ifndef CLONE_PIDFD
#define CLONE_PIDFD 0x00001000  // Linux 5.2
#endif
#ifndef CLOSE_RANGE_UNSHARE
#define CLOSE_RANGE_UNSHARE (1U << 1)
#endif
#ifndef PIDFS_MAGIC
#define PIDFS_MAGIC 0x50494446  // pidfds live on pidfs since Linux 6.9
#endif

// PIDFD_GET_INFO (Linux 6.13; PIDFD_INFO_EXIT since 6.15). Defined here
// because build machines' headers are older. The ioctl is extensible: the
// kernel copies at most the size we pass, so this 64-byte first version works
// on every kernel that has the ioctl.
struct custody_pidfd_info {
  __u64 mask;
  __u64 cgroupid;
  __u32 pid;
  __u32 tgid;
  __u32 ppid;
  __u32 ruid;
  __u32 rgid;
  __u32 euid;
  __u32 egid;
  __u32 suid;
  __u32 sgid;
  __u32 fsuid;
  __u32 fsgid;
  __s32 exit_code;
};
#define CUSTODY_PIDFD_GET_INFO _IOWR(0xFF, 11, struct custody_pidfd_info)
#define CUSTODY_PIDFD_INFO_PID (1ULL << 0)
#define CUSTODY_PIDFD_INFO_CREDS (1ULL << 1)
#define CUSTODY_PIDFD_INFO_EXIT (1ULL << 3)

namespace custody {

// waitid's P_PIDFD idtype (Linux 5.4); glibc only names it since 2.36.
constexpr idtype_t kPidfdIdtype = static_cast<idtype_t>(3);

// Retries a syscall-like expression while it fails with EINTR (libuv does the
// same around waitpid): a signal arriving mid-call is not a failure.
#define CUSTODY_RETRY_EINTR(expr)              \
  ({                                           \
    long custody_rc_;                          \
    do {                                       \
      custody_rc_ = static_cast<long>(expr);   \
    } while (custody_rc_ == -1 && errno == EINTR); \
    custody_rc_;                               \
  })

struct ExitWatcher;
struct WatchSet;
struct NotifySocket;

// Everything the addon owns for one Node environment (main thread or a
// worker). No statics: two copies of the addon, or two workers, never share
// fds or handles.
struct AddonData {
  uv_loop_t* loop = nullptr;
  // Every pidfd handed to JavaScript, so the env cleanup hook can close the
  // ones JavaScript forgot.
  std::unordered_set<int> pidfds;
  std::unordered_map<uint32_t, ExitWatcher*> watchers;
  uint32_t next_watcher_id = 1;
  // The one epoll set every exit watcher sits in (pidfd.cc), made on first use.
  WatchSet* watch_set = nullptr;
  // sd_notify sockets (notify.cc), by the same id sequence as watchers.
  std::unordered_map<uint32_t, NotifySocket*> notify_sockets;
  // spawn's reserved stdio slots: fds on /dev/null opened when the addon
  // loads, so they sit below the pidfds that come later. See spawn.cc.
  int spawn_slots[3] = {-1, -1, -1};
  int spawn_slot_null = -1;
  // clone3 with CLONE_CLEAR_SIGHAND answered ENOSYS, EPERM or EINVAL (an
  // older kernel, a seccomp filter, valgrind): spawn uses clone() from then on.
  bool clone3_refused = false;
};

AddonData* GetData(const Napi::Env& env);

// The next id for an exit watcher or a notify socket: in 1..INT32_MAX (exit
// events carry it in an Int32Array) and held by neither kind right now.
uint32_t NextId(AddonData* data);

// The symbolic name Node uses for errno `err` ("ESRCH"), also for the ones
// libuv has no name for (ECHILD...); "Unknown system error N" for the rest.
// Every errno name the addon reports comes from here: libuv's uv_err_name
// leaks a string for each unknown code it is asked about.
std::string ErrnoName(int err);

// Builds an Error like Node's ErrnoException: message "syscall CODE (text)",
// `code` the symbolic name, `errno` negative as in Node, `syscall`.
Napi::Error ErrnoError(const Napi::Env& env, int err, const char* syscall);
[[noreturn]] void ThrowErrno(const Napi::Env& env, int err, const char* syscall);

// Integer arguments, range-checked (RangeError with code ERR_OUT_OF_RANGE).
int64_t IntegerValue(const Napi::Env& env, const Napi::Value& value, const char* name, int64_t min, int64_t max);
int64_t ArgInteger(const Napi::CallbackInfo& info, size_t i, const char* name, int64_t min, int64_t max);
int ArgInt(const Napi::CallbackInfo& info, size_t i, const char* name);
int ArgPid(const Napi::CallbackInfo& info, size_t i);
int ArgFd(const Napi::CallbackInfo& info, size_t i);

// argv is bytes. A string crossing from the kernel to JavaScript decodes
// valid UTF-8 as such and every byte of an invalid sequence as the lone
// surrogate U+DC00 + byte (Python's surrogateescape), so no two byte strings
// map to one JavaScript string; EncodeBytes is the exact inverse.
Napi::String DecodeBytes(const Napi::Env& env, const char* data, size_t len);
std::string EncodeBytes(const Napi::Value& v, const char* name);

void InitPidfd(Napi::Env env, Napi::Object exports);
void InitProcfs(Napi::Env env, Napi::Object exports);
void InitIdentity(Napi::Env env, Napi::Object exports);
void InitScan(Napi::Env env, Napi::Object exports);
void InitStateDir(Napi::Env env, Napi::Object exports);
void InitBytes(Napi::Env env, Napi::Object exports);
void InitSpawn(Napi::Env env, Napi::Object exports);
void InitNotify(Napi::Env env, Napi::Object exports);
void CleanupWatchers(AddonData* data);
void CleanupSpawn(AddonData* data);
void CleanupNotify(AddonData* data);

}  // namespace custody
