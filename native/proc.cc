// /proc readers: the stat parser, argv, exe identity, and inspect's
// race-free sequence (pidfd first, reads, then a liveness re-check).
#include "common.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/vfs.h>

#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <unordered_map>
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

// Length of the valid UTF-8 sequence at p (RFC 3629: shortest form only,
// no UTF-16 surrogates, nothing above U+10FFFF), with its code point; 0 when
// the bytes there are not one. The same rule as Node's buffer.isUtf8, so the
// js backend decodes every byte string exactly as this addon does.
size_t Utf8Sequence(const unsigned char* p, size_t n, uint32_t* cp) {
  unsigned char b = p[0];
  if (b < 0x80) {
    *cp = b;
    return 1;
  }
  size_t len;
  uint32_t min;
  if (b >= 0xC2 && b <= 0xDF) {
    len = 2, min = 0x80, *cp = b & 0x1F;
  } else if (b >= 0xE0 && b <= 0xEF) {
    len = 3, min = 0x800, *cp = b & 0x0F;
  } else if (b >= 0xF0 && b <= 0xF4) {
    len = 4, min = 0x10000, *cp = b & 0x07;
  } else {
    return 0;
  }
  if (n < len) return 0;
  for (size_t i = 1; i < len; i++) {
    if ((p[i] & 0xC0) != 0x80) return 0;
    *cp = (*cp << 6) | (p[i] & 0x3F);
  }
  if (*cp < min || *cp > 0x10FFFF || (*cp >= 0xD800 && *cp <= 0xDFFF)) return 0;
  return len;
}


// Errors that mean "this process is gone", as opposed to "the kernel could
// not answer" (EMFILE, ENFILE, ENOMEM, EIO...), which must never be read as
// an answer: a scan that skipped what it could not open would report a live
// process as absent.
bool Vanished(int err) { return err == ENOENT || err == ESRCH; }

// stat(/proc/<pid>/exe) follows the magic link to the executable's file.
// Kernel threads have none (ENOENT), another user's process may deny it
// (EACCES, EPERM): no exe. Anything else is an error to report.
int ReadExe(int dir, bool* has_exe, struct stat* exe) {
  *has_exe = fstatat(dir, "exe", exe, 0) == 0;
  if (*has_exe || errno == ENOENT || errno == EACCES || errno == EPERM) return 0;
  return errno;
}

