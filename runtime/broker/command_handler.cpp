// The command: LM handler: `/bin/sh -c CMD` per call under a guard that kills everything the
// command leaves (command_guard.hpp), the call as one JSON line on its stdin, the answer on its
// stdout.
#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <nlohmann/json.hpp>

#include "broker/command_guard.hpp"
#include "broker/handlers.hpp"
#include "host/unique_fd.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::broker {
namespace {

using host::UniqueFd;
using nlohmann::json;
using Clock = std::chrono::steady_clock;

// The end of stderr kept for the error message: where a traceback says what went wrong.
constexpr std::size_t kStderrTailBytes = 4096;

Error system_error(const char* what) {
  return Error(std::string(what) + ": " + sys::errno_text(errno));
}

// Both ends numbered 3 or more, so moving the child's ends onto 0-2 never overwrites one not yet
// moved (a host may run with its stdio closed).
void above_stdio(UniqueFd& fd) {
  if (fd.get() > 2) return;
  const int moved = fcntl(fd.get(), F_DUPFD_CLOEXEC, 3);
  if (moved < 0) throw system_error("fcntl(F_DUPFD_CLOEXEC)");
  fd.reset(moved);
}

void set_nonblocking(const UniqueFd& fd) {
  fcntl(fd.get(), F_SETFL, fcntl(fd.get(), F_GETFL) | O_NONBLOCK);
}

// Our ends and the child's of its stdin, stdout and stderr, all close-on-exec: another thread may
// spawn a process meanwhile, which must not inherit them (it would hold our stdin open).
struct Stdio {
  // A socket rather than a pipe for stdin: send(MSG_NOSIGNAL) to a command that exits without
  // reading gives EPIPE, not a SIGPIPE to the host.
  UniqueFd input, child_input, output, child_output, errors, child_errors;

  Stdio() {
    int pair[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair) != 0)
      throw system_error("socketpair");
    input.reset(pair[0]);
    child_input.reset(pair[1]);
    using Ends = std::pair<UniqueFd*, UniqueFd*>;
    for (auto [ours, theirs] : {Ends{&output, &child_output}, Ends{&errors, &child_errors}}) {
      if (pipe2(pair, O_CLOEXEC) != 0) throw system_error("pipe2");
      ours->reset(pair[0]);
      theirs->reset(pair[1]);
    }
    for (UniqueFd* fd : {&input, &child_input, &output, &child_output, &errors, &child_errors})
      above_stdio(*fd);
    for (UniqueFd* fd : {&input, &output, &errors}) set_nonblocking(*fd);
  }
};

constexpr std::chrono::milliseconds kPollTick{50};

// The command's guard (command_guard.hpp): on every path out, exceptions included, it is told to
// stop, which kills what is left of the command, and reaped. It exits when the shell has exited
// and nothing of the command is left, with the shell's status; it was forked by this thread, so
// should the host die, its parent-death signal ends the command too.
class Child {
 public:
  explicit Child(pid_t pid)
      : pid_(pid), pidfd_(static_cast<int>(syscall(SYS_pidfd_open, pid, 0))) {}
  Child(const Child&) = delete;
  Child& operator=(const Child&) = delete;
  ~Child() { reap(); }

  // Exited (or killed) but not reaped yet. Without a pidfd (kernels before 5.3) this is checked
  // on each poll round, which then wakes up every kPollTick.
  bool exited() const {
    siginfo_t info{};
    return waitid(P_PID, static_cast<id_t>(pid_), &info, WEXITED | WNOHANG | WNOWAIT) == 0 &&
           info.si_pid == pid_;
  }
  const UniqueFd& pidfd() const { return pidfd_; }

  // Stops what is left of the command (nothing once the guard has exited by itself), then reaps
  // the guard; returns its wait status, which is the shell's when the shell ended first.
  int reap() {
    if (reaped_) return status_;
    kill(pid_, SIGTERM);  // unreaped: still our guard's pid
    while (waitpid(pid_, &status_, 0) < 0 && errno == EINTR) {
    }
    reaped_ = true;
    return status_;
  }

 private:
  pid_t pid_;
  UniqueFd pidfd_;
  bool reaped_ = false;
  int status_ = 0;
};

// Reads one chunk of what `fd` has into `text`; false when there was nothing to read now. Closes
// `fd` at EOF. One chunk at a time, so a command writing without pause cannot keep us reading.
bool read_chunk(UniqueFd& fd, std::string& text) {
  char buffer[65536];
  ssize_t got;
  do {
    got = read(fd.get(), buffer, sizeof buffer);
  } while (got < 0 && errno == EINTR);
  if (got > 0) {
    text.append(buffer, static_cast<std::size_t>(got));
    return true;
  }
  if (got == 0 || errno != EAGAIN) fd.reset();  // EOF, or an error that will not go away
  return false;
}

// After the shell exited: what it wrote is in the pipe, at most the pipe's capacity (64 KiB
// unless the command enlarged it); more could only come from a process that left its group.
void drain(UniqueFd& fd, std::string& text) {
  for (int chunk = 0; chunk < 16 && fd && read_chunk(fd, text); ++chunk) {
  }
}

void keep_tail(std::string& text, std::size_t bytes) {
  if (text.size() > bytes) text.erase(0, text.size() - bytes);
}

