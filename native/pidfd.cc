// pidfd operations: open, signal, wait, exit info, pidfs id, and an exit
// watcher that polls a pidfd on the libuv loop.
#include "common.h"

#include <linux/types.h>
#include <signal.h>
#include <sys/epoll.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <sys/wait.h>

#include <cstring>
#include <vector>

namespace custody {


// Exit watchers share one epoll set, and libuv polls only that set: a pidfd
// polls readable once the whole thread group has exited. One uv_poll per
// pidfd cost six epoll_ctl calls and an ioctl per spawn (libuv's fd check,
// its ADD/DEL pairs, FIONBIO); here a watch is one EPOLL_CTL_ADD with
// EPOLLONESHOT, so the kernel disarms the entry as it reports it, and the
// entry leaves the set by itself when JavaScript closes the pidfd (epoll drops
// a file's entries when its last reference goes). Children that exit together
// are reported by one epoll_wait, and to JavaScript by one call: the batch is
// written into an Int32Array as [id, code, status] triples and the
// environment's one dispatcher is called with their count. No function or
// persistent reference per watcher: a spawn costs no global handle.
// The pidfd stays owned by JavaScript, which must unwatch before it closes
// the fd; the addon never closes a watched fd.
struct ExitWatcher {
  uint32_t id = 0;
  int fd = -1;
  bool refed = true;
  // Reap on exit: waitid(P_PIDFD, WEXITED | WNOHANG) as the exit is
  // reported, for our own children and adopted ones (re-parented to us), so
  // the status travels with the event instead of costing another call.
  bool reap = false;
};

// Exits per epoll_wait, and so per dispatcher call.
constexpr int kExitBatch = 64;
// Int32 slots per reported exit: id, code, status.
constexpr int kExitEventSlots = 3;

struct WatchSet {
  int epfd = -1;
  uv_poll_t poll;
  AddonData* owner = nullptr;
  napi_env env = nullptr;
  // One async context for every dispatcher call: the one call per epoll
  // batch runs inside one callback scope, and JavaScript's microtasks (the
  // promise reactions it triggers) run once, after the batch, as after
  // any I/O callback. A context per watcher cost an async resource per spawn.
  Napi::AsyncContext* context = nullptr;
  // Pending watchers that keep the loop alive: the one uv_poll is ref'd
  // exactly while this is non-zero, as a ChildProcess handle would be.
  size_t refs = 0;
  // watchDispatch(): the function told of each batch, and the array the
  // batch is written into (kExitBatch * kExitEventSlots int32s).
  Napi::FunctionReference dispatch;
  Napi::Reference<Napi::Int32Array> events;
};

namespace {

void OnWatchSetClosed(uv_handle_t* handle) {
  delete static_cast<WatchSet*>(handle->data);
}

void AddRef(AddonData* data, ExitWatcher* w, bool refed) {
  if (w->refed == refed) return;
  w->refed = refed;
  WatchSet* set = data->watch_set;
  auto* handle = reinterpret_cast<uv_handle_t*>(&set->poll);
  if (refed && set->refs++ == 0) uv_ref(handle);
  if (!refed && --set->refs == 0) uv_unref(handle);
}

// Forgets a watcher. `disarm`: its pidfd is still armed in the set (it has
// not fired), so take it out now; the caller may close the fd right after.
void DropWatcher(AddonData* data, ExitWatcher* w, bool disarm) {
  if (disarm) epoll_ctl(data->watch_set->epfd, EPOLL_CTL_DEL, w->fd, nullptr);  // ENOENT/EBADF: gone already
  AddRef(data, w, false);
  data->watchers.erase(w->id);
  delete w;
}

// The code and status an exit is reported with. A reaping watcher's child
// is reaped here: code is the siginfo si_code (CLD_EXITED, CLD_KILLED,
// CLD_DUMPED) and status the exit code or signal; 0 when WNOHANG found
// nothing to report; -errno when waitid failed (ECHILD: not our child, or
// someone else reaped it). A watcher that does not reap reports 0.
void ReportExit(const ExitWatcher* w, int32_t* slot) {
  slot[0] = static_cast<int32_t>(w->id);
  slot[1] = 0;
  slot[2] = 0;
  if (!w->reap) return;
  siginfo_t si;
  memset(&si, 0, sizeof si);
  if (CUSTODY_RETRY_EINTR(waitid(kPidfdIdtype, w->fd, &si, WEXITED | WNOHANG)) == -1) {
    slot[1] = -errno;
  } else if (si.si_pid != 0) {
    slot[1] = si.si_code;
    slot[2] = si.si_status;
  }
}

void OnWatchSetReadable(uv_poll_t* handle, int status, int /*events*/) {
  WatchSet* set = static_cast<WatchSet*>(handle->data);
  AddonData* data = set->owner;
  // Level-triggered: the set polls readable again while more are pending.
  struct epoll_event ready[kExitBatch];
  int n = status < 0 ? 0 : epoll_wait(set->epfd, ready, kExitBatch, 0);
  if (n <= 0) return;  // EINTR or nothing: the next turn sees it
  Napi::Env env(set->env);
  Napi::HandleScope handles(env);
  // A watch exists only once watchDispatch() set both, and they stay set.
  Napi::Int32Array events = set->events.Value();
  // Only our own code holds the array. Should it be detached or shrunk, the
  // exits just taken (EPOLLONESHOT disarmed their fds) are said to be lost,
  // loudly, and their watchers dropped, so none keeps the loop alive forever.
  bool usable = events.ElementLength() >= static_cast<size_t>(kExitBatch * kExitEventSlots);
  int32_t* out = usable ? events.Data() : nullptr;
  int count = 0;
  for (int i = 0; i < n; i++) {
    auto it = data->watchers.find(static_cast<uint32_t>(ready[i].data.u64));
    if (it == data->watchers.end()) continue;  // unwatched since it was armed
    if (usable) ReportExit(it->second, out + count * kExitEventSlots);
    DropWatcher(data, it->second, false);
    count++;
  }
  if (count == 0) return;
  Napi::CallbackScope scope(env, *set->context);
  if (!usable) {
    std::string message = std::to_string(count) + " exit(s) not reported: the exit event array is detached";
    napi_fatal_exception(env, Napi::Error::New(env, message).Value());
    return;
  }
  try {
    set->dispatch.Call(env.Global(), {Napi::Number::New(env, count)});
  } catch (const Napi::Error& e) {
    // An exception thrown by the dispatcher becomes an uncaught exception,
    // as it would for any other I/O callback.
    napi_fatal_exception(env, e.Value());
  }
}

// The set: made when the addon loads (so its one fd sits with the addon's
// other fds, below every pidfd), or on first use if that failed.
WatchSet* EnsureWatchSet(const Napi::Env& env, AddonData* data) {
  if (data->watch_set != nullptr) return data->watch_set;
  int epfd = epoll_create1(EPOLL_CLOEXEC);
  if (epfd == -1) ThrowErrno(env, errno, "epoll_create1");
  auto* set = new WatchSet();
  set->epfd = epfd;
  set->owner = data;
  set->env = env;
  int rc = uv_poll_init(data->loop, &set->poll, epfd);
  if (rc != 0) {
    close(epfd);
    delete set;
    ThrowErrno(env, -rc, "uv_poll_init");
  }
  set->poll.data = set;
  rc = uv_poll_start(&set->poll, UV_READABLE, OnWatchSetReadable);
  if (rc != 0) {
    close(epfd);
    uv_close(reinterpret_cast<uv_handle_t*>(&set->poll), OnWatchSetClosed);
    ThrowErrno(env, -rc, "uv_poll_start");
  }
  set->context = new Napi::AsyncContext(env, "custody:pidfd");
  // Idle until a ref'd watcher is pending.
  uv_unref(reinterpret_cast<uv_handle_t*>(&set->poll));
  data->watch_set = set;
  return set;
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

// watchDispatch(dispatch) -> Int32Array. Sets the environment's one exit
// dispatcher: after each epoll batch, dispatch(count) runs once, with count
// [id, code, status] triples written at the start of the returned array
// (see ReportExit). Once per environment: a second dispatcher would not know
// the ids the first one's watches report with.
Napi::Value WatchDispatch(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsFunction()) throw Napi::TypeError::New(env, "dispatch must be a function");
  WatchSet* set = EnsureWatchSet(env, GetData(env));
  if (!set->dispatch.IsEmpty()) throw Napi::Error::New(env, "watchDispatch() was already called in this environment");
  Napi::Int32Array events = Napi::Int32Array::New(env, kExitBatch * kExitEventSlots);
  set->dispatch = Napi::Persistent(info[0].As<Napi::Function>());
  set->events = Napi::Persistent(events);
  return events;
}

// watch(fd, reap) -> id. The exit is reported once, to the dispatcher, when
// the pidfd becomes readable (the process exited); with `reap` the child is
// reaped as it is reported. One watcher per fd: a second watch of a pending
// fd is EEXIST.
Napi::Value Watch(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = ArgFd(info, 0);
  bool reap = info.Length() > 1 && info[1].ToBoolean().Value();
  AddonData* data = GetData(env);
  WatchSet* set = EnsureWatchSet(env, data);
  if (set->dispatch.IsEmpty()) throw Napi::Error::New(env, "watch() before watchDispatch()");
  uint32_t id = NextId(data);
  struct epoll_event ev;
  memset(&ev, 0, sizeof ev);
  ev.events = EPOLLIN | EPOLLONESHOT;
  ev.data.u64 = id;
  if (epoll_ctl(set->epfd, EPOLL_CTL_ADD, fd, &ev) == -1) {
    // EEXIST: this pidfd fired before and stays in the set disarmed (its
    // entry leaves only with its last close); re-arm it, unless a watcher is
    // still pending on it.
    int err = errno;
    if (err != EEXIST) ThrowErrno(env, err, "epoll_ctl");
    for (auto& entry : data->watchers) {
      if (entry.second->fd == fd) ThrowErrno(env, EEXIST, "epoll_ctl");
    }
    if (epoll_ctl(set->epfd, EPOLL_CTL_MOD, fd, &ev) == -1) ThrowErrno(env, errno, "epoll_ctl");
  }
  auto* w = new ExitWatcher();
  w->id = id;
  w->fd = fd;
  w->refed = false;
  w->reap = reap;
  data->watchers[id] = w;
  AddRef(data, w, true);
  return Napi::Number::New(env, id);
}

ExitWatcher* FindWatcher(const Napi::CallbackInfo& info) {
  uint32_t id = static_cast<uint32_t>(ArgInteger(info, 0, "watcher", 0, INT32_MAX));
  AddonData* data = GetData(info.Env());
  auto it = data->watchers.find(id);
  return it == data->watchers.end() ? nullptr : it->second;
}

// unwatch(id): stops a watcher that has not fired. Unknown ids are ignored
// so that a watcher that already fired can be unwatched without a race.
Napi::Value Unwatch(const Napi::CallbackInfo& info) {
  if (ExitWatcher* w = FindWatcher(info)) DropWatcher(GetData(info.Env()), w, true);
  return info.Env().Undefined();
}

// watchRef(id, ref): whether a pending watcher keeps the loop alive, as
// ChildProcess.ref()/unref() do.
Napi::Value WatchRef(const Napi::CallbackInfo& info) {
  if (ExitWatcher* w = FindWatcher(info)) AddRef(GetData(info.Env()), w, info.Length() > 1 && info[1].ToBoolean().Value());
  return info.Env().Undefined();
}

}  // namespace

void CleanupWatchers(AddonData* data) {
  // Copy: DropWatcher erases from the map.
  std::vector<ExitWatcher*> all;
  for (auto& entry : data->watchers) all.push_back(entry.second);
  for (ExitWatcher* w : all) DropWatcher(data, w, true);
  if (WatchSet* set = data->watch_set) {
    data->watch_set = nullptr;
    uv_poll_stop(&set->poll);
    close(set->epfd);
    delete set->context;
    set->context = nullptr;
    set->dispatch.Reset();
    set->events.Reset();
    uv_close(reinterpret_cast<uv_handle_t*>(&set->poll), OnWatchSetClosed);
  }
}

void InitPidfd(Napi::Env env, Napi::Object exports) {
  try {
    EnsureWatchSet(env, GetData(env));
  } catch (const Napi::Error&) {
    // EMFILE or the like at load: watch() tries again, and reports it.
  }
  exports.Set("pidfdOpen", Napi::Function::New(env, PidfdOpen, "pidfdOpen"));
  exports.Set("pidfdSendSignal", Napi::Function::New(env, PidfdSendSignal, "pidfdSendSignal"));
  exports.Set("waitid", Napi::Function::New(env, Waitid, "waitid"));
  exports.Set("pidfdGetExitInfo", Napi::Function::New(env, PidfdGetExitInfo, "pidfdGetExitInfo"));
  exports.Set("pidfsId", Napi::Function::New(env, PidfsId, "pidfsId"));
  exports.Set("watchDispatch", Napi::Function::New(env, WatchDispatch, "watchDispatch"));
  exports.Set("watch", Napi::Function::New(env, Watch, "watch"));
  exports.Set("unwatch", Napi::Function::New(env, Unwatch, "unwatch"));
  exports.Set("watchRef", Napi::Function::New(env, WatchRef, "watchRef"));
}

}  // namespace custody
