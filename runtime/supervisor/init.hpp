// rlm-sandbox-init from the host's side of its contract (rlm_init/protocol.hpp): where the binary
// is, the command line every init-launching backend builds, and what its one-line report says
// about how the run ended.
#pragma once

#include <array>
#include <chrono>
#include <string>
#include <string_view>
#include <vector>

#include "rlm_sandbox/policy.hpp"
#include "supervisor/outcome.hpp"
#include "supervisor/rlimits.hpp"

namespace rlm::supervisor {

struct Supervision;

// ---- Where it is ----------------------------------------------------------------------------

struct InitLocation {
  std::string path;                // "" when none was found
  std::vector<std::string> tried;  // every place looked, in order
  // "rlm-sandbox-init not found (looked in ...)" when path is empty.
  std::string problem() const;
  // The step that fixes a missing init.
  static std::string fix();
};

// In order: $RLM_SANDBOX_INIT (when set it is the only candidate: an explicit setting that points
// nowhere is an error, not a hint); next to the running executable; ../libexec/rlm-sandbox/ next
// to it (a relocated install); the configured install path; this build tree.
InitLocation locate_init();

// ---- Its command line -----------------------------------------------------------------------

struct InitSettings {
  std::chrono::milliseconds grace{200};
  std::vector<ResourceLimit> rlimits;
  std::string workdir;         // "" keeps the launcher's current directory
  int seccomp_fd = -1;         // a memfd with the BPF program the payload installs
  int seccomp_notify_fd = -1;  // its notify-mode variant (rlm_init/protocol.hpp)
  bool pid1 = false;           // init runs as PID 1 of a PID namespace
  bool guard_signals = false;  // --guard-signals (needs seccomp_fd)
  std::vector<std::string> payload_argv;
  // >= 0: await mode (--await-payload): init waits on this socket for its PayloadMessage, which
  // then carries what rlimits, workdir, guard_signals and payload_argv say here (all unused).
  int await_fd = -1;
  // --hold-after-report: after its report init waits for the host to close await_fd or kill it.
  bool hold_after_report = false;
};

// argv for execve: init_path, the flags, "--", the payload's argv (moved over); in await mode
// the flags and --await-payload. The report fd is always init_protocol::kReportFd.
std::vector<std::string> init_arguments(const std::string& init_path, InitSettings settings);

// ---- Await mode's payload message -------------------------------------------------------------

struct PayloadMessage {
  std::vector<std::string> argv;         // the payload's
  std::vector<std::string> environment;  // "NAME=value", the payload's whole environment
  std::string workdir;                   // "" keeps init's directory
  std::vector<ResourceLimit> rlimits;    // only ever lowered by init
  bool guard_signals = false;
  std::chrono::milliseconds grace{200};
  std::array<int, 3> stdio{-1, -1, -1};  // >= 0: the payload's stdin, stdout, stderr (sent)
  std::vector<int> inherit_fds;          // sent; the payload has them under these numbers
};

// The message's bytes (rlm_init/protocol.hpp). Throws Error for what init would refuse (no argv,
// a string holding NUL, too many strings, fds or limits, a body over the bound).
std::string encode_payload_message(const PayloadMessage& message);

// Sends `message` on `socket` (the host's end of init's await socket), its fds on the first byte,
// waiting at most until `deadline` for room. Throws Error when it cannot be sent whole (init is
// gone, the deadline passed).
void send_payload_message(int socket, const PayloadMessage& message,
                          std::chrono::steady_clock::time_point deadline);

// ---- Its report -----------------------------------------------------------------------------

struct InitReport {
  enum class Kind {
    missing,       // init wrote nothing (it was killed, or crashed)
    exited,        // value: the payload's exit code
    signaled,      // value: the signal that killed it
    exec_failed,   // value: errno of execvp(argv[0])
    setup_failed,  // value: errno of `step` ("chdir", "setrlimit") on `path`
    init_failed,   // message: init's own problem
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

// What the report's words need to know about the run besides the supervision itself.
struct RunContext {
  std::string argv0;    // the payload's command, for "cannot execute" messages
  std::string workdir;  // the directory init was told to enter ("" for none)
  std::string init_path;
  Limits limits;
  std::chrono::milliseconds wall_limit{0};
};

// `argv0` is the payload's command; `workdir` the directory init was told to enter.
RunContext run_context(const Policy& policy, std::string argv0, std::string workdir,
                       std::string init_path, std::chrono::milliseconds wall_limit);

// What supervising init saw, as a RunEnd: the runtime's stop (a stop for a group limit is left to
// the backend that asked for it), init's report, the output, and what init's wait4 counted for
// the whole tree. First rethrows what the caller's output callbacks threw (cleanup is done by
// then).
RunEnd init_run_end(Supervision supervision, const RunContext& context);

}  // namespace rlm::supervisor
