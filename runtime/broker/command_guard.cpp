// spawn_guarded_shell: the guard process of a command: LM call (command_guard.hpp). The guard
// and the shell are plain children (process/child_start.hpp): the guard runs in a copy of a
// multithreaded process, so async-signal-safe calls only, no allocation, no locks; what needs
// memory is prepared in the parent.
#include "broker/command_guard.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>

#include "process/child_start.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"

extern char** environ;

namespace rlm::broker {
namespace {

// The guard could not set itself up (the host died first, the shell could not be forked): as
// posix_spawn's child would say for a shell that cannot run.
constexpr int kCannotRun = 127;
// Rounds of "kill every child, reap one" before the guard gives up on a tree that keeps
// producing processes faster than they die.
constexpr int kMaxReapRounds = 100'000;

// Everything the guard and the shell need, prepared before fork.
struct Plan {
  pid_t host = 0;
  int input = -1, output = -1, errors = -1;
  char* const* argv = nullptr;
};

// SIGKILLs each pid in /proc/thread-self/children: the guard's children, whose pids stay theirs
// until the guard reaps them. False when the list cannot be read.
bool kill_children() noexcept {
  const int fd = open("/proc/thread-self/children", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buffer[512];
  pid_t pid = 0;
  ssize_t got;
  while ((got = read(fd, buffer, sizeof buffer)) > 0 || (got < 0 && errno == EINTR)) {
    for (ssize_t i = 0; i < got; ++i) {
      if (buffer[i] >= '0' && buffer[i] <= '9') {
        pid = pid * 10 + (buffer[i] - '0');
      } else {
        if (pid > 0) kill(pid, SIGKILL);
        pid = 0;
      }
    }
  }
  if (pid > 0) kill(pid, SIGKILL);
  close(fd);
  return got == 0;
}

// Kills the shell's group and everything left below the guard, reaps it all; returns the
// shell's wait status (or a SIGKILL status when it was not seen).
int kill_tree(pid_t shell) noexcept {
  // The shell is not reaped yet, so its pid, and the id of the group it leads, are still its own.
  kill(-shell, SIGKILL);
  kill(shell, SIGKILL);
  int shell_status = SIGKILL;  // as WTERMSIG: killed by SIGKILL
  for (int round = 0; round < kMaxReapRounds; ++round) {
    // Orphans of the killed come to the guard (the subreaper): kill what is there, reap one.
    const bool listed = kill_children();
    int status = 0;
    const pid_t pid = waitpid(-1, &status, listed ? 0 : WNOHANG);
    if (pid == shell) shell_status = status;
    if (pid < 0 && errno == EINTR) continue;
    if (pid <= 0) break;  // ECHILD: nothing left (or, without the list, nothing exited yet)
  }
  return shell_status;
}

// Ends the guard as the shell ended: the same exit code, or the same signal.
[[noreturn]] void exit_like(int status) noexcept {
  if (WIFEXITED(status)) _exit(WEXITSTATUS(status));
  const int signal = WTERMSIG(status);
  const rlimit no_core{0, 0};
  setrlimit(RLIMIT_CORE, &no_core);
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigaction(signal, &default_action, nullptr);
  kill(getpid(), signal);
  sigset_t just_it;
  sigemptyset(&just_it);
  sigaddset(&just_it, signal);
  sigprocmask(SIG_UNBLOCK, &just_it, nullptr);
  _exit(128 + signal);  // a signal whose default is not to end a process
}

[[noreturn]] void exec_shell(const Plan& plan, pid_t guard) noexcept {
  // Its own process group, as before the guard: the host's terminal signals do not reach it.
  setpgid(0, 0);
  // Should the guard itself be SIGKILLed, the shell goes with it.
  prctl(PR_SET_PDEATHSIG, SIGKILL);
  if (getppid() != guard) _exit(kCannotRun);
  // Every source is 3 or more, so none is overwritten before it has been moved.
  if (dup2(plan.input, STDIN_FILENO) < 0 || dup2(plan.output, STDOUT_FILENO) < 0 ||
      dup2(plan.errors, STDERR_FILENO) < 0)
    _exit(kCannotRun);
  close_range(3, ~0u, 0);
  // A clean signal state: what the host ignores or blocks (SIGPIPE, often) is not so here.
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  for (int signal = 1; signal < NSIG; ++signal) sigaction(signal, &default_action, nullptr);
  sigset_t none;
  sigemptyset(&none);
  sigprocmask(SIG_SETMASK, &none, nullptr);
  execve("/bin/sh", plan.argv, environ);
  _exit(kCannotRun);
}

// The guard: every signal is blocked from its first instruction (the parent forked with all
// blocked), so a SIGTERM sent early waits for sigwaitinfo.
[[noreturn]] void run_guard(const Plan& plan) noexcept {
  // Children are reaped here, whatever the host did with SIGCHLD (SIG_IGN would reap them
  // unseen).
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  sigaction(SIGCHLD, &default_action, nullptr);
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != plan.host) _exit(kCannotRun);  // the host died before this line
  prctl(PR_SET_CHILD_SUBREAPER, 1);
  const pid_t guard = getpid();
  const pid_t shell = process::start_child({}, [&plan, guard] { exec_shell(plan, guard); }).pid;
  // The guard holds no fd: not the host's, nor the command's pipes (their EOF is the host's sign
  // that the command is done).
  close_range(0, ~0u, 0);
  if (shell < 0) _exit(kCannotRun);

  sigset_t wanted;
  sigemptyset(&wanted);
  for (int signal : {SIGCHLD, SIGTERM, SIGHUP, SIGINT, SIGQUIT}) sigaddset(&wanted, signal);
  for (;;) {
    const int signal = sigwaitinfo(&wanted, nullptr);
    if (signal < 0) continue;  // EINTR
    if (signal != SIGCHLD) {
      kill_tree(shell);
      kill(guard, SIGKILL);  // told to stop: ends as killed, whatever the shell did
      _exit(128 + SIGKILL);
    }
    // Has the shell exited? Looked at without reaping it, so its group id stays its own.
    siginfo_t info{};
    if (waitid(P_PID, static_cast<id_t>(shell), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
        info.si_pid == shell)
      exit_like(kill_tree(shell));
    // An orphan that exited: reaped, one by one, never the shell.
    for (;;) {
      info = {};
      if (waitid(P_ALL, 0, &info, WEXITED | WNOHANG | WNOWAIT) != 0 || info.si_pid == 0 ||
          info.si_pid == shell)
        break;
      waitpid(info.si_pid, nullptr, 0);
    }
  }
}

}  // namespace

pid_t spawn_guarded_shell(const std::string& command, int input, int output, int errors) {
  std::string shell = "/bin/sh", flag = "-c", script = command;
  char* argv[] = {shell.data(), flag.data(), script.data(), nullptr};
  const Plan plan{getpid(), input, output, errors, argv};

  const auto guard = process::start_child({}, [&plan] { run_guard(plan); });
  if (guard.pid < 0) throw Error("fork (LM command): " + sys::errno_text(guard.error));
  return guard.pid;
}

}  // namespace rlm::broker
