// What the /proc readers (identity.cc, scan.cc) and the threadpool batches
// (those two and statedir.cc) share: an owned fd, a whole-file read, the stat
// line, the zombie leader's live thread, the argv words of a cmdline, and
// the promise-settling job.
#pragma once

#include "common.h"

#include <fcntl.h>
#include <unistd.h>

#include <new>
#include <string>

namespace custody {

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
int ReadAt(int dirfd, const char* name, std::string* out);

// Errors that mean "this process is gone", as opposed to "the kernel could
// not answer" (EMFILE, ENFILE, ENOMEM, EIO...), which must never be read as
// an answer: a scan that skipped what it could not open would report a live
// process as absent.
inline bool Vanished(int err) { return err == ENOENT || err == ESRCH; }

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
// Returns false on text that does not have that shape.
bool ParseStat(const std::string& text, Stat* out);

// A dir fd on a live thread of a zombie thread-group leader (the caller
// closes it) with that thread's state, -1 when no thread lives, or -errno.
int LiveThreadDir(int piddir, int pid, char* state);

// Sets out[i], out[i + 1]... to the NUL-separated words of a cmdline (a
// last word without its NUL too), each decoded losslessly; returns how many.
uint32_t AppendArgv(const Napi::Env& env, Napi::Array out, uint32_t i, const std::string& cmdline);

// A job on the libuv threadpool that reads /proc (or a state dir) and settles
// a promise: the scan of thousands of processes takes tens of milliseconds of
// kernel time, which the event loop must not wait for. Run() returns 0 or an
// errno (and names the call that failed); an allocation failure is ENOMEM,
// never a crash; Result() builds the value on the JavaScript thread.
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

// Queues a job made with new (N-API deletes it once done) and returns its promise.
inline Napi::Promise QueueJob(ProcWorker* worker) {
  Napi::Promise promise = worker->Promise();
  worker->Queue();
  return promise;
}

// The proc root argument i names when it is a string, else /proc.
std::string ProcRootArg(const Napi::CallbackInfo& info, size_t i);

}  // namespace custody
