// Identity reads of one process: inspect's race-free sequence (pidfd first,
// reads through a /proc/<pid> dir fd, then a liveness re-check), its batch on
// the threadpool (inspectPinnedMany), and the boot id.
#include "procfs.h"

#include <sys/stat.h>
#include <sys/vfs.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace custody {

namespace {

// The real uid from /proc/<pid>/status ("Uid:\treal\teffective\tsaved\tfs").
long long ParseStatusUid(const std::string& status) {
  size_t at = status.find("\nUid:");
  if (at == std::string::npos) return -1;
  return strtoll(status.c_str() + at + 5, nullptr, 10);
}

// stat(/proc/<pid>/exe) follows the magic link to the executable's file.
// Kernel threads have none (ENOENT), another user's process may deny it
// (EACCES, EPERM): no exe. Anything else is an error to report.
int ReadExe(int dir, bool* has_exe, struct stat* exe) {
  *has_exe = fstatat(dir, "exe", exe, 0) == 0;
  if (*has_exe || errno == ENOENT || errno == EACCES || errno == EPERM) return 0;
  return errno;
}

// The pid namespace a process lives in, as the inode of its ns/pid link
// (nsfs, Linux 3.8). Following the link takes ptrace read access (EACCES or
// EPERM for another uid's process, or one that is not dumpable); there,
// status's NSpid (Linux 4.1) still tells whether it lives in the namespace
// of the /proc being read: it lists one pid per namespace from that one down
// to the process's own. Reported as the inode, kPidNsOfProc (that /proc's
// own namespace, inode unread) or kPidNsUnknown (another, or no answer).
constexpr long long kPidNsOfProc = 0;
constexpr long long kPidNsUnknown = -1;

// What one consistent read of a process yields.
struct IdentityRead {
  Stat st;  // the thread-group leader's: start ticks, ppid, session, comm
  char state = '?';  // the leader's, or a live thread's when the leader is a zombie
  std::string cmdline;
  bool has_exe = false;
  struct stat exe;
  long long uid = -1;
  // The pid namespace the process lives in (see ReadPidNs).
  long long pid_ns = kPidNsUnknown;
};

// The real uid from PIDFD_GET_INFO (Linux 6.13): one ioctl instead of
// rendering /proc/<pid>/status, the costliest file the kernel makes here.
int ReadUid(int pidfd, int piddir, long long* uid) {
  custody_pidfd_info pi;
  memset(&pi, 0, sizeof pi);
  pi.mask = CUSTODY_PIDFD_INFO_CREDS;
  if (pidfd >= 0 && ioctl(pidfd, CUSTODY_PIDFD_GET_INFO, &pi) == 0 && (pi.mask & CUSTODY_PIDFD_INFO_CREDS)) {
    *uid = pi.ruid;
    return 0;
  }
  std::string text;
  int err = ReadAt(piddir, "status", &text);
  if (err != 0) return err;
  *uid = ParseStatusUid(text);
  return 0;
}

int ReadPidNs(int src, int piddir, long long* ns) {
  // readlink, not stat: the link's text ("pid:[4026531836]") is the inode,
  // formatted without resolving the nsfs dentry (2 us against 4.6 here).
  char link[64];
  ssize_t n = readlinkat(src, "ns/pid", link, sizeof link - 1);
  if (n > 0) {
    link[n] = '\0';
    unsigned long long ino = 0;
    if (sscanf(link, "pid:[%llu]", &ino) == 1 && ino > 0 && ino <= (1ULL << 53)) {
      *ns = static_cast<long long>(ino);
      return 0;
    }
    *ns = kPidNsUnknown;
    return 0;
  }
  if (errno != EACCES && errno != EPERM && errno != ENOENT) return errno;
  std::string text;
  int err = ReadAt(piddir, "status", &text);
  if (err != 0) return err;
  size_t at = text.find("\nNSpid:");
  size_t end = at == std::string::npos ? at : text.find('\n', at + 1);
  if (at == std::string::npos || end == std::string::npos) {
    *ns = kPidNsUnknown;
    return 0;
  }
  // "NSpid:\t12" is one level; "NSpid:\t12\t1" a process of a child namespace.
  const char* p = text.c_str() + at + 7;
  const char* stop = text.c_str() + end;
  int levels = 0;
  while (p < stop) {
    while (p < stop && (*p == ' ' || *p == '\t')) p++;
    if (p == stop) break;
    levels++;
    while (p < stop && *p != ' ' && *p != '\t') p++;
  }
  *ns = levels == 1 ? kPidNsOfProc : kPidNsUnknown;
  return 0;
}

// How often a read is repeated while an exec keeps moving under it.
constexpr int kExecRetries = 8;

// Exec is a seam: cmdline and exe change together in the kernel (both come
// from the mm that execve swaps in), but a reader can land between reading
// one and the other and record a launcher's argv with its target's exe. So:
// stat, cmdline, exe, uid, cmdline again, stat again, and repeat while the
// cmdline or comm (exec sets it) moved. Returns 0, EAGAIN after
// kExecRetries moving reads, or the errno of a failed read.
int ReadIdentity(int pidfd, int piddir, int pid, IdentityRead* out) {
  std::string again;
  std::string text;
  for (int attempt = 0; attempt < kExecRetries; attempt++) {
    int err = ReadAt(piddir, "stat", &text);
    if (err != 0) return err;
    if (!ParseStat(text, &out->st)) return EPROTO;
    out->state = out->st.state;
    Fd thread(-1);
    if (out->st.state == 'Z') {
      int t = LiveThreadDir(piddir, pid, &out->state);
      if (t < -1) return -t;
      thread.fd = t;
    }
    int src = thread.fd >= 0 ? thread.fd : piddir;
    if ((err = ReadAt(src, "cmdline", &out->cmdline)) != 0) return err;
    if ((err = ReadExe(src, &out->has_exe, &out->exe)) != 0) return err;
    if ((err = ReadUid(pidfd, piddir, &out->uid)) != 0) return err;
    if ((err = ReadPidNs(src, piddir, &out->pid_ns)) != 0) return err;
    if ((err = ReadAt(src, "cmdline", &again)) != 0) return err;
    if ((err = ReadAt(piddir, "stat", &text)) != 0) return err;
    Stat st2;
    if (!ParseStat(text, &st2)) return EPROTO;
    bool leader_died = (st2.state == 'Z') != (out->st.state == 'Z');
    if (again == out->cmdline && st2.comm == out->st.comm && !leader_died) return 0;
  }
  return EAGAIN;
}

// One inspection of pid under its own pidfd, everything but the JavaScript
// value: shared by inspect() on the JavaScript thread and inspectPinned's
// batch on the threadpool (InspectWorker).
//
// The race-free sequence: pidfd_open first pins the process we mean (and
// fails with EINVAL for a thread that is not a thread-group leader: a TID is
// not a process); a dir fd on /proc/<pid> follows, and every read goes
// through it (reads of a process that died return ESRCH, never another's);
// then signal 0 through the pidfd. If the process was reaped meanwhile its
// pid may belong to someone else by now: ESRCH, and the reads are discarded.
// A zombie is not reaped, still owns its pid, and is reported as what it is
// (state Z) unless other threads of it still run.
struct Inspection {
  IdentityRead read;
  bool on_pidfs = false;
  unsigned long long pidfs_ino = 0;
  // The pinning pidfd, open after a successful inspection: whoever holds the
  // Inspection closes it or hands it to JavaScript (and sets it to -1).
  int pidfd = -1;
  const char* call = nullptr;  // the call that failed
};

// Returns 0, or an errno (out->call names the call; out->pidfd stays -1).
int InspectOne(int pid, const std::string& root, Inspection* out) {
  int pidfd = static_cast<int>(syscall(__NR_pidfd_open, pid, 0));
  if (pidfd == -1) {
    out->call = "pidfd_open";
    return errno;
  }
  Fd pidfd_guard(pidfd);
  // Any failed read of a process that has gone becomes ESRCH: the caller
  // learns "no such process", not which file vanished first.
  auto fail = [&](int err, const char* call) {
    if (syscall(__NR_pidfd_send_signal, pidfd, 0, nullptr, 0) == -1 && errno == ESRCH) err = ESRCH;
    out->call = call;
    return err;
  };

  std::string dir = root + "/" + std::to_string(pid);
  int piddir = static_cast<int>(CUSTODY_RETRY_EINTR(open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC)));
  if (piddir == -1) return fail(errno, "open");
  Fd piddir_guard(piddir);

