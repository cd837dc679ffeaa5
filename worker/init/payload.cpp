#include "payload.hpp"

#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <sys/ioctl.h>
#include <sys/mman.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <unistd.h>

#include <cerrno>

extern char** environ;

namespace rlm::init {
namespace {

// The child runs on a stack of its own inside init's memory, which AddressSanitizer does not
// know: instrumented code there treats a call of a noreturn function (_exit on a failed step) as
// leaving init's stack and aborts. The child's own functions are left uninstrumented; what they
// call (the filter's install) has no noreturn call in it.
#if defined(__SANITIZE_ADDRESS__)
#define RLM_PAYLOAD_CHILD __attribute__((no_sanitize_address))
#else
#define RLM_PAYLOAD_CHILD
#endif

enum class Step : int { exec, chdir, setrlimit, seccomp, guard, fds };

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

[[noreturn]] RLM_PAYLOAD_CHILD void fail_in_child(int error_fd, Step step, int error,
                                                  int limit_index = -1) {
  const ChildError message{step, error, limit_index};
  while (write(error_fd, &message, sizeof message) < 0 && errno == EINTR) {
  }
  _exit(step == Step::exec ? (error == ENOENT ? 127 : 126) : 125);
}

// In the payload's child, await mode: the payload's stdio and inherited fds onto their numbers.
// First every source, and the two fds the child still needs, move above every number in play, so
// that no dup2 overwrites a source not yet placed; the moved copies are close-on-exec. False
// (errno set) when an fcntl or dup2 fails. Syscalls only.
RLM_PAYLOAD_CHILD bool place_fds(const Options& options, int& error_fd, int& listener_socket) {
  const int count = options.inherited_count;
  const bool stdio = options.payload_stdio[0] >= 0;
  if (!stdio && count == 0) return true;
  int sources[7], targets[7], used = 0;
  for (int i = 0; stdio && i < 3; ++i) {
    sources[used] = options.payload_stdio[i];
    targets[used++] = i;
  }
  for (int i = 0; i < count && i < 4; ++i) {
    sources[used] = options.inherited_fds[i];
    targets[used++] = options.inherited_targets[i];
  }
  int ceiling = error_fd > listener_socket ? error_fd : listener_socket;
  for (int i = 0; i < used; ++i) {
    if (sources[i] > ceiling) ceiling = sources[i];
    if (targets[i] > ceiling) ceiling = targets[i];
  }
  const auto lift = [ceiling](int& fd) {
    if (fd < 0) return true;
    const int moved = fcntl(fd, F_DUPFD_CLOEXEC, ceiling + 1);
    if (moved < 0) return false;
    fd = moved;
    return true;
  };
  if (!lift(error_fd) || !lift(listener_socket)) return false;
  for (int i = 0; i < used; ++i)
    if (!lift(sources[i])) return false;
  for (int i = 0; i < used; ++i)  // dup2 clears close-on-exec on the target
    if (dup2(sources[i], targets[i]) < 0) return false;
  return true;
}

// Runs in the payload's child, in init's memory until its exec: only syscalls, no allocation.
[[noreturn]] RLM_PAYLOAD_CHILD void apply_in_child(const Options& options,
                                                   const std::vector<ResourceLimit>& limits,
                                                   const Filters& filters, pid_t init_pid,
                                                   int error_fd, int listener_socket) {
  // Init ignores SIGPIPE for itself; the payload gets the default, like any program.
  signal(SIGPIPE, SIG_DFL);
  // If init dies without tearing the tree down (it was SIGKILLed), the payload goes with it.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != init_pid) _exit(125);
  // Before the limits: RLIMIT_NOFILE may be below an inherited fd's number.
  if (!place_fds(options, error_fd, listener_socket)) fail_in_child(error_fd, Step::fds, errno);
  // A terminal as stdin (`run -t`): the payload leads a session of its own with it as its
  // controlling terminal, so the terminal's job control (Ctrl-C, Ctrl-Z, a resize) reaches it.
  // Best effort: without it the payload still reads and writes the terminal.
  if (isatty(STDIN_FILENO) && setsid() >= 0) ioctl(STDIN_FILENO, TIOCSCTTY, 0);
  for (std::size_t i = 0; i < limits.size(); ++i) {
    const rlimit value{limits[i].soft, limits[i].hard};
    if (setrlimit(limits[i].resource, &value) != 0)
      fail_in_child(error_fd, Step::setrlimit, errno, static_cast<int>(i));
  }
  if (options.workdir && chdir(options.workdir) != 0) fail_in_child(error_fd, Step::chdir, errno);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  // Last: the filter may deny what the steps above need; only sendmsg and execve follow it.
  if (const int error = install_in_child(filters, listener_socket); error != 0)
    fail_in_child(error_fd, filters.guarded.empty() ? Step::seccomp : Step::guard, error);
  // Await mode: the message's environment, also for execvp's PATH search (init's own is put back
  // once the child has exec'd: the child shares init's memory until then).
  if (options.payload_envp) environ = options.payload_envp;
  execvp(options.payload_argv[0], options.payload_argv);
  fail_in_child(error_fd, Step::exec, errno);
}

// What the child needs, on init's stack (the child shares init's memory until its exec).
struct ChildStart {
  const Options* options;
  const std::vector<ResourceLimit>* limits;
  const Filters* filters;
  pid_t init_pid;
  int* error_pipe;     // [read, write]
  int* listener_pair;  // [init's end, the child's end], -1 when none
};

RLM_PAYLOAD_CHILD int run_child(void* argument) {
  const ChildStart& start = *static_cast<const ChildStart*>(argument);
  close(start.error_pipe[0]);
  if (start.listener_pair[0] >= 0) close(start.listener_pair[0]);
  apply_in_child(*start.options, *start.limits, *start.filters, start.init_pid, start.error_pipe[1],
                 start.listener_pair[1]);
}

// 4 MiB, reserved but only touched as used: the deepest the child goes is glibc's execvp falling
// back to /bin/sh for a script, which puts argv on the stack (at most kPayloadMaxStrings pointers,
// 2 MiB).
constexpr std::size_t kPayloadStack = 4u << 20;

char* payload_stack() {
  static char* top = []() -> char* {
    const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
    void* base = mmap(nullptr, kPayloadStack + page, PROT_READ | PROT_WRITE,
                      MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
    if (base == MAP_FAILED) return nullptr;
    if (mprotect(base, page, PROT_NONE) != 0) {  // the guard, below the stack
      munmap(base, kPayloadStack + page);
      return nullptr;
    }
    return static_cast<char*>(base) + page + kPayloadStack;
  }();
  return top;
}

}  // namespace

bool prepare_payload_stack() {
  return payload_stack() != nullptr;
}

pid_t start_payload(const Options& options, const Filters& filters, StartFailure& failure,
                    int& listener) {
  listener = -1;
  const auto limits = clamp_limits(options.limits);
  char* const stack_top = payload_stack();
  if (!stack_top) return -1;
  int error_pipe[2];
  if (pipe2(error_pipe, O_CLOEXEC) != 0) return -1;
  // The child hands the notify listener over on this (close-on-exec, so EOF once it exec'd).
  int listener_pair[2] = {-1, -1};
  if ((!filters.notify.empty() || !filters.guarded.empty()) &&
      socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, listener_pair) != 0) {
    const int error = errno;
    close(error_pipe[0]);
    close(error_pipe[1]);
    errno = error;
    return -1;
  }
  ChildStart start{&options, &limits, &filters, getpid(), error_pipe, listener_pair};
  // The child runs in init's memory until it execs, and init waits for that (CLONE_VFORK): no
  // page tables copied, no copy-on-write faults on either side afterwards. It writes only its
  // own stack, errno and `environ` (restored below); everything else it does is syscalls on its
  // own fd table, limits and credentials.
  char** const own_environment = environ;
  const pid_t pid = clone(run_child, stack_top, CLONE_VM | CLONE_VFORK | SIGCHLD, &start);
  const int clone_error = pid < 0 ? errno : 0;
  environ = own_environment;
  close(error_pipe[1]);
  if (listener_pair[1] >= 0) close(listener_pair[1]);
  if (pid > 0 && listener_pair[0] >= 0) listener = receive_listener(listener_pair[0]);
  if (listener_pair[0] >= 0) close(listener_pair[0]);
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
        case Step::seccomp:
          failure.step = "seccomp";
          failure.path = "the payload's filter";
          break;
        case Step::fds:
          failure.step = "fds";
          failure.path = "the payload's stdio and inherited fds";
          break;
        case Step::guard:
          failure.step = "guard";
          failure.path = "the signal guard's seccomp listener";
          break;
      }
    }
  }
  close(error_pipe[0]);
  errno = clone_error;
  return pid;
}

}  // namespace rlm::init
