#include "supervisor/supervise.hpp"

#include <poll.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <optional>
#include <vector>

#include "supervisor/payload_io.hpp"

namespace rlm::supervisor {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::size_t kChunkBytes = 64 * 1024;
constexpr std::size_t kReportLimit = 4096;  // a report is one short line
// After init exits its pipes are normally at EOF; this bounds the drain if something that escaped
// init's tree is still writing.
constexpr int kDrainReads = 256;
// Init gets its grace to stop the tree, plus this, before the runtime kills init itself.
constexpr auto kBackstopSlack = std::chrono::seconds(1);

int milliseconds_until(Clock::time_point when, Clock::time_point now) {
  if (when <= now) return 0;
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(when - now).count() + 1;
  return left > 1'000'000 ? 1'000'000 : static_cast<int>(left);
}

// Kills and reaps init when supervision is abandoned by an exception: init still gets its
// SIGTERM and grace to stop the tree before it is killed itself.
void stop_and_reap(InitProcess& process, std::chrono::milliseconds grace) noexcept {
  if (process.pid <= 0) return;
  kill(process.pid, SIGTERM);
  const auto give_up = Clock::now() + grace + kBackstopSlack;
  int status = 0;
  while (waitpid(process.pid, &status, WNOHANG) == 0) {
    if (Clock::now() >= give_up) {
      kill(process.pid, SIGKILL);
      while (waitpid(process.pid, &status, 0) < 0 && errno == EINTR) {
      }
      break;
    }
    usleep(10'000);
  }
  process.pid = -1;
}

class Loop {
 public:
  Loop(InitProcess& process, SupervisionOptions& options)
      : process_(process),
        options_(options),
        stdout_(options.output_cap, std::move(options.on_stdout), result_.stdout_data),
        stderr_(options.output_cap, std::move(options.on_stderr), result_.stderr_data),
        stdin_(std::move(process.stdin_pipe), options.stdin_data, options.stdin_fd),
        chunk_(kChunkBytes) {}

  Supervision run() {
    while (!init_exited_ && !report_complete_) step();
    stdin_.close();
    finish();
    return std::move(result_);
  }

 private:
  enum Slot { kStdout, kStderr, kStdinPipe, kStdinSource, kPidfd, kReport, kStop, kSlots };

  void step() {
    const auto now = Clock::now();
    if (result_.stop == StopReason::none && now >= options_.deadline) stop(StopReason::timeout);
    if (result_.stop == StopReason::none && options_.limit_reached && now >= next_watch_) {
      next_watch_ = now + options_.watch_interval;
      if (options_.limit_reached()) stop(StopReason::limit_reached);
    }
    if (backstop_ && !result_.init_killed && now >= *backstop_) {
      kill(process_.pid, SIGKILL);  // unreaped child: the pid is still ours
      result_.init_killed = true;
    }
    int timeout = -1;
    if (result_.stop == StopReason::none)
      timeout = milliseconds_until(
          options_.limit_reached ? std::min(options_.deadline, next_watch_) : options_.deadline,
          now);
    else if (!result_.init_killed)
      timeout = milliseconds_until(*backstop_, now);

    pollfd fds[kSlots] = {
        {process_.stdout_pipe.get(), POLLIN, 0},
        {process_.stderr_pipe.get(), POLLIN, 0},
        {stdin_.write_fd(), POLLOUT, 0},
        {stdin_.read_fd(), POLLIN, 0},
        {process_.pidfd.get(), POLLIN, 0},
        {process_.report_pipe.get(), POLLIN, 0},
        {result_.stop == StopReason::none ? options_.stop_fd : -1, POLLIN, 0},
    };
    if (poll(fds, kSlots, timeout) < 0) return;  // EINTR: go round again
    constexpr short kReady = POLLIN | POLLHUP | POLLERR;
    if (fds[kStdout].revents & kReady)
      read_output(process_.stdout_pipe, stdout_, result_.stdout_truncated);
    if (fds[kStderr].revents & kReady)
      read_output(process_.stderr_pipe, stderr_, result_.stderr_truncated);
    if (fds[kStdinPipe].revents & (POLLOUT | POLLERR | POLLHUP)) stdin_.on_writable();
    if (fds[kStdinSource].revents & kReady) stdin_.on_readable();
    if (fds[kReport].revents & kReady) read_report();
    if (fds[kPidfd].revents & kReady) init_exited_ = true;
    if (fds[kStop].revents & kReady) stop(StopReason::cancelled);
  }

  // Reads one chunk; returns false at EOF, on an error, or when nothing is there.
  bool read_output(UniqueFd& pipe, CappedOutput& output, bool& truncated) {
    if (!pipe) return false;
    const ssize_t count = read(pipe.get(), chunk_.data(), chunk_.size());
    if (count == 0 || (count < 0 && errno != EAGAIN && errno != EINTR)) {
      pipe.reset();
      return false;
    }
    if (count < 0) return false;
    try {
      if (output.accept({chunk_.data(), static_cast<std::size_t>(count)})) {
        truncated = true;
        stop(StopReason::output_limit);
      }
    } catch (...) {
      // The caller's callback threw: stop the payload, deliver nothing more, rethrow later.
      if (!result_.caller_error) result_.caller_error = std::current_exception();
      stdout_.silence();
      stderr_.silence();
      stop(StopReason::caller_error);
    }
    return true;
  }

  void read_report() {
    char buffer[512];
    for (;;) {
      const ssize_t count = read(process_.report_pipe.get(), buffer, sizeof buffer);
      if (count > 0) {
        if (result_.report.size() < kReportLimit)
          result_.report.append(buffer, static_cast<std::size_t>(count));
        // Init's report is one line, written last, after every other process is dead and reaped:
        // with the reap deferred, its newline ends supervision without waiting for init's exit
        // (the PID namespace's teardown, about half a millisecond).
        // Looked for in what was read, not what was kept: a line longer than kReportLimit ends too.
        if (options_.defer_reap && std::memchr(buffer, '\n', static_cast<std::size_t>(count)))
          report_complete_ = true;
        continue;
      }
      if (count < 0 && errno == EINTR) continue;
      if (count == 0 || errno != EAGAIN) {
        // Only init holds the write end (it is close-on-exec there), so EOF means init is gone.
        // This is also how the exit is seen on kernels without pidfd_open.
        process_.report_pipe.reset();
        init_exited_ = true;
      }
      return;
    }
  }

  void stop(StopReason reason) {
    if (result_.stop != StopReason::none) return;
    result_.stop = reason;
    kill(process_.pid, SIGTERM);  // init applies the grace to the whole tree
    backstop_ = Clock::now() + options_.grace + kBackstopSlack;
  }

  void finish() {
    if (options_.defer_reap && (report_complete_ || !process_.report_pipe) &&
        !result_.report.empty()) {
      finish_before_exit();
      return;
    }
    // Wait for init to be a zombie without reaping it: until it is reaped its pid, and so its
    // process group id, cannot be recycled, which makes the group kill below safe.
    siginfo_t info{};
    int waited;
    while ((waited = waitid(P_PID, static_cast<id_t>(process_.pid), &info, WEXITED | WNOWAIT)) <
               0 &&
           errno == EINTR) {
    }
    // Last resort for anything left in init's process group (init normally leaves nothing; this
    // matters only when init itself was killed). Skipped when the host reaped init behind our back:
    // the pid may belong to someone else by now.
    if (waited == 0) kill(-process_.pid, SIGKILL);

    if (process_.report_pipe) read_report();
    // No report: perhaps init never ran. The launch child wrote its record before it exited.
    if (result_.report.empty() && process_.start_failure) {
      const auto said = process::read_child_report(process_.start_failure.get(), 0);
      if (said.kind == process::ChildReport::Kind::failed) result_.start_failure = said.failure;
    }
    drain_output();

    if (waited == 0) {
      int status = 0;
      pid_t reaped;
      while ((reaped = wait4(process_.pid, &status, 0, &result_.usage)) < 0 && errno == EINTR) {
      }
      result_.reaped = reaped == process_.pid;
      result_.wait_status = status;
    }
    process_.pid = -1;
    close_host_ends();
  }

  // Init has written its report and closed it: what is left of the output is in the pipes, and
  // its exit (the namespaces' teardown) is the caller's to wait for.
  void finish_before_exit() {
    drain_output();
    close_host_ends();
  }

  void close_host_ends() {
    for (UniqueFd* end : {&process_.stdout_pipe, &process_.stderr_pipe, &process_.report_pipe,
                          &process_.start_failure, &process_.pidfd})
      end->reset();
  }

  void drain_output() {
    for (int i = 0;
         i < kDrainReads && read_output(process_.stdout_pipe, stdout_, result_.stdout_truncated);
         ++i) {
    }
    for (int i = 0;
         i < kDrainReads && read_output(process_.stderr_pipe, stderr_, result_.stderr_truncated);
         ++i) {
    }
  }

  InitProcess& process_;
  SupervisionOptions& options_;
  Supervision result_;
  CappedOutput stdout_, stderr_;
  StdinPump stdin_;
  std::vector<char> chunk_;
  bool init_exited_ = false;
  bool report_complete_ = false;
  Clock::time_point next_watch_ = Clock::now() + options_.watch_interval;
  std::optional<Clock::time_point> backstop_;
};

}  // namespace

SupervisionOptions supervision_options(const Request& request, const Policy& policy,
                                       std::chrono::steady_clock::time_point deadline) {
  SupervisionOptions options;
  options.deadline = deadline;
  options.grace = policy.limits.kill_grace;
  options.output_cap = policy.limits.output_bytes;
  options.stdin_data = request.stdin_data;
  options.stdin_fd = request.stdin_fd;
  options.on_stdout = request.on_stdout;
  options.on_stderr = request.on_stderr;
  options.stop_fd = request.stop_fd;
  return options;
}

Supervision supervise_init(InitProcess& process, SupervisionOptions options) {
  try {
    return Loop(process, options).run();
  } catch (...) {
    stop_and_reap(process, options.grace);
    throw;
  }
}

}  // namespace rlm::supervisor
