// What spawn.cc hands the child it clones (child.cc), and the child's entry.
#pragma once

#include <sys/types.h>

#include <cstdint>

#include "common.h"

namespace custody {

// One RLIMIT_* for prlimit64: struct rlimit64 of the uapi, whose
// RLIM64_INFINITY is ~0ULL on every architecture.
struct ChildRlimit {
  int resource;
  uint64_t soft;
  uint64_t hard;
};

// The most rlimits one spawn sets: RLIM_NLIMITS is 16 on every architecture.
constexpr int kMaxChildRlimits = 16;

// The exec attributes (LaunchSpec.runAs, rlimits, oomScoreAdj, umask,
// noNewPrivileges), decoded and range-checked by the parent; the child
// applies each that is set, in ApplyExecAttrs's order (child.cc).
struct ChildExecAttrs {
  int rlimit_count;
  ChildRlimit rlimits[kMaxChildRlimits];
  // oom_score_adj as the text written to /proc/self/oom_score_adj ("-1000"),
  // formatted by the parent: the child calls nothing that formats.
  bool set_oom_score_adj;
  char oom_score_adj[8];
  size_t oom_score_adj_len;
  int umask;  // -1: inherit
  bool no_new_privs;
  bool run_as;
  uid_t uid;
  gid_t gid;
  const gid_t* groups;  // setgroups' list, groups_count long (may be empty)
  size_t groups_count;
};

// Filled by the parent before clone; the child reads it, rewrites stdio, and
// writes err and failed_call when a step fails.
struct ChildArgs {
  const char* file;
  char* const* argv;
  char* const* envp;
  const char* cwd;  // nullptr: inherit
  int stdio[3];     // fd to become 0, 1, 2
  bool new_session;
  bool new_group;
  // cgroup.procs of the cgroup to start in (opened O_WRONLY by the parent),
  // or -1 to stay in ours.
  int cgroup_procs;
  // Non-zero when cloned with CLONE_FILES: the child's first act on the
  // shared fd table is to take a private copy of only the fds below this.
  unsigned int keep_below;
  // Cloned with CLONE_CLEAR_SIGHAND: the kernel has already put every
  // handled signal back to SIG_DFL, so no real-time signal needs a look.
  bool handlers_cleared;
  // nullptr: no exec attribute to apply (the common spawn).
  const ChildExecAttrs* exec_attrs;
  // Written by the child on failure; read by the parent after clone returns.
  // failed_path: the file the failed call was about, where it is not obvious.
  int err;
  const char* failed_call;
  const char* failed_path;
};

// The child's steps before exec (child.cc): execs, or reports the failed
// step into *raw and exits 127. The entry both clone paths start it at.
int ChildMain(void* raw);

}  // namespace custody