// A thread-group leader that called pthread_exit while other threads run is
// a zombie in /proc/<pid>/stat, yet the process is alive; its cmdline and
// exe read empty because both come from the mm, which the leader dropped.
// Returns a dir fd on a live thread of it (the caller closes it) with that
// thread's state, -1 when no thread lives (the process has exited), or
// -errno when the task list could not be read.
int LiveThreadDir(int piddir, int pid, char* state) {
  int tfd = static_cast<int>(CUSTODY_RETRY_EINTR(openat(piddir, "task", O_RDONLY | O_DIRECTORY | O_CLOEXEC)));
  if (tfd == -1) return Vanished(errno) ? -1 : -errno;
  DIR* d = fdopendir(tfd);
  if (d == nullptr) {
    int err = errno;
    close(tfd);
    return -err;
  }
  std::unique_ptr<DIR, int (*)(DIR*)> guard(d, closedir);
  std::string text;
  Stat st;
  for (;;) {
    errno = 0;
    struct dirent* e = readdir(d);
    if (e == nullptr) return errno == 0 ? -1 : -errno;
    if (e->d_name[0] < '1' || e->d_name[0] > '9' || atoll(e->d_name) == pid) continue;
    int thread = static_cast<int>(CUSTODY_RETRY_EINTR(openat(tfd, e->d_name, O_RDONLY | O_DIRECTORY | O_CLOEXEC)));
    if (thread == -1) {
      if (Vanished(errno)) continue;
      return -errno;
    }
    int err = ReadAt(thread, "stat", &text);
    if (err == 0 && ParseStat(text, &st) && st.state != 'Z' && st.state != 'X') {
      *state = st.state;
      return thread;
    }
    close(thread);
    if (err != 0 && !Vanished(err)) return -err;
  }
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
  size_t start = 0;
  while (start < r.cmdline.size()) {
    size_t nul = r.cmdline.find('\0', start);
    if (nul == std::string::npos) nul = r.cmdline.size();
    // As a napi_value: Set() would otherwise take the implicit std::string
    // conversion, re-encoding escaped bytes to U+FFFD.
    out.Set(i++, static_cast<napi_value>(DecodeBytes(env, r.cmdline.data() + start, nul - start)));
    start = nul + 1;
  }
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
  std::string root = info.Length() > 1 && info[1].IsString() ? info[1].As<Napi::String>().Utf8Value() : "/proc";
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

// Calls visit(rootfd, name) for every numeric entry of the proc root, in
// readdir order. visit returns 0 to go on or an errno to end the walk with
// (a process that vanished is the visitor's to skip: it returns 0). Returns
// 0 at the end of the directory, else the errno, with *call naming the call
// that failed. The one readdir loop of every threadpool scan.
template <typename Visit>
int ForEachPid(const std::string& root, const char** call, Visit visit) {
  *call = "opendir";
  DIR* d = opendir(root.c_str());
  if (d == nullptr) return errno;
  std::unique_ptr<DIR, int (*)(DIR*)> dir_guard(d, closedir);
  int rootfd = dirfd(d);
  for (;;) {
    errno = 0;
    struct dirent* e = readdir(d);
    if (e == nullptr) {
      *call = "readdir";
      return errno;
    }
    if (e->d_name[0] < '1' || e->d_name[0] > '9') continue;
    int err = visit(rootfd, e->d_name);
    if (err != 0) return err;
  }
}

// The address-space layout a stat line shows: "startcode:start_brk:startstack"
// (fields 26, 47 and 28, 1-based), as the kernel printed them. A fork shares
// (CLONE_VM) or copies (fork) its parent's mm, so until its execve it shows
// exactly its parent's; the kernel randomizes them at every exec (ASLR). A
// process without an mm (a zombie, a kernel thread, one inside execve) shows
// zeros, and one the reader may not ptrace-read 1 for startcode and zeros
// (fs/proc/array.c): false for any zero, as for a line without the fields
// Linux 3.3 added. flags (field 9) is read in any case.
bool StatImage(const std::string& text, std::string* out, unsigned long long* flags) {
  size_t close = text.rfind(')');
  if (close == std::string::npos) return false;
  const char* p = text.c_str() + close + 1;
  std::string code, brk, stack;
  for (int field = 0; field <= 44; field++) {
    while (*p == ' ') p++;
    if (*p == '\0' || *p == '\n') return false;
    const char* start = p;
    while (*p != ' ' && *p != '\0' && *p != '\n') p++;
    if (field == 6) *flags = strtoull(start, nullptr, 10);
    if (field == 23) code.assign(start, p);
    if (field == 25) stack.assign(start, p);
    if (field == 44) brk.assign(start, p);
  }
  for (const std::string* f : {&code, &brk, &stack})
    if (f->find_first_not_of('0') == std::string::npos) return false;
  *out = code + ":" + brk + ":" + stack;
  return true;
}

// One row of a process-table scan, gathered off the JavaScript thread.
struct ScanRow {
  Stat stat;
  long long owner_uid;
  std::string cmdline;
  // Which of the wanted images (see StatImage) the process shows; -1: none.
  int image = -1;
  // The kernel's per-task flags (field 9): PF_KTHREAD tells a kernel thread
  // from a process inside execve, both without argv or layout. Read only
  // with images.
  unsigned long long flags = 0;
};

// Reads every numeric entry of the proc root: stat and cmdline through a
// per-process directory fd (so both describe the same process), and the
// directory's owner. No pidfds, no JavaScript: this runs on the threadpool.
// A process that vanishes mid-scan is skipped; any other failure (EMFILE
// with a few free fds, ENOMEM) ends the scan with its errno and the call
// that failed, because skipping it would report a live process as absent.
// images: nullptr, or the layouts to compare every row's with, each to its
// index (then each row's flags are read too).
int ScanProcesses(const std::string& root, const std::unordered_map<std::string, int>* images,
                  std::vector<ScanRow>* rows, const char** call) {
  std::string stat_text;
  std::string image;
  return ForEachPid(root, call, [&](int rootfd, const char* name) -> int {
    *call = "openat";
    int pdir = static_cast<int>(CUSTODY_RETRY_EINTR(openat(rootfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC)));
    if (pdir == -1) return Vanished(errno) ? 0 : errno;
    Fd guard(pdir);
    ScanRow row;
    *call = "read";
    int err = ReadAt(pdir, "stat", &stat_text);
    if (err == 0 && !ParseStat(stat_text, &row.stat)) err = EPROTO;
    if (err == 0 && images != nullptr && StatImage(stat_text, &image, &row.flags)) {
      auto found = images->find(image);
      if (found != images->end()) row.image = found->second;
    }
    Fd thread(-1);
    if (err == 0 && row.stat.state == 'Z') {
      // A zombie leader with live threads: its argv is readable from them.
      int t = LiveThreadDir(pdir, static_cast<int>(row.stat.pid), &row.stat.state);
      if (t < -1) err = -t;
      thread.fd = t;
    }
    if (err == 0) err = ReadAt(thread.fd >= 0 ? thread.fd : pdir, "cmdline", &row.cmdline);
    if (err != 0) return Vanished(err) ? 0 : err;
    // The directory's owner is the process's effective uid (root when it is
    // not dumpable): a hint for filtering, at the cost of one fstat instead
    // of rendering /proc/<pid>/status, a third of the scan. Proof of the
    // real uid comes later, under a pidfd.
    struct stat dst;
    row.owner_uid = fstat(pdir, &dst) == 0 ? static_cast<long long>(dst.st_uid) : -1;
    rows->push_back(std::move(row));
    return 0;
  });
}

// A job on the libuv threadpool that reads /proc and settles a promise: the
// scan of thousands of processes takes tens of milliseconds of kernel time,
// which the event loop must not wait for. Run() returns 0 or an errno (and
// names the call that failed); an allocation failure is ENOMEM, never a
// crash; Result() builds the value on the JavaScript thread.
class ProcWorker : public Napi::AsyncWorker {
 public:
  ProcWorker(Napi::Env env, const char* name) : Napi::AsyncWorker(env, name), deferred_(Napi::Promise::Deferred::New(env)) {}

  Napi::Promise Promise() { return deferred_.Promise(); }

  void Execute() final {
    try {
      err_ = Run(&call_);
    } catch (const std::bad_alloc&) {
      // operator new, so malloc, is the call that failed.
      err_ = ENOMEM;
      call_ = "malloc";
    }
  }

  void OnOK() final {
    Napi::Env env = Env();
    if (err_ != 0) {
      deferred_.Reject(ErrnoError(env, err_, call_).Value());
      return;
    }
    deferred_.Resolve(Result(env));
  }

  void OnError(const Napi::Error& e) final { deferred_.Reject(e.Value()); }

 protected:
  virtual int Run(const char** call) = 0;
  virtual Napi::Value Result(Napi::Env env) = 0;

 private:
  Napi::Promise::Deferred deferred_;
  int err_ = 0;
  const char* call_ = "readdir";
};

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
  auto* worker = new InspectWorker(env, std::move(pids));  // deleted by N-API once done
  Napi::Promise promise = worker->Promise();
  worker->Queue();
  return promise;
}