std::string trimmed(std::string text) {
  const auto last = text.find_last_not_of(" \t\r\n");
  text.erase(last == std::string::npos ? 0 : last + 1);
  return text.erase(0, std::min(text.size(), text.find_first_not_of(" \t\r\n")));
}

// stdout of a command that exited 0: {"text"} or {"error"} unwrapped, anything else the text
// itself without its one trailing newline.
LlmAnswer interpret(std::string output) {
  output = valid_utf8(output);
  const auto first = output.find_first_not_of(" \t\r\n");
  if (first != std::string::npos && output[first] == '{') {
    const json document = json::parse(output, nullptr, false);
    if (document.is_object()) {
      if (auto error = document.find("error"); error != document.end() && error->is_string())
        return LlmAnswer::of_error(error->get<std::string>());
      if (auto text = document.find("text"); text != document.end() && text->is_string())
        return LlmAnswer::of_text(text->get<std::string>());
    }
  }
  if (output.ends_with('\n')) output.pop_back();
  if (output.ends_with('\r')) output.pop_back();
  return LlmAnswer::of_text(std::move(output));
}

class CommandHandler final : public CallingThreadHandler {
 public:
  CommandHandler(std::string command, std::chrono::milliseconds max_duration)
      : command_(std::move(command)), max_duration_(max_duration) {}

 private:
  std::string failure(const std::exception& error) const override {
    return "cannot run the LM command: " + std::string(error.what());
  }

  LlmAnswer run(const LlmCall& call) const override {
    json input_line = {{"prompt", prompt_value(call)},
                       {"model", call.model ? json(*call.model) : json(nullptr)},
                       {"kind", to_string(call.kind)}};
    if (call.kind == CallKind::tool) input_line["tool"] = call.tool;
    const std::string input =
        input_line.dump(-1, ' ', false, json::error_handler_t::replace) + "\n";
    Stdio stdio;
    Child child(spawn_guarded_shell(command_, stdio.child_input.get(), stdio.child_output.get(),
                                    stdio.child_errors.get()));
    for (UniqueFd* theirs : {&stdio.child_input, &stdio.child_output, &stdio.child_errors})
      theirs->reset();

    std::size_t written = 0;
    std::string output, errors;
    bool exited = false, too_large = false;
    const auto deadline = Clock::now() + max_duration_;
    while (!exited && !too_large && Clock::now() < deadline) {
      pollfd fds[] = {{stdio.input.get(), POLLOUT, 0},
                      {stdio.output.get(), POLLIN, 0},
                      {stdio.errors.get(), POLLIN, 0},
                      {child.pidfd().get(), POLLIN, 0}};  // negative fds are skipped
      const int left = sys::poll_timeout_ms(deadline);
      const int wait = child.pidfd() ? left : std::min(left, static_cast<int>(kPollTick.count()));
      if (poll(fds, std::size(fds), wait) < 0 && errno != EINTR) throw system_error("poll");

      if (fds[0].revents) {
        const ssize_t sent = send(stdio.input.get(), input.data() + written, input.size() - written,
                                  MSG_NOSIGNAL | MSG_DONTWAIT);
        if (sent > 0) written += static_cast<std::size_t>(sent);
        // All written, or the command will not read it (EPIPE): either way it gets EOF.
        if (written == input.size() || (sent < 0 && errno != EAGAIN && errno != EINTR))
          stdio.input.reset();
      }
      if (fds[1].revents) read_chunk(stdio.output, output);
      if (fds[2].revents) {
        read_chunk(stdio.errors, errors);
        keep_tail(errors, kStderrTailBytes);
      }
      too_large = output.size() > kMaxAnswerBytes;
      exited = child.pidfd() ? fds[3].revents != 0 : child.exited();
    }
    // Whatever the shell wrote before exiting is in the pipes now; stragglers it left running
    // (background jobs) were killed by the guard rather than waited for.
    const int status = child.reap();
    if (exited) {
      drain(stdio.output, output);
      drain(stdio.errors, errors);
      too_large = output.size() > kMaxAnswerBytes;
    }
    keep_tail(errors, kStderrTailBytes);
    const std::string stderr_text = trimmed(valid_utf8(errors));
    const std::string with_stderr = stderr_text.empty() ? "" : ": " + stderr_text;

    if (too_large)
      return LlmAnswer::of_error("the LM command's answer exceeds " +
                                 std::to_string(kMaxAnswerBytes >> 20) + " MiB");
    if (!exited)
      return LlmAnswer::of_error("the LM command did not answer within " +
                                 std::to_string(max_duration_.count()) + " ms and was killed" +
                                 with_stderr);
    if (WIFSIGNALED(status))
      return LlmAnswer::of_error("the LM command was killed by signal " +
                                 std::to_string(WTERMSIG(status)) + with_stderr);
    if (WEXITSTATUS(status) != 0)
      return LlmAnswer::of_error("the LM command exited with status " +
                                 std::to_string(WEXITSTATUS(status)) + with_stderr);
    return interpret(std::move(output));
  }

  const std::string command_;
  const std::chrono::milliseconds max_duration_;
};

}  // namespace

std::shared_ptr<LlmHandler> make_command_handler(std::string command,
                                                 std::chrono::milliseconds max_duration) {
  return std::make_shared<CommandHandler>(std::move(command), max_duration);
}

}  // namespace rlm::broker
