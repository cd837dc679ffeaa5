// rlm-sandbox-init: the small supervisor between the runtime and the payload. It makes itself a
// child subreaper, so that every process the payload leaves behind -- even a double-forked,
// setsid() daemon -- is reparented to it and can be found, killed and reaped; forwards signals;
// and reports how the payload ended on a pipe. The runtime cannot do this itself without setting
// PR_SET_CHILD_SUBREAPER on the embedding host process, which would change the host's semantics.
// Contract: worker/init/include/rlm_init/protocol.hpp.
#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/signalfd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <optional>
#include <string>
#include <utility>

#include "await_payload.hpp"
#include "guard_program.hpp"
#include "options.hpp"
#include "payload.hpp"
#include "report.hpp"
#include "rlm_init/protocol.hpp"
#include "seccomp_filter.hpp"
#include "signal_guard.hpp"
#include "supervisor.hpp"

namespace {

using rlm::init::Outcome;

// Starts from a known signal state whatever the launcher left us: every disposition default (an
// inherited SIG_IGN for SIGCHLD would make the kernel reap children behind our back), SIGPIPE
// ignored (the runtime may be gone when the report is written), and the supervised signals
// blocked for the signalfd. The runtime execs init with every signal blocked, so nothing that
// arrived before this point is lost: it is still pending.
void prepare_signals(const sigset_t& supervised) {
  sigset_t all;
  sigfillset(&all);
  sigprocmask(SIG_BLOCK, &all, nullptr);
  struct sigaction default_action {};
  default_action.sa_handler = SIG_DFL;
  for (int signal = 1; signal < NSIG; ++signal) sigaction(signal, &default_action, nullptr);
  signal(SIGPIPE, SIG_IGN);
  sigprocmask(SIG_SETMASK, &supervised, nullptr);
}

// The payload has its stdio; init keeps only stderr (for its own messages when there is no
// report). Dropping init's stdin read end means a payload that closes stdin gives the writer EPIPE,
// as in any pipeline.
void release_payload_stdio() {
  const int null_fd = open("/dev/null", O_RDWR | O_CLOEXEC);
  for (int fd : {STDIN_FILENO, STDOUT_FILENO}) {
    if (null_fd >= 0)
      dup2(null_fd, fd);
    else
      close(fd);
  }
  if (null_fd > STDERR_FILENO) close(null_fd);
}

int fail(int report_fd, const std::string& message) {
  Outcome outcome;
  outcome.kind = Outcome::Kind::init_failed;
  outcome.message = message;
  if (report_fd >= 0)
    rlm::init::write_report(report_fd, outcome);
  else
    std::fprintf(stderr, "rlm-sandbox-init: %s\n", message.c_str());
  return rlm::init::mirrored_exit_status(outcome);
}

std::string with_errno(const char* what) {
  return std::string(what) + ": " + std::strerror(errno);
}

}  // namespace

int main(int argc, char** argv) {
  const sigset_t supervised = rlm::init::supervised_signals();
  prepare_signals(supervised);

  rlm::init::Options options;
  if (auto error = rlm::init::parse_options(argc, argv, options); !error.empty())
    return fail(-1, error + "\n" + rlm::init::kUsage);
  // The report fd must not leak into the payload.
  if (options.report_fd >= 0 && fcntl(options.report_fd, F_SETFD, FD_CLOEXEC) != 0)
    return fail(-1, with_errno("--report-fd"));

  for (int fd : {options.seccomp_fd, options.seccomp_notify_fd, options.await_fd})
    if (fd >= 0 && fcntl(fd, F_SETFD, FD_CLOEXEC) != 0)
      return fail(options.report_fd, with_errno("--seccomp-fd/--await-payload"));
  // The payload's umask is the sandbox's, not the host process's: one a library caller or another
  // thread of the runtime happened to have at the fork must not reach the payload's files.
  umask(rlm::init_protocol::kPayloadUmask);
  rlm::init::Filters filters;
  if (auto error = rlm::init::load_filters(options, filters); !error.empty())
    return fail(options.report_fd, error);

  const bool pid1 = options.pid1 || getpid() == 1;
  // The payload runs as init's uid: without this it could ptrace init (were ptrace allowed) or
  // write init's memory through /proc/1/mem, and init carries no seccomp filter.
  if (pid1 && prctl(PR_SET_DUMPABLE, 0) != 0)
    return fail(options.report_fd, with_errno("prctl(PR_SET_DUMPABLE)"));
  // PID 1 of a namespace adopts every orphan already; elsewhere this makes init their reaper.
  if (prctl(PR_SET_CHILD_SUBREAPER, 1) != 0)
    return fail(options.report_fd, with_errno("prctl(PR_SET_CHILD_SUBREAPER)"));
  const int signal_fd = signalfd(-1, &supervised, SFD_CLOEXEC | SFD_NONBLOCK);
  if (signal_fd < 0) return fail(options.report_fd, with_errno("signalfd"));

  // The payload's stack (payload.hpp) is mapped before anyone asks, too.
  if (!rlm::init::prepare_payload_stack())
    return fail(options.report_fd, with_errno("mmap of the payload's stack"));
  // Await mode: everything above is done before anyone asked; the message says what to run.
  rlm::init::AwaitedPayload awaited;
  if (options.await_fd >= 0) {
    if (auto error = rlm::init::await_payload(options.await_fd, signal_fd, options, awaited);
        !error.empty())
      return fail(options.report_fd, error);
    if (options.guard_signals && options.seccomp_fd < 0)
      return fail(options.report_fd, std::string(rlm::init_protocol::kGuardSignalsFlag) +
                                         " needs " + rlm::init_protocol::kSeccompFdFlag);
  }
  std::optional<rlm::init::SignalGuard> guard;
  if (options.guard_signals) {
    const auto& base = filters.notify.empty() ? filters.kill : filters.notify;
    if (auto error = rlm::init::add_signal_guard(base, filters.guarded); !error.empty())
      return fail(options.report_fd, error);
    guard.emplace();
  }

  rlm::init::StartFailure failure;
  int listener_fd = -1;
  const pid_t payload = rlm::init::start_payload(options, filters, failure, listener_fd);
  if (payload < 0) return fail(options.report_fd, with_errno("clone of the payload"));
  release_payload_stdio();
  // The payload has its own copies: a reader of its stdout sees EOF when the payload's tree ends.
  for (int& fd : awaited.fds) close(std::exchange(fd, -1));

  rlm::init::NotifyListener listener(listener_fd);
  Outcome outcome = rlm::init::Supervisor(payload, signal_fd, options.grace_ms, listener, pid1,
                                          guard ? &*guard : nullptr, options.await_fd)
                        .run();
  if (failure.error != 0) {
    // The child's own exit status says little; the errno and the step say what went wrong.
    outcome.kind =
        failure.step == "exec" ? Outcome::Kind::exec_failed : Outcome::Kind::setup_failed;
    outcome.value = failure.error;
    outcome.step = failure.step;
    outcome.path = failure.path;
  }
  rlm::init::write_report(options.report_fd, outcome);
  if (options.hold_after_report) rlm::init::hold_until_host_leaves(options.await_fd, signal_fd);
  if (options.report_fd < 0 && failure.error != 0)
    std::fprintf(stderr, "rlm-sandbox-init: %s '%s': %s\n",
                 failure.step == "exec" ? "cannot execute" : failure.step.c_str(),
                 failure.path.c_str(), std::strerror(failure.error));
  close(signal_fd);
  return rlm::init::mirrored_exit_status(outcome);
}