// ---- State files, read in batches -------------------------------------

// At most this many names in one readFilesAt call (the caller batches), and
// the largest file it reads: a manifest is a few kilobytes.
constexpr uint32_t kMaxReadBatch = 65536;
constexpr int64_t kMaxReadBytes = 16 << 20;
// The bytes one batch holds before it stops reading: a state dir filled
// with files at the cap (someone else's doing) must not make a batch of
// thousands hold gigabytes at once. The names past it are left unread, for
// the caller to read one at a time; real manifests (a few KiB) never reach it.
constexpr size_t kReadBatchBudget = 32 << 20;

// One dir/<name>/<leaf>: its bytes, the errno of the call that failed, or
// what is there instead of a regular file of at most the cap.
struct FileRead {
  int err = 0;
  const char* call = "openat";
  // Not read: the batch's byte budget was spent (see kReadBatchBudget).
  bool skipped = false;
  bool refused = false;
  bool swapped = false;
  mode_t mode = 0;
  off_t size = 0;
  std::string data;
};

// Reads <name>/<leaf> under the dir fd `dirfd`. Nothing on the way is
// followed: the dir opens O_DIRECTORY|O_NOFOLLOW (ENOTDIR for a symlink or a
// file on Linux, which checks O_DIRECTORY on the link itself); the leaf is lstat'ed first (fstatat
// AT_SYMLINK_NOFOLLOW) and never opened unless it is a regular file (the
// open of a device can act on it), then opened O_NOFOLLOW|O_NONBLOCK (a
// FIFO swapped in meanwhile cannot block the thread) and fstat'ed to be the
// file lstat saw. A file that would take the batch past `budget` bytes in
// all is left unread (skipped). Both fds are closed on every path.
void ReadOne(int dirfd, const std::string& name, const std::string& leaf, size_t max, size_t budget, FileRead* out) {
  int dfd = openat(dirfd, name.c_str(), O_RDONLY | O_DIRECTORY | O_NOFOLLOW | O_CLOEXEC);
  if (dfd < 0) {
    out->err = errno;
    out->call = "opendir";
    return;
  }
  struct stat before;
  if (fstatat(dfd, leaf.c_str(), &before, AT_SYMLINK_NOFOLLOW) != 0) {
    out->err = errno;
    out->call = "lstat";
    close(dfd);
    return;
  }
  if (!S_ISREG(before.st_mode)) {
    out->refused = true;
    out->mode = before.st_mode;
    close(dfd);
    return;
  }
  int fd = openat(dfd, leaf.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_NOCTTY | O_CLOEXEC);
  int open_err = errno;
  close(dfd);
  if (fd < 0) {
    out->err = open_err;
    out->call = "open";
    return;
  }
  struct stat st;
  if (fstat(fd, &st) != 0) {
    out->err = errno;
    out->call = "fstat";
    close(fd);
    return;
  }
  out->mode = st.st_mode;
  out->size = st.st_size;
  out->swapped = st.st_dev != before.st_dev || st.st_ino != before.st_ino;
  if (!S_ISREG(st.st_mode) || out->swapped || static_cast<uint64_t>(st.st_size) > max) {
    out->refused = true;
    close(fd);
    return;
  }
  if (static_cast<size_t>(st.st_size) > budget) {
    out->skipped = true;
    close(fd);
    return;
  }
  try {
    out->data.resize(static_cast<size_t>(st.st_size));
  } catch (const std::bad_alloc&) {
    // This name's failure, not the batch's: its fd is ours to close.
    out->err = ENOMEM;
    out->call = "malloc";
    close(fd);
    return;
  }
  size_t off = 0;
  while (off < out->data.size()) {
    ssize_t n = pread(fd, &out->data[off], out->data.size() - off, static_cast<off_t>(off));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      out->err = errno;
      out->call = "read";
      break;
    }
    if (n == 0) break;  // shrunk since fstat: what is there
    off += static_cast<size_t>(n);
  }
  out->data.resize(off);
  close(fd);
}

