// The receiving end of systemd's sd_notify protocol: a unix datagram socket
// bound to an abstract name, read on the libuv loop, each datagram handed to
// JavaScript with the sender's credentials. What a message means, and
// whether its sender may say it, is decided in TypeScript (src/lifecycle/notify.ts).
#include "common.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cstring>
#include <memory>
#include <vector>

// SO_PASSPIDFD / SCM_PIDFD (Linux 6.5): the kernel attaches a pidfd on the
// sender to every datagram, so the sender can be pinned although it may
// have exited, and its pid been reused, since it sent. Older headers lack them.
#ifndef SO_PASSPIDFD
#define SO_PASSPIDFD 76
#endif
#ifndef SCM_PIDFD
#define SCM_PIDFD 0x04
#endif

namespace custody {

// One bound socket and its uv_poll. Owns the socket fd: closed when the
// watcher stops (notifyClose, or the environment's cleanup).
struct NotifySocket {
  uv_poll_t poll;
  uint32_t id = 0;
  int fd = -1;
  AddonData* data = nullptr;
  Napi::FunctionReference callback;
  Napi::AsyncContext* context = nullptr;
  bool closing = false;
  // Set while the JavaScript callback runs: a close from inside it must not
  // free the async context the callback is running in.
  bool in_callback = false;
};

namespace {

// systemd reads at most this much of a notification (NOTIFY_BUFFER_MAX is
// PIPE_BUF); a longer datagram is reported as truncated, never parsed in part.
constexpr size_t kMaxMessage = 4096;
// Datagrams read per wake-up, so a flood cannot hold the loop; the rest wait
// in the socket's queue for the next turn.
constexpr int kBatch = 64;
// SCM_RIGHTS fds taken with one datagram. custody keeps none (it implements
// no FDSTORE); the one fd a notification it reads may carry is
// sd_notify_barrier(3)'s. Room for SCM_MAX_FD (253) would let any sender make
// this process hold 253 fds per datagram read. The control buffer has room
// for this many: recvmsg installs no more, the kernel closes the rest itself
// (scm_detach_fds) and sets MSG_CTRUNC, which JavaScript is told of.
constexpr size_t kFdAllowance = 4;

void OnNotifyClosed(uv_handle_t* handle) { delete static_cast<NotifySocket*>(handle->data); }

void StopNotify(NotifySocket* s) {
  if (s->closing) return;
  s->closing = true;
  s->data->notify_sockets.erase(s->id);
  // uv_poll_stop takes the fd out of epoll at once, so it can be closed now:
  // the name is free the moment close returns, not a loop turn later.
  uv_poll_stop(&s->poll);
  close(s->fd);
  s->fd = -1;
  s->callback.Reset();
  if (!s->in_callback) {
    delete s->context;
    s->context = nullptr;
  }
  uv_close(reinterpret_cast<uv_handle_t*>(&s->poll), OnNotifyClosed);
}

// Fds that came with one datagram's SCM_RIGHTS. None is kept, but they are
// closed only once JavaScript has handled that datagram: sd_notify_barrier(3)
// (BARRIER=1, as systemd-notify sends after its message) waits for that close
// to know the messages before it were processed, and only then lets its
// sender exit. Owns at most kFdAllowance fds, one datagram's.
struct Rights {
  int fds[kFdAllowance];
  size_t count = 0;
  Rights() = default;
  Rights(const Rights&) = delete;
  Rights& operator=(const Rights&) = delete;
  ~Rights() {
    for (size_t i = 0; i < count; i++) close(fds[i]);
  }
};

struct Datagram {
  char data[kMaxMessage];
  size_t size = 0;
  // MSG_TRUNC: longer than kMaxMessage; its bytes are not handed on.
  bool truncated = false;
  // MSG_CTRUNC: more control data than the buffer holds (in practice more
  // fds than kFdAllowance); the kernel closed the fds that did not fit.
  bool control_truncated = false;
  long long pid = 0;
  long long uid = -1;
  bool has_pidfd = false;
  // The SCM_PIDFD value: a pidfd on the sender, or the kernel's negative
  // errno when it could not make one (the sender is gone, or this process is
  // out of fds). Only meaningful with has_pidfd.
  int pidfd = -1;
  Rights rights;
};

// Walks the control messages: keeps the credentials and the sender's pidfd,
// and the SCM_RIGHTS fds, for closing. Every length is the kernel's, but is
// checked against what was asked for before a byte of it is read.
void TakeControl(struct msghdr* msg, Datagram* d) {
  for (struct cmsghdr* c = CMSG_FIRSTHDR(msg); c != nullptr; c = CMSG_NXTHDR(msg, c)) {
    if (c->cmsg_level != SOL_SOCKET || c->cmsg_len < CMSG_LEN(0)) continue;
    size_t len = c->cmsg_len - CMSG_LEN(0);
    if (c->cmsg_type == SCM_CREDENTIALS && len >= sizeof(struct ucred)) {
      struct ucred cred;
      memcpy(&cred, CMSG_DATA(c), sizeof cred);
      d->pid = cred.pid;
      d->uid = cred.uid;
    } else if (c->cmsg_type == SCM_PIDFD && len >= sizeof(int)) {
      int fd;
      memcpy(&fd, CMSG_DATA(c), sizeof fd);
      if (d->has_pidfd) {
        if (fd >= 0) close(fd);  // a second one: never sent by the kernel, never kept
      } else {
        d->has_pidfd = true;
        d->pidfd = fd;
      }
    } else if (c->cmsg_type == SCM_RIGHTS) {
      size_t n = len / sizeof(int);
      for (size_t i = 0; i < n; i++) {
        int fd;
        memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        if (fd < 0) continue;
        // The buffer holds kFdAllowance: more cannot arrive, but an fd
        // that has nowhere to go is closed, never dropped open.
        if (d->rights.count < kFdAllowance) {
          d->rights.fds[d->rights.count++] = fd;
        } else {
          close(fd);
        }
      }
    }
  }
}

// Reads one datagram without blocking. Returns 0, EAGAIN when the queue is
// empty, or the errno of a failed recvmsg.
int ReceiveOne(int fd, Datagram* d) {
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(sizeof(int)) +
                                       CMSG_SPACE(sizeof(int) * kFdAllowance)];
  struct iovec iov = {d->data, sizeof d->data};
  struct msghdr msg;
  memset(&msg, 0, sizeof msg);
  msg.msg_iov = &iov;
  msg.msg_iovlen = 1;
  msg.msg_control = control;
  msg.msg_controllen = sizeof control;
  // MSG_TRUNC: the datagram's real length, to tell a truncated one apart.
  // MSG_CMSG_CLOEXEC: fds that arrive never leak into a child we spawn.
  ssize_t n = CUSTODY_RETRY_EINTR(recvmsg(fd, &msg, MSG_DONTWAIT | MSG_TRUNC | MSG_CMSG_CLOEXEC));
  if (n == -1) return errno == EWOULDBLOCK ? EAGAIN : errno;
  // The control data is walked even when truncated: what did arrive (the
  // pidfd, the fds that fit) is this process's to close.
  TakeControl(&msg, d);
  d->truncated = static_cast<size_t>(n) > sizeof d->data || (msg.msg_flags & MSG_TRUNC) != 0;
  d->control_truncated = (msg.msg_flags & MSG_CTRUNC) != 0;
  d->size = d->truncated ? 0 : static_cast<size_t>(n);
  return 0;
}

// callback(error, datagram): datagram is null with an error, else
//   [data: Buffer, truncated: boolean, controlTruncated: boolean, fds, pid, uid, pidfd]
// fds counts the SCM_RIGHTS fds that arrived (closed here once the callback
// returns); pidfd is null without SO_PASSPIDFD, else the kernel's value: a
// pidfd >= 0 is JavaScript's to close (tracked for the env cleanup), a
// negative one is -errno. Returns false once the socket is closed.
bool Deliver(NotifySocket* s, int err, Datagram* d) {
  Napi::Env env = s->callback.Env();
  Napi::HandleScope scope(env);
  Napi::Value error = env.Null();
  Napi::Value value = env.Null();
  if (err != 0) {
    error = ErrnoError(env, err, "recvmsg").Value();
  } else {
    Napi::Array a = Napi::Array::New(env, 7);
    a.Set(0u, Napi::Buffer<char>::Copy(env, d->data, d->size));
    a.Set(1u, Napi::Boolean::New(env, d->truncated));
    a.Set(2u, Napi::Boolean::New(env, d->control_truncated));
    a.Set(3u, Napi::Number::New(env, static_cast<double>(d->rights.count)));
    a.Set(4u, Napi::Number::New(env, static_cast<double>(d->pid)));
    a.Set(5u, Napi::Number::New(env, static_cast<double>(d->uid)));
    a.Set(6u, d->has_pidfd ? static_cast<Napi::Value>(Napi::Number::New(env, d->pidfd)) : env.Null());
    if (d->has_pidfd && d->pidfd >= 0) s->data->pidfds.insert(d->pidfd);
    value = a;
  }
  Napi::Function fn = s->callback.Value();
  s->in_callback = true;
  try {
    fn.MakeCallback(env.Global(), {error, value}, *s->context);
  } catch (const Napi::Error& e) {
    napi_fatal_exception(env, e.Value());
  }
  s->in_callback = false;
  // Closed from inside the callback: the handle is freed by uv_close's
  // callback on a later turn, so s is still valid here; the context goes now.
  if (s->closing) {
    delete s->context;
    s->context = nullptr;
    return false;
  }
  return true;
}

// One datagram at a time, each handed to JavaScript before the next is read,
// and its fds closed the moment it is handled: at most kFdAllowance of them
// are open here at once, however many a flood carries.
void OnNotifyReadable(uv_poll_t* handle, int status, int /*events*/) {
  auto* s = static_cast<NotifySocket*>(handle->data);
  if (s->closing) return;
  if (status < 0) {
    Deliver(s, -status, nullptr);
    return;
  }
  // On the heap: kMaxMessage bytes is more than a loop callback's stack should carry.
  auto d = std::make_unique<Datagram>();
  for (int i = 0; i < kBatch; i++) {
    int err = ReceiveOne(s->fd, d.get());
    if (err == EAGAIN) return;
    bool open = Deliver(s, err, d.get());
    if (err != 0 || !open) return;
    d = std::make_unique<Datagram>();  // closes the fds of the one just handled
  }
}

// The abstract name: sun_path[0] is NUL, the name follows, unterminated;
// the address length counts exactly its bytes. At most 107 of them.
socklen_t AbstractAddress(const std::string& name, struct sockaddr_un* addr) {
  memset(addr, 0, sizeof *addr);
  addr->sun_family = AF_UNIX;
  memcpy(addr->sun_path + 1, name.data(), name.size());
  return static_cast<socklen_t>(offsetof(struct sockaddr_un, sun_path) + 1 + name.size());
}

// notifyOpen(name, callback) -> { id, passPidfd }
// socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK), SO_PASSCRED (so
// every datagram carries SCM_CREDENTIALS: the sender's pid and uid as the
// kernel knows them), SO_PASSPIDFD where the kernel has it (Linux 6.5), then
// bind to the abstract name (no file, no sun_path length trap) and poll it.
Napi::Value NotifyOpen(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 2 || !info[0].IsString() || !info[1].IsFunction()) {
    throw Napi::TypeError::New(env, "notifyOpen(name: string, callback: function)");
  }
  std::string name = info[0].As<Napi::String>().Utf8Value();
  struct sockaddr_un addr;
  if (name.empty() || name.size() > sizeof addr.sun_path - 1 || name.find('\0') != std::string::npos) {
    Napi::Error e = Napi::RangeError::New(env, "name must be 1 to 107 bytes without NUL");
    e.Set("code", Napi::String::New(env, "ERR_OUT_OF_RANGE"));
    throw e;
  }
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  if (fd == -1) ThrowErrno(env, errno, "socket");
  auto fail = [&](int err, const char* call) {
    close(fd);
    ThrowErrno(env, err, call);
  };
  int one = 1;
  if (setsockopt(fd, SOL_SOCKET, SO_PASSCRED, &one, sizeof one) == -1) fail(errno, "setsockopt");
  // ENOPROTOOPT (or EINVAL) before Linux 6.5: credentials only.
  bool pass_pidfd = setsockopt(fd, SOL_SOCKET, SO_PASSPIDFD, &one, sizeof one) == 0;
  if (!pass_pidfd && errno != ENOPROTOOPT && errno != EINVAL) fail(errno, "setsockopt");
  socklen_t len = AbstractAddress(name, &addr);
  if (bind(fd, reinterpret_cast<struct sockaddr*>(&addr), len) == -1) fail(errno, "bind");

