// /proc readers: the stat parser, argv, exe identity, and inspect's
// race-free sequence (pidfd first, reads, then a liveness re-check).
#include "common.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include <cstdlib>
#include <cstring>
#include <memory>
#include <vector>

namespace custody {

namespace {

// RAII for a plain fd so every early return closes it.
struct Fd {
  int fd = -1;
  explicit Fd(int f) : fd(f) {}
  ~Fd() {
    if (fd >= 0) close(fd);
  }
  Fd(const Fd&) = delete;
  Fd& operator=(const Fd&) = delete;
};

// Reads a whole /proc file relative to dirfd. Returns 0 or an errno.
int ReadAt(int dirfd, const char* name, std::string* out) {
  int fd = static_cast<int>(CUSTODY_RETRY_EINTR(openat(dirfd, name, O_RDONLY | O_CLOEXEC | O_NOFOLLOW)));
  if (fd == -1) return errno;
  Fd guard(fd);
  out->clear();
  char buf[4096];
  for (;;) {
    ssize_t n = CUSTODY_RETRY_EINTR(read(fd, buf, sizeof buf));
    if (n == -1) return errno;
    if (n == 0) return 0;
    out->append(buf, static_cast<size_t>(n));
  }
}

struct Stat {
  long long pid = 0;
  std::string comm;
  char state = '?';
  long long ppid = 0;
  long long pgrp = 0;
  long long session = 0;
  unsigned long long start_ticks = 0;
};

// /proc/<pid>/stat: "pid (comm) state ppid pgrp session ... starttime ...".
// comm is free text (spaces, parentheses, even ") ("), so fields are counted
// from the LAST ')'. starttime is field 22 (1-based), i.e. the 20th field
// after comm. Returns false on text that does not have that shape.
bool ParseStat(const std::string& text, Stat* out) {
  size_t open = text.find('(');
  size_t close = text.rfind(')');
  if (open == std::string::npos || close == std::string::npos || close < open) return false;
  char* end = nullptr;
  out->pid = strtoll(text.c_str(), &end, 10);
  if (end == text.c_str()) return false;
  out->comm = text.substr(open + 1, close - open - 1);
  const char* p = text.c_str() + close + 1;
  // Fields after comm: 0 state, 1 ppid, 2 pgrp, 3 session, ..., 19 starttime.
  for (int field = 0; field <= 19; field++) {
    while (*p == ' ') p++;
    if (*p == '\0' || *p == '\n') return false;
    const char* start = p;
    while (*p != ' ' && *p != '\0' && *p != '\n') p++;
    switch (field) {
      case 0:
        if (p - start != 1) return false;
        out->state = *start;
        break;
      case 1:
        out->ppid = strtoll(start, nullptr, 10);
        break;
      case 2:
        out->pgrp = strtoll(start, nullptr, 10);
        break;
      case 3:
        out->session = strtoll(start, nullptr, 10);
        break;
      case 19:
        out->start_ticks = strtoull(start, &end, 10);
        if (end != p) return false;
        break;
      default:
        break;
    }
  }
  return true;
}

Napi::Object StatToObject(const Napi::Env& env, const Stat& st) {
  Napi::Object o = Napi::Object::New(env);
  o.Set("pid", Napi::Number::New(env, static_cast<double>(st.pid)));
  o.Set("comm", st.comm);
  o.Set("state", std::string(1, st.state));
  o.Set("ppid", Napi::Number::New(env, static_cast<double>(st.ppid)));
  o.Set("pgrp", Napi::Number::New(env, static_cast<double>(st.pgrp)));
  o.Set("session", Napi::Number::New(env, static_cast<double>(st.session)));
  o.Set("startTicks", Napi::Number::New(env, static_cast<double>(st.start_ticks)));
  return o;
}

// The real uid from /proc/<pid>/status ("Uid:\treal\teffective\tsaved\tfs").
long long ParseStatusUid(const std::string& status) {
  size_t at = status.find("\nUid:");
  if (at == std::string::npos) return -1;
  return strtoll(status.c_str() + at + 5, nullptr, 10);
}

Napi::Value ParseStatJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsString()) throw Napi::TypeError::New(env, "text must be a string");
  Stat st;
  if (!ParseStat(info[0].As<Napi::String>().Utf8Value(), &st)) return env.Null();
  return StatToObject(env, st);
}

