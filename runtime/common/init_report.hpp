// Reading rlm-sandbox-init's one-line report (format: rlm_init/protocol.hpp).
#pragma once

#include <chrono>
#include <string>
#include <string_view>

namespace rlm::common {

struct InitReport {
  enum class Kind {
    missing,           // init wrote nothing (it was killed, or crashed)
    exited,            // value: the payload's exit code
    signaled,          // value: the signal that killed it
    exec_failed,       // value: errno of execvp(argv[0])
    setup_failed,      // value: errno of `step` ("chdir", "setrlimit") on `path`
    init_failed,       // message: init's own problem
    init_exec_failed,  // value: errno of execve(rlm-sandbox-init)
  };
  Kind kind = Kind::missing;
  int value = 0;
  std::chrono::microseconds cpu{0};  // the payload's main process
  std::string step, path, message;
  bool terminated = false;             // init stopped the tree on a SIGTERM
  bool terminated_by_payload = false;  // ... which came from inside the sandbox
  int seccomp_syscall =
      -1;  // a notify-mode seccomp filter caught this syscall; init killed the tree
};

// Anything unparsable counts as missing.
InitReport parse_init_report(std::string_view text);

}  // namespace rlm::common
