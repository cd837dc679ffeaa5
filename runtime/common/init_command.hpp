// rlm-sandbox-init's command line, built from what a backend wants enforced.
#pragma once

#include <chrono>
#include <string>
#include <vector>

namespace rlm::common {

struct InitSettings {
  std::chrono::milliseconds grace{200};
  std::vector<std::string> rlimits;  // "cpu=2:3", "as=268435456", ...
  std::string workdir;               // "" keeps the launcher's current directory
  int seccomp_fd = -1;               // a memfd with the BPF program the payload installs
  int seccomp_notify_fd = -1;        // its notify-mode variant (rlm_init/protocol.hpp)
  bool pid1 = false;                 // init runs as PID 1 of a PID namespace
  bool guard_signals = false;        // --guard-signals (needs seccomp_fd)
  std::vector<std::string> payload_argv;
};

// argv for execve: init_path, the flags, "--", the payload's argv (moved over). The report fd is
// always init_protocol::kReportFd.
std::vector<std::string> init_arguments(const std::string& init_path, InitSettings settings);

}  // namespace rlm::common