// Reads a whole file by path. Returns 0 or an errno.
int ReadPath(const std::string& path, std::string* out) {
  return ReadAt(AT_FDCWD, path.c_str(), out);
}

// inspect(pid, procRoot, keepPidfd) ->
//   [state, ppid, startTicks, uid, exeDev, exeIno, pidfsId, pidfd, session, ...argv]
// A flat array: building it costs a fraction of an object with named keys,
// and inspect is the hot path of every confirm, verify and sweep. exeDev and
// exeIno are -1 when there is no readable exe; pidfsId is null off pidfs;
// pidfd is -1 unless keepPidfd.
//
// The race-free sequence: pidfd_open first pins the process we mean; the
// /proc reads follow; then signal 0 through the pidfd. If the process was
// reaped meanwhile its pid may belong to someone else by now and the reads
// may describe that someone: ESRCH, and the reads are discarded. A zombie is
// not reaped, still owns its pid, and is reported as what it is (state Z).
Napi::Value Inspect(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int pid = ArgInt(info, 0, "pid");
  std::string root = info.Length() > 1 && info[1].IsString() ? info[1].As<Napi::String>().Utf8Value() : "/proc";
  // keepPidfd: hand the pinning pidfd to the caller (open() signals through
  // the very pidfd the identity was verified with).
  bool keep_pidfd = info.Length() > 2 && info[2].ToBoolean().Value();

  int pidfd = static_cast<int>(syscall(__NR_pidfd_open, pid, 0));
  if (pidfd == -1) ThrowErrno(env, errno, "pidfd_open");
  Fd pidfd_guard(pidfd);

  // Any failed read of a process that has gone becomes ESRCH: the caller
  // learns "no such process", not which file vanished first.
  auto fail = [&](int err, const char* call) {
    if (syscall(__NR_pidfd_send_signal, pidfd, 0, nullptr, 0) == -1 && errno == ESRCH) err = ESRCH;
    ThrowErrno(env, err, call);
  };

  std::string dir = root + "/" + std::to_string(pid) + "/";
  std::string text;
  int err = ReadPath(dir + "stat", &text);
  if (err != 0) fail(err, "read");
  Stat st;
  if (!ParseStat(text, &st)) fail(EPROTO, "read");

  std::string cmdline;
  err = ReadPath(dir + "cmdline", &cmdline);
  if (err != 0) fail(err, "read");

  // The real uid from PIDFD_GET_INFO (Linux 6.13): one ioctl instead of
  // rendering /proc/<pid>/status, the costliest file the kernel makes here.
  long long uid = -1;
  custody_pidfd_info pi;
  memset(&pi, 0, sizeof pi);
  pi.mask = CUSTODY_PIDFD_INFO_CREDS;
  if (ioctl(pidfd, CUSTODY_PIDFD_GET_INFO, &pi) == 0 && (pi.mask & CUSTODY_PIDFD_INFO_CREDS)) {
    uid = pi.ruid;
  } else {
    err = ReadPath(dir + "status", &text);
    if (err != 0) fail(err, "read");
    uid = ParseStatusUid(text);
  }

  // stat() through the exe link names the executable's file, not the link.
  // Kernel threads have no exe (ENOENT); another user's process may deny it
  // (EACCES): both give -1, and verify treats an unknown exe as unknown.
  struct stat exe_st;
  bool has_exe = stat((dir + "exe").c_str(), &exe_st) == 0;

  Napi::Value pidfs_id = env.Null();
  struct statfs sfs;
  struct stat pidfd_st;
  if (fstatfs(pidfd, &sfs) == 0 && static_cast<unsigned long>(sfs.f_type) == PIDFS_MAGIC &&
      fstat(pidfd, &pidfd_st) == 0) {
    pidfs_id = Napi::String::New(env, std::to_string(static_cast<unsigned long long>(pidfd_st.st_ino)));
  }

  // The re-check. EPERM (not ours to signal) still proves it exists.
  if (syscall(__NR_pidfd_send_signal, pidfd, 0, nullptr, 0) == -1 && errno == ESRCH) {
    ThrowErrno(env, ESRCH, "pidfd_send_signal");
  }

  Napi::Array out = Napi::Array::New(env);
  uint32_t i = 0;
  out.Set(i++, Napi::String::New(env, &st.state, 1));
  out.Set(i++, Napi::Number::New(env, static_cast<double>(st.ppid)));
  out.Set(i++, Napi::Number::New(env, static_cast<double>(st.start_ticks)));
  out.Set(i++, Napi::Number::New(env, static_cast<double>(uid)));
  out.Set(i++, Napi::Number::New(env, has_exe ? static_cast<double>(exe_st.st_dev) : -1));
  out.Set(i++, Napi::Number::New(env, has_exe ? static_cast<double>(exe_st.st_ino) : -1));
  out.Set(i++, pidfs_id);
  const uint32_t pidfd_slot = i++;
  out.Set(pidfd_slot, Napi::Number::New(env, -1));
  out.Set(i++, Napi::Number::New(env, static_cast<double>(st.session)));
  size_t start = 0;
  while (start < cmdline.size()) {
    size_t nul = cmdline.find('\0', start);
    if (nul == std::string::npos) nul = cmdline.size();
    out.Set(i++, Napi::String::New(env, cmdline.data() + start, nul - start));
    start = nul + 1;
  }
  if (keep_pidfd) {
    // Last, so that no throw can come between handing the fd over and
    // JavaScript receiving it.
    out.Set(pidfd_slot, Napi::Number::New(env, pidfd));
    GetData(env)->pidfds.insert(pidfd);
    pidfd_guard.fd = -1;
  }
  return out;
}

