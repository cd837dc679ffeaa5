#include "payload.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <unistd.h>

#include <cerrno>

namespace rlm::init {
namespace {

enum class Step : int { exec, chdir, setrlimit };

// What the child sends back over the CLOEXEC pipe when it fails before (or at) exec.
struct ChildError {
  Step step;
  int error;
  int limit_index;
};

// The limits as the child will apply them: never above the current hard limit, since lowering is
// all init may do (raising a hard limit needs privilege and is not the policy's intent anyway).
std::vector<ResourceLimit> clamp_limits(const std::vector<ResourceLimit>& requested) {
  std::vector<ResourceLimit> clamped = requested;
  for (auto& limit : clamped) {
    rlimit current{};
    if (getrlimit(limit.resource, &current) != 0) continue;
    if (current.rlim_max != RLIM_INFINITY) {
      if (limit.hard == RLIM_INFINITY || limit.hard > current.rlim_max)
        limit.hard = current.rlim_max;
      if (limit.soft == RLIM_INFINITY || limit.soft > limit.hard) limit.soft = limit.hard;
    }
  }
  return clamped;
}

[[noreturn]] void fail_in_child(int error_fd, Step step, int error, int limit_index = -1) {
  const ChildError message{step, error, limit_index};
  while (write(error_fd, &message, sizeof message) < 0 && errno == EINTR) {
  }
  _exit(step == Step::exec ? (error == ENOENT ? 127 : 126) : 125);
}

// Runs in the forked child: init is single-threaded, but this still only makes syscalls.
[[noreturn]] void apply_in_child(const Options& options, const std::vector<ResourceLimit>& limits,
                                 pid_t init_pid, int error_fd) {
  // Init ignores SIGPIPE for itself; the payload gets the default, like any program.
  signal(SIGPIPE, SIG_DFL);
  // If init dies without tearing the tree down (it was SIGKILLed), the payload goes with it.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != init_pid) _exit(125);
  for (std::size_t i = 0; i < limits.size(); ++i) {
    const rlimit value{limits[i].soft, limits[i].hard};
    if (setrlimit(limits[i].resource, &value) != 0)
      fail_in_child(error_fd, Step::setrlimit, errno, static_cast<int>(i));
  }
  if (options.workdir && chdir(options.workdir) != 0) fail_in_child(error_fd, Step::chdir, errno);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execvp(options.payload_argv[0], options.payload_argv);
  fail_in_child(error_fd, Step::exec, errno);
}

}  // namespace

pid_t start_payload(const Options& options, StartFailure& failure) {
  const auto limits = clamp_limits(options.limits);
  int error_pipe[2];
  if (pipe2(error_pipe, O_CLOEXEC) != 0) return -1;
  const pid_t init_pid = getpid();
  const pid_t pid = fork();
  if (pid == 0) {
    close(error_pipe[0]);
    apply_in_child(options, limits, init_pid, error_pipe[1]);
  }
  const int fork_error = errno;
  close(error_pipe[1]);
  if (pid > 0) {
    // EOF: the exec succeeded (the pipe closed on exec). A record: the child failed and exits.
    ChildError message{};
    ssize_t length;
    while ((length = read(error_pipe[0], &message, sizeof message)) < 0 && errno == EINTR) {
    }
    if (length == static_cast<ssize_t>(sizeof message)) {
      failure.error = message.error;
      switch (message.step) {
        case Step::exec:
          failure.step = "exec";
          failure.path = options.payload_argv[0];
          break;
        case Step::chdir:
          failure.step = "chdir";
          failure.path = options.workdir ? options.workdir : "";
          break;
        case Step::setrlimit:
          failure.step = "setrlimit";
          failure.path = limits.at(static_cast<std::size_t>(message.limit_index)).name;
          break;
      }
    }
  }
  close(error_pipe[0]);
  errno = fork_error;
  return pid;
}

}  // namespace rlm::init
