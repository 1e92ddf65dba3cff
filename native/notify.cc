// The receiving end of systemd's sd_notify protocol: a unix datagram socket
// bound to an abstract name, read on the libuv loop, each datagram handed to
// JavaScript with the sender's credentials. What a message means, and
// whether its sender may say it, is decided in TypeScript (src/lifecycle/notify.ts).
#include "common.h"

#include <fcntl.h>
#include <sys/socket.h>
#include <sys/un.h>

#include <cstring>
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
// SCM_MAX_FD: the most fds one message can carry. They are received only to
// be closed: a sender must not be able to leak fds into this process.
constexpr size_t kMaxFds = 253;

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

struct Datagram {
  std::string data;
  bool truncated = false;
  long long pid = 0;
  long long uid = -1;
  int pidfd = -1;  // from SCM_PIDFD; -1 when none came, -2 when the kernel could not pin the sender
};

// Fds that came with SCM_RIGHTS. None is kept, but they are closed only once
// JavaScript has handled the batch: sd_notify_barrier(3) (BARRIER=1, as
// systemd-notify sends after its message) waits for that close to know the
// messages before it were processed, and only then lets its sender exit.
struct Rights {
  std::vector<int> fds;
  ~Rights() {
    for (int fd : fds) close(fd);
  }
};

// Walks the control messages: keeps the credentials and the sender's pidfd,
// and the SCM_RIGHTS fds, for closing.
void TakeControl(struct msghdr* msg, Datagram* d, Rights* rights) {
  for (struct cmsghdr* c = CMSG_FIRSTHDR(msg); c != nullptr; c = CMSG_NXTHDR(msg, c)) {
    if (c->cmsg_level != SOL_SOCKET) continue;
    size_t len = c->cmsg_len - CMSG_LEN(0);
    if (c->cmsg_type == SCM_CREDENTIALS && len >= sizeof(struct ucred)) {
      struct ucred cred;
      memcpy(&cred, CMSG_DATA(c), sizeof cred);
      d->pid = cred.pid;
      d->uid = cred.uid;
    } else if (c->cmsg_type == SCM_PIDFD && len >= sizeof(int)) {
      int fd;
      memcpy(&fd, CMSG_DATA(c), sizeof fd);
      // A negative value is the kernel's error for a sender it could not
      // pin (gone before we received): no pidfd to close.
      if (d->pidfd >= 0) {
        if (fd >= 0) close(fd);  // a second one: never sent by the kernel, never kept
      } else {
        d->pidfd = fd >= 0 ? fd : -2;
      }
    } else if (c->cmsg_type == SCM_RIGHTS) {
      size_t n = len / sizeof(int);
      for (size_t i = 0; i < n; i++) {
        int fd;
        memcpy(&fd, CMSG_DATA(c) + i * sizeof(int), sizeof fd);
        if (fd >= 0) rights->fds.push_back(fd);
      }
    }
  }
}

// Reads up to kBatch datagrams without blocking. Returns 0 (the queue is
// empty or the batch is full) or the errno of a failed recvmsg.
int Drain(int fd, std::vector<Datagram>* out, Rights* rights) {
  char buf[kMaxMessage];
  alignas(struct cmsghdr) char control[CMSG_SPACE(sizeof(struct ucred)) + CMSG_SPACE(sizeof(int)) +
                                       CMSG_SPACE(sizeof(int) * kMaxFds)];
  for (int i = 0; i < kBatch; i++) {
    struct iovec iov = {buf, sizeof buf};
    struct msghdr msg;
    memset(&msg, 0, sizeof msg);
    msg.msg_iov = &iov;
    msg.msg_iovlen = 1;
    msg.msg_control = control;
    msg.msg_controllen = sizeof control;
    // MSG_TRUNC: the datagram's real length, to tell a truncated one apart.
    // MSG_CMSG_CLOEXEC: fds that arrive never leak into a child we spawn.
    ssize_t n = CUSTODY_RETRY_EINTR(recvmsg(fd, &msg, MSG_DONTWAIT | MSG_TRUNC | MSG_CMSG_CLOEXEC));
    if (n == -1) return errno == EAGAIN || errno == EWOULDBLOCK ? 0 : errno;
    Datagram d;
    TakeControl(&msg, &d, rights);
    d.truncated = static_cast<size_t>(n) > sizeof buf || (msg.msg_flags & MSG_TRUNC) != 0;
    d.data.assign(buf, d.truncated ? 0 : static_cast<size_t>(n));
    out->push_back(std::move(d));
  }
  return 0;
}

// callback(error, batch): batch is flat, five slots a datagram:
//   [data: Buffer, truncated: boolean, pid, uid, pidfd]
// pidfd is -1 without SO_PASSPIDFD, -2 when the sender was already gone; a
// pidfd >= 0 is JavaScript's to close (it is tracked for the env cleanup).
void OnNotifyReadable(uv_poll_t* handle, int status, int /*events*/) {
  auto* s = static_cast<NotifySocket*>(handle->data);
  if (s->closing) return;
  std::vector<Datagram> batch;
  Rights rights;  // closed when this function returns, after the callback
  int err = status < 0 ? -status : Drain(s->fd, &batch, &rights);
  Napi::Env env = s->callback.Env();
  Napi::HandleScope scope(env);
  Napi::Array flat = Napi::Array::New(env, batch.size() * 5);
  uint32_t i = 0;
  for (Datagram& d : batch) {
    flat.Set(i++, Napi::Buffer<char>::Copy(env, d.data.data(), d.data.size()));
    flat.Set(i++, Napi::Boolean::New(env, d.truncated));
    flat.Set(i++, Napi::Number::New(env, static_cast<double>(d.pid)));
    flat.Set(i++, Napi::Number::New(env, static_cast<double>(d.uid)));
    flat.Set(i++, Napi::Number::New(env, d.pidfd));
    if (d.pidfd >= 0) s->data->pidfds.insert(d.pidfd);
  }
  Napi::Value error = err != 0 ? static_cast<Napi::Value>(ErrnoError(env, err, "recvmsg").Value()) : env.Null();
  Napi::Function fn = s->callback.Value();
  s->in_callback = true;
  try {
    fn.MakeCallback(env.Global(), {error, flat}, *s->context);
  } catch (const Napi::Error& e) {
    napi_fatal_exception(env, e.Value());
  }
  s->in_callback = false;
  // Closed from inside the callback: the handle is freed by uv_close's
  // callback on a later turn, so s is still valid here; the context goes now.
  if (s->closing) {
    delete s->context;
    s->context = nullptr;
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