// /proc/sys/kernel/random/boot_id without the newline.
Napi::Value ReadBootId(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string path = info.Length() > 0 && info[0].IsString() ? info[0].As<Napi::String>().Utf8Value()
                                                             : "/proc/sys/kernel/random/boot_id";
  int fd = static_cast<int>(CUSTODY_RETRY_EINTR(open(path.c_str(), O_RDONLY | O_CLOEXEC)));
  if (fd == -1) ThrowErrno(env, errno, "open");
  Fd guard(fd);
  char buf[64];
  ssize_t n = CUSTODY_RETRY_EINTR(read(fd, buf, sizeof buf));
  if (n == -1) ThrowErrno(env, errno, "read");
  std::string id(buf, static_cast<size_t>(n));
  while (!id.empty() && (id.back() == '\n' || id.back() == ' ')) id.pop_back();
  return Napi::String::New(env, id);
}

// One row of a process-table scan, gathered off the JavaScript thread.
struct ScanRow {
  Stat stat;
  long long owner_uid;
  std::string cmdline;
};

// Reads every numeric entry of the proc root: stat and cmdline through a
// per-process directory fd (so both describe the same process), and the
// directory's owner. No pidfds, no JavaScript: this runs on the threadpool.
// Processes that vanish mid-scan are skipped. Returns 0 or an errno.
int ScanProcesses(const std::string& root, std::vector<ScanRow>* rows) {
  DIR* d = opendir(root.c_str());
  if (d == nullptr) return errno;
  std::unique_ptr<DIR, int (*)(DIR*)> dir_guard(d, closedir);
  int rootfd = dirfd(d);
  std::string stat_text;
  for (;;) {
    errno = 0;
    struct dirent* e = readdir(d);
    if (e == nullptr) return errno;
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    int pdir = static_cast<int>(CUSTODY_RETRY_EINTR(openat(rootfd, e->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC)));
    if (pdir == -1) continue;
    Fd guard(pdir);
    ScanRow row;
    if (ReadAt(pdir, "stat", &stat_text) != 0 || !ParseStat(stat_text, &row.stat)) continue;
    if (ReadAt(pdir, "cmdline", &row.cmdline) != 0) continue;
    // The directory's owner is the process's effective uid (root when it is
    // not dumpable): a hint for filtering, at the cost of one fstat instead
    // of rendering /proc/<pid>/status, a third of the scan. Proof of the
    // real uid comes later, under a pidfd.
    struct stat dst;
    row.owner_uid = fstat(pdir, &dst) == 0 ? static_cast<long long>(dst.st_uid) : -1;
    rows->push_back(std::move(row));
  }
}