  AddonData* data = GetData(env);
  auto* s = new NotifySocket();
  int rc = uv_poll_init(data->loop, &s->poll, fd);
  if (rc != 0) {
    delete s;
    fail(-rc, "uv_poll_init");
  }
  s->poll.data = s;
  s->data = data;
  s->fd = fd;  // from here the watcher owns it
  s->id = NextId(data);
  rc = uv_poll_start(&s->poll, UV_READABLE, OnNotifyReadable);
  if (rc != 0) {
    s->closing = true;
    close(fd);
    uv_close(reinterpret_cast<uv_handle_t*>(&s->poll), OnNotifyClosed);
    ThrowErrno(env, -rc, "uv_poll_start");
  }
  s->callback = Napi::Persistent(info[1].As<Napi::Function>());
  s->context = new Napi::AsyncContext(env, "custody:notify");
  data->notify_sockets[s->id] = s;
  Napi::Object out = Napi::Object::New(env);
  out.Set("id", Napi::Number::New(env, s->id));
  out.Set("passPidfd", Napi::Boolean::New(env, pass_pidfd));
  return out;
}

NotifySocket* FindNotify(const Napi::CallbackInfo& info) {
  uint32_t id = static_cast<uint32_t>(ArgInteger(info, 0, "notify socket", 0, INT32_MAX));
  AddonData* data = GetData(info.Env());
  auto it = data->notify_sockets.find(id);
  return it == data->notify_sockets.end() ? nullptr : it->second;
}