  int err = ReadIdentity(pidfd, piddir, pid, &out->read);
  if (err != 0) return fail(err, "read");

  struct statfs sfs;
  struct stat pidfd_st;
  if (fstatfs(pidfd, &sfs) == 0 && static_cast<unsigned long>(sfs.f_type) == PIDFS_MAGIC &&
      fstat(pidfd, &pidfd_st) == 0) {
    out->on_pidfs = true;
    out->pidfs_ino = static_cast<unsigned long long>(pidfd_st.st_ino);
  }

  // The re-check. EPERM (not ours to signal) still proves it exists.
  if (syscall(__NR_pidfd_send_signal, pidfd, 0, nullptr, 0) == -1 && errno == ESRCH) {
    out->call = "pidfd_send_signal";
    return ESRCH;
  }
  out->pidfd = pidfd;
  pidfd_guard.fd = -1;
  return 0;
}

// The slot of the pidfd in inspect's array (see below).
constexpr uint32_t kPidfdSlot = 7;

// [state, ppid, startTicks, uid, exeDev, exeIno, pidfsId, pidfd, session, pidNs, ...argv]
// A flat array: building it costs a fraction of an object with named keys,
// and inspect is the hot path of every confirm, verify and sweep. exeDev and
// exeIno are -1 when there is no readable exe; pidfsId is null off pidfs;
// the pidfd slot is -1 (HandOver fills it); pidNs is the inode of the pid
// namespace the process lives in, 0 for the /proc's own (inode unread), -1
// unknown.
Napi::Array InspectionValue(const Napi::Env& env, const Inspection& in) {
  const IdentityRead& r = in.read;
  Napi::Array out = Napi::Array::New(env);
  uint32_t i = 0;
  out.Set(i++, Napi::String::New(env, &r.state, 1));
  out.Set(i++, Napi::Number::New(env, static_cast<double>(r.st.ppid)));
  out.Set(i++, Napi::Number::New(env, static_cast<double>(r.st.start_ticks)));
  out.Set(i++, Napi::Number::New(env, static_cast<double>(r.uid)));
  out.Set(i++, Napi::Number::New(env, r.has_exe ? static_cast<double>(r.exe.st_dev) : -1));
  out.Set(i++, Napi::Number::New(env, r.has_exe ? static_cast<double>(r.exe.st_ino) : -1));
  out.Set(i++, in.on_pidfs ? static_cast<Napi::Value>(Napi::String::New(env, std::to_string(in.pidfs_ino)))
                           : env.Null());
  out.Set(i++, Napi::Number::New(env, -1));  // kPidfdSlot
  out.Set(i++, Napi::Number::New(env, static_cast<double>(r.st.session)));
  out.Set(i++, Napi::Number::New(env, static_cast<double>(r.pid_ns)));
  AppendArgv(env, out, i, r.cmdline);
  return out;
}

