// Starting rlm-sandbox-init from a host that may be multithreaded. Everything the child needs --
// pipes, argv, envp, the fd ceiling -- is built in the parent before fork; between fork and exec
// the child makes raw syscalls only (no allocation, no locks), because another thread of the host
// may hold the malloc lock at the moment of the fork.
//
// Phases: prepare (parent, may allocate) -> exec_in_child (child, syscalls only) -> finish
// (parent). A backend that needs its own child pipeline (clone3 with namespaces) runs prepare,
// starts its own child (process/child_start.hpp), ends it with exec_in_child, and calls finish.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstddef>
#include <string>
#include <vector>

#include "host/unique_fd.hpp"

namespace rlm::supervisor {

using host::UniqueFd;

// ---- Fd hygiene between fork/clone and exec (async-signal-safe) -------------------------------
// Every fd from a first number up is closed except a short list that is to cross into the child
// (and must lose close-on-exec there).

// A request may pass this many fds to its payload (a session's channel and context, ...).
constexpr std::size_t kMaxInheritedFds = 4;
// Fds kept across the exec of init: those, plus the namespace backend's own (the error pipe,
// init's binary, two seccomp memfds, the Landlock ruleset until it is applied), or the launch
// child's failure pipe. -1 marks an unused slot.
using KeptFds = std::array<int, kMaxInheritedFds + 6>;

// Closes every fd >= `first` that is not in `keep`; `ceiling` bounds the close() loop used on
// kernels without close_range. Raw syscalls only.
void close_fds_except(unsigned first, KeptFds keep, unsigned ceiling) noexcept;

// Clears close-on-exec on every fd of `keep`; false (errno set) when one fcntl fails.
bool clear_cloexec(const KeptFds& keep) noexcept;

// Throws Error unless `fds` may be inherited by a payload: at most kMaxInheritedFds, each >= 4
// (0-3 are init's stdio and report pipe).
void check_inherit_fds(const std::vector<int>& fds);

// ---- Launching init ---------------------------------------------------------------------------

// A started init and the host's ends of its pipes (all nonblocking and close-on-exec).
struct InitProcess {
  pid_t pid = -1;
  UniqueFd pidfd;        // empty on kernels without pidfd_open; the report pipe's EOF then says
                         // init has exited
  UniqueFd stdin_pipe;   // write end of the payload's stdin
  UniqueFd stdout_pipe;  // read ends of its stdout and stderr
  UniqueFd stderr_pipe;
  UniqueFd report_pipe;  // read end of init's report (rlm_init/protocol.hpp)
  // Read end of the launch child's failure pipe (close-on-exec in the child): a
  // process::ChildFailure when the exec of init failed, EOF when it succeeded. Supervision reads
  // it once init is gone without a report. Empty for a backend with its own pipeline.
  UniqueFd start_failure;
};

// Init's stdio and report pipe take fds 0-3 in the child, so an fd that must survive there has to
// sit above them (a host with closed stdio hands out low numbers): `fd` itself when it does, else
// a close-on-exec duplicate of it. Throws std::system_error when it cannot be duplicated.
UniqueFd above_stdio(UniqueFd fd);

// A close-on-exec pipe whose ends both sit above init's stdio. Throws std::system_error.
struct Pipe {
  UniqueFd read, write;
};
Pipe make_pipe();

// The payload's three stdio pipes: the ends its side uses (stdin's read end, stdout's and
// stderr's write ends) and the host's, all close-on-exec and above init's stdio. Throws
// std::system_error.
struct StdioPipes {
  std::array<UniqueFd, 3> child, host;
};
StdioPipes make_stdio_pipes();

// Hands the host's ends of the payload's pipes to a started init's process (nonblocking there).
void attach_stdio(InitProcess& process, std::array<UniqueFd, 3> host);

// Init's own stdio (fds 0-2 in its process).
struct InitStdio {
  enum class Kind {
    pipes,  // pipes to the host, which the payload inherits (InitProcess has the host's ends)
    given,  // `fds` (Request::payload_stdio): the payload inherits them; the host has no pipes
    null,   // /dev/null: await mode, where the payload's stdio comes with its message
  };
  Kind kind = Kind::pipes;
  std::array<int, 3> fds{-1, -1, -1};  // given: the caller's, duplicated (the caller keeps its)
};

class InitLaunch {
 public:
  // Creates the pipes (or opens what `stdio` names) and the argv/envp arrays. Throws
  // std::system_error when a pipe cannot be made (out of fds).
  InitLaunch(std::string init_path, std::vector<std::string> args, std::vector<std::string> env,
             InitStdio stdio = {});

  // Fds (>= 4, at most kMaxInheritedFds) that init, and through it the payload, inherits under
  // their own numbers; the caller keeps them open until finish(). Throws Error for a bad list.
  void inherit(const std::vector<int>& fds);
  const KeptFds& inherited() const { return inherited_; }
  // An fd (>= 4) of init's own that crosses the exec beside the inherited ones (the seccomp
  // memfds init reads); the slots left after inherit() hold up to 5 of them (the last slot is the
  // failure pipe's). Throws Error when they are full.
  void keep_for_init(int fd);

  // In the started child: own process group, SIGTERM when the launching thread dies (init then
  // tears the tree down), stdio and the report pipe on fds 0-3, every other fd closed, exec init.
  // The caller has blocked every signal; init starts with them blocked and sets up its own. A
  // failing step ends the child with a process::ChildFailure on the failure pipe
  // (InitProcess::start_failure), the runtime's one record of a child that did not reach its exec.
  [[noreturn]] void exec_in_child() const noexcept;

  // For a backend with its own child pipeline: in the child, moves the pipes onto fds 0-3
  // (clearing close-on-exec there). Async-signal-safe; false with errno set when a dup2 fails.
  // Closing the other fds and exec'ing init are the caller's.
  bool install_stdio() const noexcept;
  char* const* argv() const { return argv_.data(); }
  char* const* envp() const { return envp_.data(); }
  // The close() ceiling for kernels without close_range: RLIMIT_NOFILE, at most 2^20.
  unsigned max_fd() const { return max_fd_; }

  // In the parent after fork: closes the child's ends and hands over ours. `pidfd` is one the
  // fork already made (clone's CLONE_PIDFD); without it one is opened for `pid`.
  InitProcess finish(pid_t pid, UniqueFd pidfd = {});

 private:
  std::string path_;
  std::vector<std::string> args_, env_;
  std::vector<char*> argv_, envp_;
  pid_t parent_pid_;
  unsigned max_fd_;
  KeptFds inherited_ = no_fds();
  static KeptFds no_fds() {
    KeptFds none;
    none.fill(-1);
    return none;
  }
  // Child ends (fd >= 4, so moving them onto 0-3 never overwrites one not yet moved) and ours.
  UniqueFd child_stdin_, child_stdout_, child_stderr_, child_report_, child_failure_;
  UniqueFd stdin_, stdout_, stderr_, report_, failure_;
};

// prepare + a plain child (process/child_start.hpp) that runs exec_in_child + finish. Returns the
// process, or throws std::system_error when the pipes or the fork fail.
InitProcess launch_init(std::string init_path, std::vector<std::string> args,
                        std::vector<std::string> env, const std::vector<int>& inherit_fds = {},
                        InitStdio stdio = {});

}  // namespace rlm::supervisor