// readFilesAt(dirFd, names, leaf, maxBytes) -> Promise of an array, one entry
// per name in order: a Buffer of <name>/<leaf>'s bytes; the Error of the call
// that failed (syscall "opendir" for <name> itself); or, for what is not a
// regular file of at most maxBytes, { mode, size, swapped }; null for a name
// left unread once the batch holds kReadBatchBudget bytes. On the threadpool:
// recovery reads thousands of manifests, seven syscalls each, before it can
// decide anything. The caller keeps dirFd open until the promise settles.
class ReadFilesWorker : public ProcWorker {
 public:
  ReadFilesWorker(Napi::Env env, int dirfd, std::vector<std::string> names, std::string leaf, size_t max)
      : ProcWorker(env, "custody:readFiles"), dirfd_(dirfd), names_(std::move(names)), leaf_(std::move(leaf)), max_(max) {}

 protected:
  int Run(const char** call) override {
    *call = "read";
    results_.resize(names_.size());
    size_t held = 0;
    for (size_t k = 0; k < names_.size(); k++) {
      ReadOne(dirfd_, names_[k], leaf_, max_, kReadBatchBudget - held, &results_[k]);
      held += results_[k].data.size();
    }
    return 0;
  }

  Napi::Value Result(Napi::Env env) override {
    Napi::Array out = Napi::Array::New(env, results_.size());
    for (uint32_t k = 0; k < results_.size(); k++) {
      FileRead& r = results_[k];
      if (r.skipped) {
        out.Set(k, env.Null());
      } else if (r.err != 0) {
        out.Set(k, ErrnoError(env, r.err, r.call).Value());
      } else if (r.refused) {
        Napi::Object o = Napi::Object::New(env);
        o.Set("mode", Napi::Number::New(env, static_cast<double>(r.mode)));
        o.Set("size", Napi::Number::New(env, static_cast<double>(r.size)));
        o.Set("swapped", Napi::Boolean::New(env, r.swapped));
        out.Set(k, o);
      } else {
        out.Set(k, Napi::Buffer<char>::Copy(env, r.data.data(), r.data.size()));
      }
      std::string().swap(r.data);
    }
    return out;
  }

