// Process-table scans on the threadpool: every process's stat and argv
// (listProcesses), the pids whose argv is exactly one (matchArgv), every
// process's session (listSessions). One readdir loop serves them all;
// nothing here is proof of identity (callers inspect a candidate first).
#include "procfs.h"

#include <dirent.h>
#include <sys/stat.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <unordered_map>
#include <vector>

namespace custody {

namespace {

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
      uint32_t argc = AppendArgv(env, out, i, r.cmdline);
      i += argc;
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
  std::string root = ProcRootArg(info, 0);
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
  return QueueJob(new MatchWorker(env, root, std::move(want), shard, shards));
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
  std::string root = ProcRootArg(info, 0);
  return QueueJob(new SessionWorker(info.Env(), root));
}

// The most images one scan compares (a recovery asks for one per dead
// supervisor whose interrupted launches it finds: a crash-looping service
// leaves one per crash), and the longest: three 20-digit numbers and two
// colons.
constexpr uint32_t kMaxImages = 1 << 16;
constexpr size_t kMaxImageLength = 62;

Napi::Value ListProcesses(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  std::string root = ProcRootArg(info, 0);
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
  return QueueJob(new ScanWorker(env, root, layout, std::move(images)));
}

}  // namespace

void InitScan(Napi::Env env, Napi::Object exports) {
  exports.Set("listProcesses", Napi::Function::New(env, ListProcesses, "listProcesses"));
  exports.Set("matchArgv", Napi::Function::New(env, MatchArgv, "matchArgv"));
  exports.Set("listSessions", Napi::Function::New(env, ListSessions, "listSessions"));
}

}  // namespace custody
