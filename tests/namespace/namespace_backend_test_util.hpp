// Shared helpers for the namespace backend's functional tests: the shipped default policy with
// roomier limits, one-call runs, a host directory bound into the sandbox, and what a run could
// leave behind in this process (fds, children, cgroups, mounts).
#pragma once

#include <fcntl.h>
#include <unistd.h>

#include <dirent.h>
#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "namespace/namespace_backend.hpp"
#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/request.hpp"
#include "rlm_sandbox/result.hpp"
#include "support/subprocess.hpp"

namespace rlm::test {

using namespace std::chrono_literals;

// The shipped default (read-only system binds, tmpfs /tmp, workdir /tmp, user 1000, no network)
// with limits that leave room for a loaded test machine.
inline Policy ns_policy() {
  Policy policy = load_policy("default");
  policy.limits.wall_time = 20s;
  policy.limits.cpu_time = 20s;
  return policy;
}

inline Result run_ns(const std::vector<std::string>& argv, const Policy& policy = ns_policy(),
                     Request request = {}) {
  request.argv = argv;
  return ns::make_namespace_backend()->run(request, policy);
}

inline Result run_sh(const std::string& script, const Policy& policy = ns_policy(),
                     Request request = {}) {
  return run_ns({"sh", "-c", script}, policy, std::move(request));
}

inline std::string describe(const Result& result) {
  return result.to_json().dump();
}

// A host directory the sandbox user can write (its host uid is 65534 under a root runtime),
// bound read-write at `target`.
inline void bind_writable(Policy& policy, const TempDir& dir, const std::string& target) {
  chmod(dir.path().c_str(), 0777);
  Mount mount;
  mount.source = dir.path();
  mount.target = target;
  mount.type = Mount::Type::bind;
  mount.readonly = false;
  policy.filesystem.mounts.push_back(mount);
}

// The host uid the sandbox user is mapped to.
inline uid_t sandbox_host_uid() {
  return geteuid() == 0 ? 65534 : geteuid();
}

inline std::size_t open_fd_count() {
  std::size_t count = 0;
  DIR* dir = opendir("/proc/self/fd");
  while (const dirent* entry = readdir(dir))
    if (entry->d_name[0] != '.') ++count;
  closedir(dir);
  return count - 1;  // the directory stream's own fd
}

// Pids of live or zombie processes whose parent is this process.
inline std::vector<pid_t> children_of_this_process() {
  std::vector<pid_t> children;
  DIR* dir = opendir("/proc");
  while (const dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (pid <= 0 || *end) continue;
    std::ifstream stat("/proc/" + std::string(entry->d_name) + "/stat");
    std::string line;
    if (!std::getline(stat, line)) continue;
    const auto paren = line.rfind(')');
    if (paren == std::string::npos || paren + 4 > line.size()) continue;
    if (std::atol(line.c_str() + paren + 4) == getpid())
      children.push_back(static_cast<pid_t>(pid));
  }
  closedir(dir);
  return children;
}

// Pids of processes whose command line contains `needle` (NULs between arguments become spaces).
inline std::vector<pid_t> processes_with_cmdline(const std::string& needle) {
  std::vector<pid_t> found;
  DIR* dir = opendir("/proc");
  while (const dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (pid <= 0 || *end) continue;
    // Plain read(2): a process exiting mid-read fails with ESRCH, which libstdc++'s filebuf
    // turns into an exception; here it is just a process that no longer matches.
    std::string cmdline;
    const int fd =
        open(("/proc/" + std::string(entry->d_name) + "/cmdline").c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    char buffer[4096];
    ssize_t count;
    while ((count = read(fd, buffer, sizeof buffer)) > 0)
      cmdline.append(buffer, static_cast<std::size_t>(count));
    close(fd);
    for (auto& c : cmdline)
      if (c == '\0') c = ' ';
    if (cmdline.find(needle) != std::string::npos) found.push_back(static_cast<pid_t>(pid));
  }
  closedir(dir);
  return found;
}

// cgroup directories this process created for its runs (their names start with "<pid>-", see
// runtime/namespace/cgroup_run_id.hpp), anywhere under /sys/fs/cgroup.
inline std::vector<std::string> own_cgroup_dirs() {
  namespace fs = std::filesystem;
  const std::string prefix = std::to_string(getpid()) + "-";
  std::vector<std::string> found;
  std::error_code error;
  fs::recursive_directory_iterator it("/sys/fs/cgroup",
                                      fs::directory_options::skip_permission_denied, error);
  for (; !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
    if (it.depth() > 4) {
      it.disable_recursion_pending();
      continue;
    }
    if (!it->is_directory(error) || it->is_symlink(error)) continue;
    if (it->path().filename().string().starts_with(prefix)) found.push_back(it->path().string());
  }
  return found;
}

inline std::string mountinfo() {
  std::ifstream in("/proc/self/mountinfo");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace rlm::test