 private:
  int dirfd_;
  std::vector<std::string> names_;
  std::string leaf_;
  size_t max_;
  std::vector<FileRead> results_;
};

// One path component: not empty, not . or .., no slash, no NUL, within NAME_MAX.
std::string ComponentValue(const Napi::Env& env, const Napi::Value& v, const char* what) {
  if (!v.IsString()) throw Napi::TypeError::New(env, std::string(what) + " must be a string");
  std::string s = v.As<Napi::String>().Utf8Value();
  if (s.empty() || s == "." || s == ".." || s.size() > NAME_MAX || s.find('/') != std::string::npos ||
      s.find('\0') != std::string::npos) {
    Napi::Error err = Napi::RangeError::New(env, std::string(what) + " must be one path component");
    err.Set("code", Napi::String::New(env, "ERR_INVALID_ARG_VALUE"));
    throw err;
  }
  return s;
}

Napi::Value ReadFilesAt(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  int dirfd = ArgFd(info, 0);
  if (info.Length() < 2 || !info[1].IsArray()) throw Napi::TypeError::New(env, "names must be an array");
  Napi::Array arr = info[1].As<Napi::Array>();
  if (arr.Length() > kMaxReadBatch) {
    Napi::Error err = Napi::RangeError::New(env, "names: at most 65536 in one batch");
    err.Set("code", Napi::String::New(env, "ERR_OUT_OF_RANGE"));
    throw err;
  }
  std::vector<std::string> names;
  names.reserve(arr.Length());
  for (uint32_t k = 0; k < arr.Length(); k++) names.push_back(ComponentValue(env, arr.Get(k), "name"));
  if (info.Length() < 3) throw Napi::TypeError::New(env, "leaf must be a string");
  std::string leaf = ComponentValue(env, info[2], "leaf");
  size_t max = static_cast<size_t>(ArgInteger(info, 3, "maxBytes", 0, kMaxReadBytes));
  auto* worker = new ReadFilesWorker(env, dirfd, std::move(names), std::move(leaf), max);  // deleted by N-API once done
  Napi::Promise promise = worker->Promise();
  worker->Queue();
  return promise;
}

// listProcesses(procRoot[, images]) -> Promise of a flat array, per process
//   [pid, ppid, pgrp, session, ownerUid, startTicks, state, (image, flags,) argc, ...argv]
// image (only when images were given, even none) is the index of the one of them the
// process's address-space layout equals (StatImage), or -1; flags, the
// task's flags (field 9) beside it. The result
// crosses as one flat array (no per-process objects). Nothing here is proof
// of identity; callers inspect() a candidate first.
class ScanWorker : public ProcWorker {
 public:
  ScanWorker(Napi::Env env, std::string root, bool layout, std::unordered_map<std::string, int> images)
      : ProcWorker(env, "custody:scan"), root_(std::move(root)), layout_(layout), images_(std::move(images)) {}

 protected:
  int Run(const char** call) override { return ScanProcesses(root_, layout_ ? &images_ : nullptr, &rows_, call); }

  Napi::Value Result(Napi::Env env) override {
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
      if (layout_) {
        out.Set(i++, Napi::Number::New(env, r.image));
        out.Set(i++, Napi::Number::New(env, static_cast<double>(r.flags)));
      }
      const uint32_t argc_slot = i++;
      uint32_t argc = 0;
      size_t start = 0;
      while (start < r.cmdline.size()) {
        size_t nul = r.cmdline.find('\0', start);
        if (nul == std::string::npos) nul = r.cmdline.size();
        out.Set(i++, static_cast<napi_value>(DecodeBytes(env, r.cmdline.data() + start, nul - start)));
        argc++;
        start = nul + 1;
      }
      out.Set(argc_slot, Napi::Number::New(env, argc));
    }
    return out;
  }

 private:
  std::string root_;
  bool layout_;  // images were given (even none): the two slots are in every row
  std::unordered_map<std::string, int> images_;
  std::vector<ScanRow> rows_;
};

