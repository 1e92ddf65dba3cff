// Module registration, errno errors, per-environment state and cleanup, the
// kernel probe, flock and close.
#include "common.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/utsname.h>
#include <sys/wait.h>

#include <cstring>

namespace custody {

AddonData* GetData(const Napi::Env& env) { return env.GetInstanceData<AddonData>(); }

namespace {

// The symbolic name of an errno libuv has no name for: libuv names only the
// errors it can return itself, and says "Unknown system error -10" for
// ECHILD, which waitid returns. Node's own errno exceptions name every errno;
// these are the Linux ones libuv lacks that a syscall of ours can return.
const char* ErrnoNameBeyondLibuv(int err) {
  switch (err) {
#define CUSTODY_ERRNO_NAME(e) \
  case e:                     \
    return #e;
    CUSTODY_ERRNO_NAME(ECHILD)      // waitid: not our child, or already reaped
    CUSTODY_ERRNO_NAME(ENOLCK)      // flock: the kernel's lock table is full
    CUSTODY_ERRNO_NAME(EDEADLK)     // flock emulated with fcntl locks (NFS)
    CUSTODY_ERRNO_NAME(ELIBBAD)     // execve: a corrupt ELF interpreter
    CUSTODY_ERRNO_NAME(EUSERS)      // clone: user namespace limits
    CUSTODY_ERRNO_NAME(EDQUOT)      // writes to a state dir over its quota
    CUSTODY_ERRNO_NAME(ESTALE)      // a state dir on NFS
    CUSTODY_ERRNO_NAME(ENOEXEC)     // execve: not a format the kernel runs (libuv names it since 1.47)
#undef CUSTODY_ERRNO_NAME
    default:
      return nullptr;
  }
}

}  // namespace

std::string ErrnoName(int err) {
  if (const char* name = ErrnoNameBeyondLibuv(err)) return name;
  // uv_err_name_r (libuv 1.22), not uv_err_name: it writes into our buffer
  // and allocates nothing for a code it does not know.
  char buf[64];
  return uv_err_name_r(-err, buf, sizeof buf);
}

Napi::Error ErrnoError(const Napi::Env& env, int err, const char* syscall) {
  const std::string code = ErrnoName(err);
  std::string message = std::string(syscall) + " " + code + " (" + strerror(err) + ")";
  Napi::Error error = Napi::Error::New(env, message);
  error.Set("code", Napi::String::New(env, code));
  error.Set("errno", Napi::Number::New(env, -err));
  error.Set("syscall", Napi::String::New(env, syscall));
  return error;
}

void ThrowErrno(const Napi::Env& env, int err, const char* syscall) {
  throw ErrnoError(env, err, syscall);
}

int64_t IntegerValue(const Napi::Env& env, const Napi::Value& value, const char* name, int64_t min, int64_t max) {
  // The TypeScript layer validates; this guard keeps a wrong call from
  // reaching the kernel with a different value than it asked for. A double
  // is never narrowed: Int32Value(2^32 + 5) is 5, which would pin pid 5.
  if (!value.IsNumber()) throw Napi::TypeError::New(env, std::string(name) + " must be a number");
  double v = value.As<Napi::Number>().DoubleValue();
  if (!(v >= static_cast<double>(min) && v <= static_cast<double>(max)) || v != static_cast<double>(static_cast<int64_t>(v))) {
    Napi::Error err = Napi::RangeError::New(
        env, std::string(name) + " must be an integer from " + std::to_string(min) + " to " + std::to_string(max));
    err.Set("code", Napi::String::New(env, "ERR_OUT_OF_RANGE"));
    throw err;
  }
  return static_cast<int64_t>(v);
}

int64_t ArgInteger(const Napi::CallbackInfo& info, size_t i, const char* name, int64_t min, int64_t max) {
  Napi::Env env = info.Env();
  if (info.Length() <= i) throw Napi::TypeError::New(env, std::string(name) + " must be a number");
  return IntegerValue(env, info[i], name, min, max);
}

int ArgInt(const Napi::CallbackInfo& info, size_t i, const char* name) {
  return static_cast<int>(ArgInteger(info, i, name, INT32_MIN, INT32_MAX));
}

// PID_MAX_LIMIT on 64-bit kernels is 2^22; no pid is larger in any namespace.
int ArgPid(const Napi::CallbackInfo& info, size_t i) {
  return static_cast<int>(ArgInteger(info, i, "pid", 1, 4194304));
}

int ArgFd(const Napi::CallbackInfo& info, size_t i) {
  return static_cast<int>(ArgInteger(info, i, "fd", 0, INT32_MAX));
}

uint32_t NextId(AddonData* data) {
  for (;;) {
    uint32_t id = data->next_watcher_id;
    data->next_watcher_id = id >= INT32_MAX ? 1 : id + 1;
    if (data->watchers.count(id) == 0 && data->notify_sockets.count(id) == 0) return id;
  }
}

namespace {

// close(2). Closing a pidfd we track also forgets it. EINTR is not retried:
// on Linux the fd is released even when close reports EINTR.
Napi::Value CloseFd(const Napi::CallbackInfo& info) {
  int fd = ArgFd(info, 0);
  AddonData* data = GetData(info.Env());
  data->pidfds.erase(fd);
  if (close(fd) == -1 && errno != EINTR) ThrowErrno(info.Env(), errno, "close");
  return info.Env().Undefined();
}

// flock(2) on an fd JavaScript opened (fs.openSync): the state dir's lock.
// LOCK_NB comes from the caller; EWOULDBLOCK says another holder has it.
Napi::Value Flock(const Napi::CallbackInfo& info) {
  int fd = ArgFd(info, 0);
  int op = ArgInt(info, 1, "operation");
  if (CUSTODY_RETRY_EINTR(flock(fd, op)) == -1) ThrowErrno(info.Env(), errno, "flock");
  return info.Env().Undefined();
}

// pipe2(O_CLOEXEC) -> [readFd, writeFd]: stdio pipes for spawn. Both ends
// are close-on-exec; spawn dup2()s the child's end onto 0..2.
Napi::Value Pipe(const Napi::CallbackInfo& info) {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) == -1) ThrowErrno(info.Env(), errno, "pipe2");
  Napi::Array out = Napi::Array::New(info.Env(), 2);
  out.Set(0u, fds[0]);
  out.Set(1u, fds[1]);
  return out;
}

