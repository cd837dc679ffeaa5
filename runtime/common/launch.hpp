// Starting rlm-sandbox-init from a host that may be multithreaded. Everything the child needs --
// pipes, argv, envp, the fd ceiling -- is built in the parent before fork; between fork and exec
// the child makes raw syscalls only (no allocation, no locks), because another thread of the host
// may hold the malloc lock at the moment of the fork.
//
// Phases: prepare (parent, may allocate) -> exec_in_child (child, syscalls only) -> finish
// (parent). A backend that needs its own child pipeline (clone3 with namespaces) runs prepare, its
// own clone, ends the child with exec_in_child, and calls finish.
#pragma once

#include <sys/types.h>

#include <string>
#include <vector>

#include "common/fd_inherit.hpp"
#include "common/unique_fd.hpp"

namespace rlm::common {

// A started init and the host's ends of its pipes (all nonblocking and close-on-exec).
struct InitProcess {
  pid_t pid = -1;
  UniqueFd pidfd;        // empty on kernels without pidfd_open; the report pipe's EOF then says
                         // init has exited
  UniqueFd stdin_pipe;   // write end of the payload's stdin
  UniqueFd stdout_pipe;  // read ends of its stdout and stderr
  UniqueFd stderr_pipe;
  UniqueFd report_pipe;  // read end of init's report (rlm_init/protocol.hpp)
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

class InitLaunch {
 public:
  // Creates the pipes and the argv/envp arrays. Throws std::system_error when a pipe cannot be
  // made (out of fds).
  InitLaunch(std::string init_path, std::vector<std::string> args, std::vector<std::string> env);

  // Fds (>= 4, at most kMaxInheritedFds) that init, and through it the payload, inherits under
  // their own numbers; the caller keeps them open until finish(). Throws Error for a bad list.
  void inherit(const std::vector<int>& fds);
  const KeptFds& inherited() const { return inherited_; }

  // In the forked child: own process group, SIGTERM when the launching thread dies (init then
  // tears the tree down), stdio and the report pipe on fds 0-3, every other fd closed, exec init.
  // The caller has blocked every signal; init starts with them blocked and sets up its own.
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
  UniqueFd child_stdin_, child_stdout_, child_stderr_, child_report_;
  UniqueFd stdin_, stdout_, stderr_, report_;
};

// prepare + fork (every signal blocked around it) + exec_in_child + finish. Returns the process,
// or throws std::system_error when the pipes or the fork fail.
InitProcess launch_init(std::string init_path, std::vector<std::string> args,
                        std::vector<std::string> env, const std::vector<int>& inherit_fds = {});

}  // namespace rlm::common