// decodeBytes(buffer) -> string: the addon's decoding, so tests can check
// that the js backend decodes every byte string identically.
Napi::Value DecodeBytesJs(const Napi::CallbackInfo& info) {
  if (info.Length() < 1 || !info[0].IsBuffer()) throw Napi::TypeError::New(info.Env(), "bytes must be a Buffer");
  auto b = info[0].As<Napi::Buffer<char>>();
  return DecodeBytes(info.Env(), b.Data(), b.Length());
}

// matchArgv(procRoot, argv[, shard, shards]) -> Promise of the pids whose cmdline is exactly
// argv (each element bytes: a Buffer, or a string in custody's lossless
// form), compared in the worker. Argv first: one openat and one read of
// <pid>/cmdline per process, no stat, no JavaScript string per process, so
// a sweep over thousands of processes costs what a C loop over cmdline
// costs. An empty cmdline (a zombie leader whose threads live) is read from
// a live thread. Candidates are only candidates: the caller inspects each
// under a pidfd. Exhaustion ends the scan with its errno, as in
// ScanProcesses.
class MatchWorker : public ProcWorker {
 public:
  MatchWorker(Napi::Env env, std::string root, std::string want, long long shard, long long shards)
      : ProcWorker(env, "custody:match"),
        root_(std::move(root)),
        want_(std::move(want)),
        shard_(shard),
        shards_(shards) {}

 protected:
  int Run(const char** call) override { return Match(call); }

  Napi::Value Result(Napi::Env env) override {
    Napi::Array out = Napi::Array::New(env, pids_.size());
    for (uint32_t i = 0; i < pids_.size(); i++) out.Set(i, Napi::Number::New(env, static_cast<double>(pids_[i])));
    return out;
  }

 private:
  int Match(const char** call) {
    std::string cmdline;
    std::string stat_text;
    char path[sizeof(((struct dirent*)nullptr)->d_name) + 16];
    return ForEachPid(root_, call, [&](int rootfd, const char* name) -> int {
      // By pid, not by position: two shards each read the directory, and a
      // process that appears between their reads must not shift the others.
      if (shards_ > 1 && atoll(name) % shards_ != shard_) return 0;
      snprintf(path, sizeof path, "%s/cmdline", name);
      *call = "read";
      int err = ReadAt(rootfd, path, &cmdline);
      if (err == 0 && cmdline.empty() && !want_.empty()) {
        // Empty: a kernel thread, a zombie, or a zombie leader with live threads.
        int pdir = static_cast<int>(CUSTODY_RETRY_EINTR(openat(rootfd, name, O_RDONLY | O_DIRECTORY | O_CLOEXEC)));
        if (pdir == -1) {
          err = errno;
        } else {
          Fd guard(pdir);
          Stat st;
          err = ReadAt(pdir, "stat", &stat_text);
          if (err == 0 && ParseStat(stat_text, &st) && st.state == 'Z') {
            int t = LiveThreadDir(pdir, static_cast<int>(st.pid), &st.state);
            if (t < -1) err = -t;
            Fd thread(t);
            if (t >= 0) err = ReadAt(t, "cmdline", &cmdline);
          }
        }
      }
      if (err != 0) return Vanished(err) ? 0 : err;
      // A trailing NUL ends the last argument; a rewritten argv may lack it.
      if (!cmdline.empty() && cmdline.back() != '\0') cmdline.push_back('\0');
      if (cmdline == want_) pids_.push_back(atoll(name));
      return 0;
    });
  }

  std::string root_;
  std::string want_;  // the argv as cmdline bytes: each element and a NUL
  long long shard_;   // this worker reads the pids p with p % shards == shard
  long long shards_;
  std::vector<long long> pids_;
};