// prctl(PR_SET_CHILD_SUBREAPER) (Linux 3.4): orphans of our descendants are
// re-parented to us instead of init, so a double-forking daemon stays visible.
Napi::Value SetChildSubreaper(const Napi::CallbackInfo& info) {
  int on = info.Length() > 0 && info[0].ToBoolean().Value() ? 1 : 0;
  if (prctl(PR_SET_CHILD_SUBREAPER, on, 0, 0, 0) == -1) ThrowErrno(info.Env(), errno, "prctl");
  return info.Env().Undefined();
}

Napi::Value GetChildSubreaper(const Napi::CallbackInfo& info) {
  int on = 0;
  if (prctl(PR_GET_CHILD_SUBREAPER, &on, 0, 0, 0) == -1) ThrowErrno(info.Env(), errno, "prctl");
  return Napi::Boolean::New(info.Env(), on != 0);
}

// Reports what this kernel offers, as errno names ("" when the call works),
// in the spirit of Go's checkPidfd. The TypeScript layer turns these facts
// into capabilities; nothing here decides what they mean.
Napi::Value Probe(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  Napi::Object out = Napi::Object::New(env);
  auto name = [](int err) { return err == 0 ? std::string() : ErrnoName(err); };

  struct utsname uts;
  if (uname(&uts) == 0) out.Set("release", std::string(uts.release));

  // pidfd_open(self) (Linux 5.3).
  int fd = static_cast<int>(syscall(__NR_pidfd_open, getpid(), 0));
  out.Set("pidfdOpen", name(fd == -1 ? errno : 0));
  if (fd >= 0) {
    // Signal 0 through the pidfd checks pidfd_send_signal (Linux 5.1).
    int rc = static_cast<int>(syscall(__NR_pidfd_send_signal, fd, 0, nullptr, 0));
    out.Set("pidfdSendSignal", name(rc == -1 ? errno : 0));
    // waitid(P_PIDFD) on ourselves must fail with ECHILD where it exists
    // (Linux 5.4); EINVAL means the idtype is unknown.
    siginfo_t si;
    memset(&si, 0, sizeof si);
    rc = waitid(kPidfdIdtype, fd, &si, WEXITED | WNOHANG);
    out.Set("waitidPidfd", name(rc == -1 && errno == ECHILD ? 0 : (rc == -1 ? errno : EINVAL)));
    close(fd);
  } else {
    out.Set("pidfdSendSignal", name(ENOSYS));
    out.Set("waitidPidfd", name(ENOSYS));
  }
  return out;
}

void Cleanup(void* arg) {
  auto* data = static_cast<AddonData*>(arg);
  CleanupWatchers(data);
  CleanupSpawn(data);
  CleanupNotify(data);
  for (int fd : data->pidfds) close(fd);
  data->pidfds.clear();
}

}  // namespace

Napi::Object InitAddon(Napi::Env env, Napi::Object exports) {
  auto* data = new AddonData();
  // The loop of this environment, never uv_default_loop(): workers have their own.
  if (napi_get_uv_event_loop(env, &data->loop) != napi_ok) {
    delete data;
    throw Napi::Error::New(env, "napi_get_uv_event_loop failed");
  }
  env.SetInstanceData<AddonData>(data);  // deleted by N-API after cleanup hooks
  napi_add_env_cleanup_hook(env, Cleanup, data);

  exports.Set("close", Napi::Function::New(env, CloseFd, "close"));
  exports.Set("flock", Napi::Function::New(env, Flock, "flock"));
  exports.Set("pipe", Napi::Function::New(env, Pipe, "pipe"));
  exports.Set("setChildSubreaper", Napi::Function::New(env, SetChildSubreaper, "setChildSubreaper"));
  exports.Set("getChildSubreaper", Napi::Function::New(env, GetChildSubreaper, "getChildSubreaper"));
  exports.Set("probe", Napi::Function::New(env, Probe, "probe"));

  Napi::Object constants = Napi::Object::New(env);
  constants.Set("LOCK_EX", LOCK_EX);
  constants.Set("LOCK_NB", LOCK_NB);
  constants.Set("WEXITED", WEXITED);
  constants.Set("WNOHANG", WNOHANG);
  constants.Set("WNOWAIT", WNOWAIT);
  exports.Set("constants", constants);

  InitPidfd(env, exports);
  InitProcfs(env, exports);
  InitIdentity(env, exports);
  InitScan(env, exports);
  InitStateDir(env, exports);
  InitBytes(env, exports);
  InitSpawn(env, exports);
  InitNotify(env, exports);
  return exports;
}

}  // namespace custody

static Napi::Object Init(Napi::Env env, Napi::Object exports) { return custody::InitAddon(env, exports); }

NODE_API_MODULE(custody, Init)
