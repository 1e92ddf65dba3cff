// State files read in batches on the threadpool (readFilesAt): recovery
// reads thousands of manifests before it can decide anything. Nothing on the
// way to a file is followed, and nothing but a regular file is opened.
#include "procfs.h"

#include <sys/stat.h>

#include <climits>
#include <vector>

namespace custody {

namespace {

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
  return QueueJob(new ReadFilesWorker(env, dirfd, std::move(names), std::move(leaf), max));
}

}  // namespace

void InitStateDir(Napi::Env env, Napi::Object exports) {
  exports.Set("readFilesAt", Napi::Function::New(env, ReadFilesAt, "readFilesAt"));
}

}  // namespace custody