// listProcesses(procRoot) -> Promise of a flat array, per process
//   [pid, ppid, pgrp, session, ownerUid, startTicks, state, argc, ...argv]
// The scan of thousands of processes takes tens of milliseconds of kernel
// time: it runs on the libuv threadpool so the event loop never waits for
// it, and the result crosses as one flat array (no per-process objects).
// Nothing here is proof of identity; callers inspect() a candidate first.
class ScanWorker : public Napi::AsyncWorker {
 public:
  ScanWorker(Napi::Env env, std::string root)
      : Napi::AsyncWorker(env, "custody:scan"), root_(std::move(root)), deferred_(Napi::Promise::Deferred::New(env)) {}

  Napi::Promise Promise() { return deferred_.Promise(); }

  void Execute() override { err_ = ScanProcesses(root_, &rows_); }

  void OnOK() override {
    Napi::Env env = Env();
    if (err_ != 0) {
      deferred_.Reject(ErrnoError(env, err_, "readdir").Value());
      return;
    }
    Napi::Array out = Napi::Array::New(env);
    uint32_t i = 0;
    for (const ScanRow& r : rows_) {
      out.Set(i++, Napi::Number::New(env, static_cast<double>(r.stat.pid)));
      out.Set(i++, Napi::Number::New(env, static_cast<double>(r.stat.ppid)));
      out.Set(i++, Napi::Number::New(env, static_cast<double>(r.stat.pgrp)));
      out.Set(i++, Napi::Number::New(env, static_cast<double>(r.stat.session)));
      out.Set(i++, Napi::Number::New(env, static_cast<double>(r.owner_uid)));
      out.Set(i++, Napi::Number::New(env, static_cast<double>(r.stat.start_ticks)));
      out.Set(i++, Napi::String::New(env, &r.stat.state, 1));
      const uint32_t argc_slot = i++;
      uint32_t argc = 0;
      size_t start = 0;
      while (start < r.cmdline.size()) {
        size_t nul = r.cmdline.find('\0', start);
        if (nul == std::string::npos) nul = r.cmdline.size();
        out.Set(i++, Napi::String::New(env, r.cmdline.data() + start, nul - start));
        argc++;
        start = nul + 1;
      }
      out.Set(argc_slot, Napi::Number::New(env, argc));
    }
    deferred_.Resolve(out);
  }

  void OnError(const Napi::Error& e) override { deferred_.Reject(e.Value()); }

 private:
  std::string root_;
  Napi::Promise::Deferred deferred_;
  std::vector<ScanRow> rows_;
  int err_ = 0;
};

Napi::Value ListProcesses(const Napi::CallbackInfo& info) {
  std::string root = info.Length() > 0 && info[0].IsString() ? info[0].As<Napi::String>().Utf8Value() : "/proc";
  auto* worker = new ScanWorker(info.Env(), root);  // deleted by N-API once done
  Napi::Promise promise = worker->Promise();
  worker->Queue();
  return promise;
}

}  // namespace

void InitProc(Napi::Env env, Napi::Object exports) {
  exports.Set("parseStat", Napi::Function::New(env, ParseStatJs, "parseStat"));
  exports.Set("inspect", Napi::Function::New(env, Inspect, "inspect"));
  exports.Set("readBootId", Napi::Function::New(env, ReadBootId, "readBootId"));
  exports.Set("listProcesses", Napi::Function::New(env, ListProcesses, "listProcesses"));
}

}  // namespace custody