Napi::Value MatchArgv(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string root = info.Length() > 0 && info[0].IsString() ? info[0].As<Napi::String>().Utf8Value() : "/proc";
  if (info.Length() < 2 || !info[1].IsArray()) throw Napi::TypeError::New(env, "argv must be an array");
  Napi::Array arr = info[1].As<Napi::Array>();
  std::string want;
  for (uint32_t i = 0; i < arr.Length(); i++) {
    std::string arg = EncodeBytes(arr.Get(i), "argv");
    if (arg.find('\0') != std::string::npos) throw Napi::TypeError::New(env, "argv elements must not hold NUL");
    want += arg;
    want.push_back('\0');
  }
  // shard, shards: this call reads only the processes whose pid % shards is
  // shard, so several calls can share one scan across threadpool threads.
  long long shards = info.Length() > 3 ? ArgInteger(info, 3, "shards", 1, 64) : 1;
  long long shard = info.Length() > 2 ? ArgInteger(info, 2, "shard", 0, shards - 1) : 0;
  auto* worker = new MatchWorker(env, root, std::move(want), shard, shards);  // deleted by N-API once done
  Napi::Promise promise = worker->Promise();
  worker->Queue();
  return promise;
}

// listSessions(procRoot) -> Promise of an Int32Array [pid, session, ...]:
// every process's session, from stat alone. A tree stop looks for the
// members of its instance's session after a parent was killed (they are
// re-parented away but keep the session); one scan, off the JavaScript
// thread, serves every stop in flight.
class SessionWorker : public ProcWorker {
 public:
  SessionWorker(Napi::Env env, std::string root) : ProcWorker(env, "custody:sessions"), root_(std::move(root)) {}

 protected:
  int Run(const char** call) override {
    std::string stat_text;
    char path[sizeof(((struct dirent*)nullptr)->d_name) + 16];
    return ForEachPid(root_, call, [&](int rootfd, const char* name) -> int {
      snprintf(path, sizeof path, "%s/stat", name);
      *call = "read";
      Stat st;
      int err = ReadAt(rootfd, path, &stat_text);
      if (err == 0 && !ParseStat(stat_text, &st)) err = EPROTO;
      if (err != 0) return Vanished(err) ? 0 : err;
      pairs_.push_back(static_cast<int32_t>(st.pid));
      pairs_.push_back(static_cast<int32_t>(st.session));
      return 0;
    });
  }

  Napi::Value Result(Napi::Env env) override {
    Napi::Int32Array out = Napi::Int32Array::New(env, pairs_.size());
    if (!pairs_.empty()) memcpy(out.Data(), pairs_.data(), pairs_.size() * sizeof(int32_t));
    return out;
  }

 private:
  std::string root_;
  std::vector<int32_t> pairs_;
};

Napi::Value ListSessions(const Napi::CallbackInfo& info) {
  std::string root = info.Length() > 0 && info[0].IsString() ? info[0].As<Napi::String>().Utf8Value() : "/proc";
  auto* worker = new SessionWorker(info.Env(), root);  // deleted by N-API once done
  Napi::Promise promise = worker->Promise();
  worker->Queue();
  return promise;
}

// The most images one scan compares (a recovery asks for one per dead
// supervisor whose interrupted launches it finds: a crash-looping service
// leaves one per crash), and the longest: three 20-digit numbers and two
// colons.
constexpr uint32_t kMaxImages = 1 << 16;
constexpr size_t kMaxImageLength = 62;

Napi::Value ListProcesses(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string root = info.Length() > 0 && info[0].IsString() ? info[0].As<Napi::String>().Utf8Value() : "/proc";
  std::unordered_map<std::string, int> images;
  const bool layout = info.Length() > 1 && !info[1].IsUndefined();
  if (layout) {
    if (!info[1].IsArray()) throw Napi::TypeError::New(env, "images must be an array of strings");
    Napi::Array arr = info[1].As<Napi::Array>();
    if (arr.Length() > kMaxImages) throw Napi::RangeError::New(env, "images: at most 65536");
    for (uint32_t k = 0; k < arr.Length(); k++) {
      Napi::Value v = arr.Get(k);
      if (!v.IsString()) throw Napi::TypeError::New(env, "images must be an array of strings");
      std::string image = v.As<Napi::String>().Utf8Value();
      if (image.empty() || image.size() > kMaxImageLength ||
          image.find_first_not_of("0123456789:") != std::string::npos)
        throw Napi::RangeError::New(env, "an image is \"startcode:start_brk:startstack\" in decimal");
      images.emplace(std::move(image), static_cast<int>(k));
    }
  }
  auto* worker = new ScanWorker(env, root, layout, std::move(images));  // deleted by N-API once done
  Napi::Promise promise = worker->Promise();
  worker->Queue();
  return promise;
}

}  // namespace

