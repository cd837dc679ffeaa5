// What a run could leave behind in this test process and on the host (fds, children, processes,
// cgroups, mounts), for tests that check a backend cleans up after itself.
#pragma once

#include <sys/types.h>

#include <cstddef>
#include <string>
#include <vector>

namespace rlm::test {

// This process's open file descriptors.
std::size_t open_fd_count();

// Pids of live or zombie processes whose parent is this process.
std::vector<pid_t> children_of_this_process();

// Pids of processes whose command line contains `needle` (NULs between arguments become spaces).
std::vector<pid_t> processes_with_cmdline(const std::string& needle);

// Pids of processes whose environment holds `needle`, e.g. "NAME=value" (NULs between the
// variables become spaces).
std::vector<pid_t> processes_with_environment(const std::string& needle);

// cgroup directories this process created for its runs (their names start with "<pid>-", see
// runtime/cgroup/run_id.hpp), anywhere under /sys/fs/cgroup.
std::vector<std::string> own_cgroup_dirs();

// This process's /proc/self/mountinfo.
std::string mountinfo();

}  // namespace rlm::test
