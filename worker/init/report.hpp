// The one-line JSON report init writes for the runtime (format: runtime/rlm_init/protocol.hpp).
#pragma once

#include <string>

namespace rlm::init {

struct Outcome {
  enum class Kind {
    exited,        // value: exit code
    signaled,      // value: signal number
    exec_failed,   // value: errno of execvp
    setup_failed,  // value: errno of `step` (chdir, setrlimit) before exec
    init_failed,   // message says why
  };
  Kind kind = Kind::init_failed;
  int value = 0;
  long long cpu_us = 0;     // the main payload process's own CPU time
  std::string step;         // setup_failed: "chdir", "setrlimit"
  std::string path;         // exec_failed: argv[0]; setup_failed: the directory or resource
  std::string message;      // init_failed
  bool terminated = false;  // init stopped the tree because it received SIGTERM
  bool terminated_by_payload = false;  // ... sent from inside the sandbox
  int seccomp_syscall = -1;  // a notify-mode filter denied this syscall and init killed the tree
};

// The report line, newline-terminated.
std::string format_report(const Outcome& outcome);

// Writes the report to `fd` in one write (it is far below PIPE_BUF, so it arrives whole); a reader
// that has gone away is not an error.
void write_report(int fd, const Outcome& outcome);

// Init's own exit status for this outcome: the payload's code, 128+N for signal N, 127/126 for
// exec failures like a shell, 125 when init or the setup failed.
int mirrored_exit_status(const Outcome& outcome);

}  // namespace rlm::init
