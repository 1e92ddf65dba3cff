// pidfd operations: open, signal, wait, exit info, pidfs id, and an exit
// watcher that polls a pidfd on the libuv loop.
#include "common.h"

#include <linux/types.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>

#include <cstring>

namespace custody {


// One uv_poll on a pidfd. A pidfd polls readable once the whole thread group
// has exited; the watcher fires once and stops itself. The pidfd stays owned
// by JavaScript, which must unwatch before it closes the fd.
struct ExitWatcher {
  uv_poll_t poll;
  uint32_t id = 0;
  AddonData* data = nullptr;
  Napi::FunctionReference callback;
  Napi::AsyncContext* context = nullptr;
  bool closing = false;
};

namespace {

void OnWatcherClosed(uv_handle_t* handle) {
  delete static_cast<ExitWatcher*>(handle->data);
}

void StopWatcher(ExitWatcher* w) {
  if (w->closing) return;
  w->closing = true;
  w->data->watchers.erase(w->id);
  // uv_poll_stop removes the fd from epoll now, so the caller may close the
  // pidfd right after; the handle itself is freed when uv_close completes.
  uv_poll_stop(&w->poll);
  w->callback.Reset();
  delete w->context;
  w->context = nullptr;
  uv_close(reinterpret_cast<uv_handle_t*>(&w->poll), OnWatcherClosed);
}

void OnPidfdReadable(uv_poll_t* handle, int status, int /*events*/) {
  auto* w = static_cast<ExitWatcher*>(handle->data);
  if (w->closing) return;
  Napi::Env env = w->callback.Env();
  Napi::HandleScope scope(env);
  Napi::Function fn = w->callback.Value();
  Napi::AsyncContext* context = w->context;
  w->context = nullptr;  // StopWatcher must not delete it while we use it
  StopWatcher(w);
  Napi::Value arg = status < 0 ? static_cast<Napi::Value>(Napi::String::New(env, uv_err_name(status)))
                               : env.Null();
  // MakeCallback, not Call: JavaScript's microtasks run after the callback,
  // as for any I/O callback.
  try {
    fn.MakeCallback(env.Global(), {arg}, *context);
  } catch (const Napi::Error& e) {
    delete context;
    // An exception thrown by the JS callback becomes an uncaught exception,
    // as it would for any other I/O callback.
    napi_fatal_exception(env, e.Value());
    return;
  }
  delete context;
}

Napi::Value PidfdOpen(const Napi::CallbackInfo& info) {
  int pid = ArgPid(info, 0);
  unsigned int flags = info.Length() > 1 ? static_cast<unsigned int>(ArgInt(info, 1, "flags")) : 0;
  // pidfd_open (Linux 5.3) returns a CLOEXEC fd for a thread-group leader.
  int fd = static_cast<int>(syscall(__NR_pidfd_open, pid, flags));
  if (fd == -1) ThrowErrno(info.Env(), errno, "pidfd_open");
  GetData(info.Env())->pidfds.insert(fd);
  return Napi::Number::New(info.Env(), fd);
}

// pidfd_send_signal (Linux 5.1): the signal reaches the process the pidfd was
// opened on or nobody (ESRCH); never a later owner of the same pid.
Napi::Value PidfdSendSignal(const Napi::CallbackInfo& info) {
  int fd = ArgFd(info, 0);
  int sig = static_cast<int>(ArgInteger(info, 1, "signal", 0, 64));
  if (syscall(__NR_pidfd_send_signal, fd, sig, nullptr, 0) == -1) {
    ThrowErrno(info.Env(), errno, "pidfd_send_signal");
  }
  return info.Env().Undefined();
}

// waitid(P_PIDFD, fd, ..., options) (Linux 5.4). Returns null when WNOHANG
// finds nothing to report, else { pid, code, status } where code is the
// siginfo si_code (CLD_EXITED, CLD_KILLED, CLD_DUMPED...) and status the exit
// code or signal number. Only meaningful for our own children (ECHILD else).
Napi::Value Waitid(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = ArgFd(info, 0);
  int options = ArgInt(info, 1, "options");
  siginfo_t si;
  memset(&si, 0, sizeof si);
  if (CUSTODY_RETRY_EINTR(waitid(kPidfdIdtype, fd, &si, options)) == -1) {
    ThrowErrno(env, errno, "waitid");
  }
  if (si.si_pid == 0) return env.Null();
  Napi::Object out = Napi::Object::New(env);
  out.Set("pid", si.si_pid);
  out.Set("code", si.si_code);
  out.Set("status", si.si_status);
  return out;
}

// ioctl(PIDFD_GET_INFO) asking for the exit status. Returns the raw wait
// status (as waitpid would give it) or null when the kernel has none yet: the
// kernel records it only once the process has been reaped by its parent.
Napi::Value PidfdGetExitInfo(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = ArgFd(info, 0);
  custody_pidfd_info pi;
  memset(&pi, 0, sizeof pi);
  pi.mask = CUSTODY_PIDFD_INFO_EXIT;
  if (ioctl(fd, CUSTODY_PIDFD_GET_INFO, &pi) == -1) ThrowErrno(env, errno, "ioctl");
  if (!(pi.mask & CUSTODY_PIDFD_INFO_EXIT)) return env.Null();
  return Napi::Number::New(env, pi.exit_code);
}

// The pidfs inode number of a pidfd (Linux 6.9): unique for the boot, never
// reused, the id systemd publishes as MAINPIDFDID. Before 6.9 pidfds were
// anonymous inodes that all share one inode number, so a pidfd not on pidfs
// yields null rather than a meaningless id. Returned as a decimal string:
// inode numbers are 64-bit.
Napi::Value PidfsId(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = ArgFd(info, 0);
  struct statfs sfs;
  if (fstatfs(fd, &sfs) == -1) ThrowErrno(env, errno, "fstatfs");
  if (static_cast<unsigned long>(sfs.f_type) != PIDFS_MAGIC) return env.Null();
  struct stat st;
  if (fstat(fd, &st) == -1) ThrowErrno(env, errno, "fstat");
  return Napi::String::New(env, std::to_string(static_cast<unsigned long long>(st.st_ino)));
}

// watch(fd, callback) -> id. callback(error: string | null) runs once on the
// loop when the pidfd becomes readable (the process exited).
Napi::Value Watch(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = ArgFd(info, 0);
  if (info.Length() < 2 || !info[1].IsFunction()) throw Napi::TypeError::New(env, "callback must be a function");
  AddonData* data = GetData(env);
  auto* w = new ExitWatcher();
  int rc = uv_poll_init(data->loop, &w->poll, fd);
  if (rc != 0) {
    delete w;
    ThrowErrno(env, -rc, "uv_poll_init");
  }
  w->poll.data = w;
  w->data = data;
  w->id = data->next_watcher_id++;
  if (data->next_watcher_id == 0) data->next_watcher_id = 1;
  rc = uv_poll_start(&w->poll, UV_READABLE, OnPidfdReadable);
  if (rc != 0) {
    w->closing = true;
    uv_close(reinterpret_cast<uv_handle_t*>(&w->poll), OnWatcherClosed);
    ThrowErrno(env, -rc, "uv_poll_start");
  }
  w->callback = Napi::Persistent(info[1].As<Napi::Function>());
  w->context = new Napi::AsyncContext(env, "custody:pidfd");
  data->watchers[w->id] = w;
  return Napi::Number::New(env, w->id);
}

ExitWatcher* FindWatcher(const Napi::CallbackInfo& info) {
  uint32_t id = static_cast<uint32_t>(ArgInteger(info, 0, "watcher", 0, UINT32_MAX));
  AddonData* data = GetData(info.Env());
  auto it = data->watchers.find(id);
  return it == data->watchers.end() ? nullptr : it->second;
}

// unwatch(id): stops a watcher that has not fired. Unknown ids are ignored
// so that a watcher that already fired can be unwatched without a race.
Napi::Value Unwatch(const Napi::CallbackInfo& info) {
  if (ExitWatcher* w = FindWatcher(info)) StopWatcher(w);
  return info.Env().Undefined();
}

// watchRef(id, ref): whether a pending watcher keeps the loop alive, as
// ChildProcess.ref()/unref() do.
Napi::Value WatchRef(const Napi::CallbackInfo& info) {
  if (ExitWatcher* w = FindWatcher(info)) {
    auto* handle = reinterpret_cast<uv_handle_t*>(&w->poll);
    if (info.Length() > 1 && info[1].ToBoolean().Value()) {
      uv_ref(handle);
    } else {
      uv_unref(handle);
    }
  }
  return info.Env().Undefined();
}

}  // namespace

void CleanupWatchers(AddonData* data) {
  // Copy: StopWatcher erases from the map.
  std::vector<ExitWatcher*> all;
  for (auto& entry : data->watchers) all.push_back(entry.second);
  for (ExitWatcher* w : all) StopWatcher(w);
}

void InitPidfd(Napi::Env env, Napi::Object exports) {
  exports.Set("pidfdOpen", Napi::Function::New(env, PidfdOpen, "pidfdOpen"));
  exports.Set("pidfdSendSignal", Napi::Function::New(env, PidfdSendSignal, "pidfdSendSignal"));
  exports.Set("waitid", Napi::Function::New(env, Waitid, "waitid"));
  exports.Set("pidfdGetExitInfo", Napi::Function::New(env, PidfdGetExitInfo, "pidfdGetExitInfo"));
  exports.Set("pidfsId", Napi::Function::New(env, PidfsId, "pidfsId"));
  exports.Set("watch", Napi::Function::New(env, Watch, "watch"));
  exports.Set("unwatch", Napi::Function::New(env, Unwatch, "unwatch"));
  exports.Set("watchRef", Napi::Function::New(env, WatchRef, "watchRef"));
}

}  // namespace custody
