// rlm-sandbox-init's command line (see runtime/rlm_init/protocol.hpp for the contract).
#pragma once

#include <sys/resource.h>

#include <string>
#include <string_view>
#include <vector>

namespace rlm::init {

struct ResourceLimit {
  const char* name;  // "cpu", "as", ...: for messages
  int resource;      // RLIMIT_*
  rlim_t soft;
  rlim_t hard;
};

struct Options {
  int report_fd = -1;  // -1: no report, only the mirrored exit status
  int grace_ms = 200;  // SIGTERM -> SIGKILL grace when init is told to stop
  std::vector<ResourceLimit> limits;
  const char* workdir = nullptr;  // nullptr: keep the current directory
  int seccomp_fd = -1;            // memfd with the payload's BPF program; -1: none
  int seccomp_notify_fd = -1;     // its notify-mode variant; -1: none
  bool pid1 = false;              // PID 1 of a PID namespace (--pid1, or getpid() == 1)
  bool guard_signals = false;     // --guard-signals: signal_guard.hpp
  char** payload_argv = nullptr;  // null-terminated, points into main's argv (or the message)
  // Await mode (--await-payload): the socket the payload message comes on; what the message
  // carries fills the fields above and these (await_payload.hpp).
  int await_fd = -1;
  bool hold_after_report = false;               // --hold-after-report (await mode only)
  char** payload_envp = nullptr;                // nullptr: init's own environment
  int payload_stdio[3] = {-1, -1, -1};          // the payload's stdin, stdout, stderr; -1: init's
  int inherited_count = 0;                      // fds the payload inherits under their own numbers:
  int inherited_fds[4] = {-1, -1, -1, -1};      // where init holds them
  int inherited_targets[4] = {-1, -1, -1, -1};  // the numbers the payload gets them under
};

// "NAME=SOFT:HARD" or "NAME=VALUE" into `limit`. Returns "" on success, else what is wrong.
std::string parse_rlimit(std::string_view text, ResourceLimit& limit);

// Parses main's argv. Returns "" on success, else a one-line message saying what is wrong.
std::string parse_options(int argc, char** argv, Options& options);

inline constexpr const char* kUsage =
    "usage: rlm-sandbox-init [--report-fd N] [--grace-ms G] [--rlimit NAME=SOFT[:HARD]]... "
    "[--chdir DIR] [--seccomp-fd N [--seccomp-notify-fd M]] [--guard-signals] [--pid1] -- CMD "
    "[ARGS...]\n   or: rlm-sandbox-init [--report-fd N] [--grace-ms G] [--seccomp-fd N "
    "[--seccomp-notify-fd M]] [--pid1] [--hold-after-report] --await-payload FD";

}  // namespace rlm::init