Napi::String DecodeBytes(const Napi::Env& env, const char* data, size_t len) {
  const auto* p = reinterpret_cast<const unsigned char*>(data);
  uint32_t cp;
  size_t i = 0;
  while (i < len) {
    size_t n = Utf8Sequence(p + i, len - i, &cp);
    if (n == 0) break;
    i += n;
  }
  // Valid UTF-8, the common case: V8 decodes it directly.
  if (i == len) return Napi::String::New(env, data, len);
  std::u16string out;
  out.reserve(len);
  for (i = 0; i < len;) {
    size_t n = Utf8Sequence(p + i, len - i, &cp);
    if (n == 0) {
      // One undecodable byte (always >= 0x80: ASCII is always valid).
      out.push_back(static_cast<char16_t>(0xDC00 + p[i]));
      i++;
      continue;
    }
    if (cp >= 0x10000) {
      out.push_back(static_cast<char16_t>(0xD800 + ((cp - 0x10000) >> 10)));
      out.push_back(static_cast<char16_t>(0xDC00 + ((cp - 0x10000) & 0x3FF)));
    } else {
      out.push_back(static_cast<char16_t>(cp));
    }
    i += n;
  }
  return Napi::String::New(env, out.data(), out.size());
}

std::string EncodeBytes(const Napi::Value& v, const char* name) {
  Napi::Env env = v.Env();
  if (v.IsBuffer()) {
    auto b = v.As<Napi::Buffer<char>>();
    return std::string(b.Data(), b.Length());
  }
  if (!v.IsString()) throw Napi::TypeError::New(env, std::string(name) + " must hold strings or Buffers");
  // Short strings (argv words, paths) are copied into this frame with one
  // call; only a longer one pays for the length query and a heap copy. A
  // copy that fills the buffer may have been cut, so it is taken again whole.
  char16_t local[256];
  size_t len = 0;
  napi_status status = napi_get_value_string_utf16(env, v, local, sizeof local / sizeof local[0], &len);
  if (status != napi_ok) throw Napi::Error::New(env);
  std::u16string whole;
  const char16_t* u = local;
  if (len + 1 >= sizeof local / sizeof local[0]) {
    whole = v.As<Napi::String>().Utf16Value();
    u = whole.data();
    len = whole.size();
  }
  std::string out;
  out.reserve(len);
  for (size_t i = 0; i < len; i++) {
    uint32_t c = u[i];
    if (c >= 0xD800 && c <= 0xDBFF && i + 1 < len && u[i + 1] >= 0xDC00 && u[i + 1] <= 0xDFFF) {
      c = 0x10000 + ((c - 0xD800) << 10) + (u[++i] - 0xDC00);
    } else if (c >= 0xDC80 && c <= 0xDCFF) {
      // An escaped byte, back to itself.
      out.push_back(static_cast<char>(c - 0xDC00));
      continue;
    } else if (c >= 0xD800 && c <= 0xDFFF) {
      throw Napi::RangeError::New(env, std::string(name) + " holds a lone surrogate that stands for no byte");
    }
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if (c < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else if (c < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (c >> 12)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (c >> 18)));
      out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  return out;
}

void InitProc(Napi::Env env, Napi::Object exports) {
  exports.Set("parseStat", Napi::Function::New(env, ParseStatJs, "parseStat"));
  exports.Set("inspect", Napi::Function::New(env, Inspect, "inspect"));
  exports.Set("inspectPinnedMany", Napi::Function::New(env, InspectPinnedMany, "inspectPinnedMany"));
  exports.Set("readFilesAt", Napi::Function::New(env, ReadFilesAt, "readFilesAt"));
  exports.Set("readBootId", Napi::Function::New(env, ReadBootId, "readBootId"));
  exports.Set("listProcesses", Napi::Function::New(env, ListProcesses, "listProcesses"));
  exports.Set("decodeBytes", Napi::Function::New(env, DecodeBytesJs, "decodeBytes"));
  exports.Set("matchArgv", Napi::Function::New(env, MatchArgv, "matchArgv"));
  exports.Set("listSessions", Napi::Function::New(env, ListSessions, "listSessions"));
}

}  // namespace custody
