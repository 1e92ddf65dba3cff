// The /proc primitives every reader shares: a whole-file read, the stat
// parser (and parseStat, its test hook), the live thread of a zombie leader,
// and the split of a cmdline into argv words.
#include "procfs.h"

#include <dirent.h>

#include <cstdlib>
#include <memory>

namespace custody {

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

uint32_t AppendArgv(const Napi::Env& env, Napi::Array out, uint32_t i, const std::string& cmdline) {
  uint32_t words = 0;
  size_t start = 0;
  while (start < cmdline.size()) {
    size_t nul = cmdline.find('\0', start);
    if (nul == std::string::npos) nul = cmdline.size();
    // As a napi_value: Set() would otherwise take the implicit std::string
    // conversion, re-encoding escaped bytes to U+FFFD.
    out.Set(i + words++, static_cast<napi_value>(DecodeBytes(env, cmdline.data() + start, nul - start)));
    start = nul + 1;
  }
  return words;
}

std::string ProcRootArg(const Napi::CallbackInfo& info, size_t i) {
  return info.Length() > i && info[i].IsString() ? info[i].As<Napi::String>().Utf8Value() : "/proc";
}

namespace {

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

Napi::Value ParseStatJs(const Napi::CallbackInfo& info) {
  Napi::Env env = info.Env();
  if (info.Length() < 1 || !info[0].IsString()) throw Napi::TypeError::New(env, "text must be a string");
  Stat st;
  if (!ParseStat(info[0].As<Napi::String>().Utf8Value(), &st)) return env.Null();
  return StatToObject(env, st);
}

}  // namespace

void InitProcfs(Napi::Env env, Napi::Object exports) {
  exports.Set("parseStat", Napi::Function::New(env, ParseStatJs, "parseStat"));
}

}  // namespace custody
