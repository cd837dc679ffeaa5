// Shared helpers for the local backend tests: a permissive policy built in code (no policy files)
// and one-call runs.
#pragma once

#include <dirent.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <fstream>
#include <string>
#include <vector>

#include "local/local_backend.hpp"
#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/request.hpp"
#include "rlm_sandbox/result.hpp"

namespace rlm::test {

using namespace std::chrono_literals;

inline Policy local_policy() {
  Policy policy;
  policy.name = "local-test";
  policy.backend.prefer = {"local"};
  policy.backend.allow_unisolated = true;
  policy.limits.wall_time = 20s;
  policy.limits.cpu_time = 20s;
  policy.limits.memory_bytes = 1ull << 30;
  policy.filesystem.workdir = "";
  policy.env.clear = true;
  policy.env.set = {{"PATH", "/usr/local/bin:/usr/bin:/bin"}};
  return policy;
}

inline Result run_local(const std::vector<std::string>& argv, const Policy& policy = local_policy(),
                        Request request = {}) {
  request.argv = argv;
  return local::make_local_backend()->run(request, policy);
}

inline Result run_sh(const std::string& script, const Policy& policy = local_policy(),
                     Request request = {}) {
  return run_local({"sh", "-c", script}, policy, std::move(request));
}

inline std::string describe(const Result& result) {
  return result.to_json().dump();
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
    std::ifstream in("/proc/" + std::string(entry->d_name) + "/cmdline", std::ios::binary);
    std::string cmdline((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    for (auto& c : cmdline)
      if (c == '\0') c = ' ';
    if (cmdline.find(needle) != std::string::npos) found.push_back(static_cast<pid_t>(pid));
  }
  closedir(dir);
  return found;
}

}  // namespace rlm::test