// Gives the inspection's pidfd to JavaScript in its array's slot, as one of
// the addon's (the env cleanup hook closes those JavaScript forgot). Last
// of all, so that no throw can come between handing the fd over and
// JavaScript receiving it.
void HandOver(const Napi::Env& env, Napi::Array value, Inspection* in) {
  value.Set(kPidfdSlot, Napi::Number::New(env, in->pidfd));
  GetData(env)->pidfds.insert(in->pidfd);
  in->pidfd = -1;
}

// inspect(pid, procRoot, keepPidfd) -> the array above.
// keepPidfd: hand the pinning pidfd to the caller (open() signals through
// the very pidfd the identity was verified with); else it is closed.
Napi::Value Inspect(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int pid = ArgPid(info, 0);
  std::string root = ProcRootArg(info, 1);
  bool keep_pidfd = info.Length() > 2 && info[2].ToBoolean().Value();

  Inspection in;
  int err = InspectOne(pid, root, &in);
  if (err != 0) ThrowErrno(env, err, in.call);
  Fd pidfd_guard(in.pidfd);
  Napi::Array out = InspectionValue(env, in);
  if (keep_pidfd) {
    HandOver(env, out, &in);
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

// At most this many pids in one inspectPinnedMany call: the caller batches,
// and a batch holds a pidfd per live process until it is handed over.
constexpr uint32_t kMaxInspectBatch = 65536;

// inspectPinnedMany(pids) -> Promise of an array, one entry per pid in
// order: inspect's array with its pidfd handed over, or the Error inspect
// would have thrown (ESRCH for a process that is gone). On the threadpool:
// recovery pins thousands of recorded processes, tens of microseconds of
// kernel time each, while the JavaScript thread reads and decides. An
// allocation failure rejects the whole batch with ENOMEM, its pidfds closed.
class InspectWorker : public ProcWorker {
 public:
  InspectWorker(Napi::Env env, std::vector<int> pids)
      : ProcWorker(env, "custody:inspect"), pids_(std::move(pids)) {}

  ~InspectWorker() override {
    // Whatever was not handed over (a rejected batch, a throw while building).
    for (const Inspection& in : results_) {
      if (in.pidfd >= 0) close(in.pidfd);
    }
  }

 protected:
  int Run(const char** call) override {
    *call = "inspect";
    results_.resize(pids_.size());
    errors_.resize(pids_.size());
    for (size_t k = 0; k < pids_.size(); k++) errors_[k] = InspectOne(pids_[k], "/proc", &results_[k]);
    return 0;
  }

  Napi::Value Result(Napi::Env env) override {
    Napi::Array out = Napi::Array::New(env, results_.size());
    for (uint32_t k = 0; k < results_.size(); k++) {
      Inspection& in = results_[k];
      if (errors_[k] != 0) {
        out.Set(k, ErrnoError(env, errors_[k], in.call).Value());
        continue;
      }
      Napi::Array value = InspectionValue(env, in);
      HandOver(env, value, &in);
      out.Set(k, value);
    }
    return out;
  }

 private:
  std::vector<int> pids_;
  std::vector<Inspection> results_;
  std::vector<int> errors_;
};

Napi::Value InspectPinnedMany(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsArray()) throw Napi::TypeError::New(env, "pids must be an array");
  Napi::Array arr = info[0].As<Napi::Array>();
  if (arr.Length() > kMaxInspectBatch) throw Napi::RangeError::New(env, "pids: at most 65536 in one batch");
  std::vector<int> pids;
  pids.reserve(arr.Length());
  for (uint32_t k = 0; k < arr.Length(); k++) {
    pids.push_back(static_cast<int>(IntegerValue(env, arr.Get(k), "pid", 1, 4194304)));
  }
  return QueueJob(new InspectWorker(env, std::move(pids)));
}

}  // namespace

void InitIdentity(Napi::Env env, Napi::Object exports) {
  exports.Set("inspect", Napi::Function::New(env, Inspect, "inspect"));
  exports.Set("inspectPinnedMany", Napi::Function::New(env, InspectPinnedMany, "inspectPinnedMany"));
  exports.Set("readBootId", Napi::Function::New(env, ReadBootId, "readBootId"));
}

}  // namespace custody
