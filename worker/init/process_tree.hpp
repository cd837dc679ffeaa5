// Finding and signalling every descendant of init by walking /proc/<pid>/stat parent links. Works
// on kernels without /proc/<pid>/task/<tid>/children (CONFIG_PROC_CHILDREN), and in a PID
// namespace where init's own /proc shows only the sandbox.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <vector>

namespace rlm::init {

struct ProcessEntry {
  pid_t pid = 0;
  pid_t parent = 0;
  char state = '?';  // 'Z' for a zombie
};

// Every process below `root` (not root itself), parents before their children.
std::vector<ProcessEntry> find_descendants(pid_t root);

// Sends `signal` to every live descendant of `root`. Each target is pinned with a pidfd and its
// parent link re-read after pinning, so a pid recycled by an unrelated process between the scan and
// the signal is never hit. Returns how many processes were signalled.
std::size_t signal_descendants(pid_t root, int signal);

}  // namespace rlm::init