// notifyClose(id): stops polling and closes the socket (the name is free
// again at once). Unknown ids are ignored: closing twice is harmless.
// notifyUnref(id): the socket no longer keeps the loop alive (an instance
// that runs on must not keep the agent from exiting).
Napi::Value NotifyClose(const Napi::CallbackInfo& info) {
  if (NotifySocket* s = FindNotify(info)) StopNotify(s);
  return info.Env().Undefined();
}

Napi::Value NotifyUnref(const Napi::CallbackInfo& info) {
  if (NotifySocket* s = FindNotify(info)) uv_unref(reinterpret_cast<uv_handle_t*>(&s->poll));
  return info.Env().Undefined();
}

// notifyProbe() -> errno name of SO_PASSPIDFD on a fresh socket ("" when the
// kernel has it), for capabilities().
Napi::Value NotifyProbe(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int fd = socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0);
  if (fd == -1) return Napi::String::New(env, ErrnoName(errno));
  int one = 1;
  int err = setsockopt(fd, SOL_SOCKET, SO_PASSPIDFD, &one, sizeof one) == 0 ? 0 : errno;
  close(fd);
  return Napi::String::New(env, err == 0 ? std::string() : ErrnoName(err));
}

}  // namespace

void CleanupNotify(AddonData* data) {
  std::vector<NotifySocket*> all;
  for (auto& entry : data->notify_sockets) all.push_back(entry.second);
  for (NotifySocket* s : all) StopNotify(s);
}

void InitNotify(Napi::Env env, Napi::Object exports) {
  exports.Set("notifyOpen", Napi::Function::New(env, NotifyOpen, "notifyOpen"));
  exports.Set("notifyClose", Napi::Function::New(env, NotifyClose, "notifyClose"));
  exports.Set("notifyUnref", Napi::Function::New(env, NotifyUnref, "notifyUnref"));
  exports.Set("notifyProbe", Napi::Function::New(env, NotifyProbe, "notifyProbe"));
}

}  // namespace custody
