// What spawn.cc hands the child it clones (child.cc), and the child's entry.
#pragma once

#include "common.h"

namespace custody {

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
  // Written by the child on failure; read by the parent after clone returns.
  int err;
  const char* failed_call;
};

// The child's steps before exec (child.cc): execs, or reports the failed
// step into *raw and exits 127. The entry both clone paths start it at.
int ChildMain(void* raw);

}  // namespace custody
