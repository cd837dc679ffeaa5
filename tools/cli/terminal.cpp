#include "terminal.hpp"

#include <fcntl.h>
#include <poll.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/ioctl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <iterator>
#include <string>

#include "cli.hpp"
#include "rlm_sandbox/error.hpp"

namespace rlm::cli {
namespace {

constexpr char kResized = 'W', kFinished = 'F';
// After the run, what the payload's terminal still holds is read for at most this long: a
// process that escaped the run and holds the terminal open must not hold the CLI.
constexpr auto kDrainLimit = std::chrono::seconds(1);

std::atomic<int> resize_fd{-1};
struct sigaction previous_winch;

// While this terminal is raw, a signal that ends the CLI puts it back first: a payload that
// floods a closed stdout (SIGPIPE, found by attacking it) or anyone's kill -USR1 left the
// person's terminal raw.
constexpr int kFatalSignals[] = {SIGPIPE, SIGQUIT, SIGUSR1, SIGUSR2, SIGALRM,
                                 SIGSEGV, SIGBUS,  SIGABRT, SIGFPE,  SIGILL};
termios raw_saved;
std::atomic<bool> raw_active{false};
struct sigaction previous_fatal[std::size(kFatalSignals)];

void restore_and_reraise(int signal) {
  if (raw_active.exchange(false)) tcsetattr(STDIN_FILENO, TCSANOW, &raw_saved);
  raise(signal);  // SA_RESETHAND: the default disposition now
}

void guard_raw_mode(const termios& saved) {
  raw_saved = saved;
  raw_active = true;
  struct sigaction action {};
  action.sa_handler = restore_and_reraise;
  action.sa_flags = SA_RESETHAND;
  for (std::size_t i = 0; i < std::size(kFatalSignals); ++i)
    sigaction(kFatalSignals[i], &action, &previous_fatal[i]);
}

void end_raw_mode() {
  if (raw_active.exchange(false)) tcsetattr(STDIN_FILENO, TCSANOW, &raw_saved);
  for (std::size_t i = 0; i < std::size(kFatalSignals); ++i)
    sigaction(kFatalSignals[i], &previous_fatal[i], nullptr);
}

void on_resize(int) {
  const int saved = errno;
  [[maybe_unused]] const ssize_t ignored = write(resize_fd.load(), &kResized, 1);
  errno = saved;
}

Error system_error(const std::string& what) {
  return Error("-t: " + what + ": " + std::strerror(errno));
}

void copy_window_size(int to) {
  winsize size{};
  if (ioctl(STDOUT_FILENO, TIOCGWINSZ, &size) == 0 || ioctl(STDIN_FILENO, TIOCGWINSZ, &size) == 0)
    ioctl(to, TIOCSWINSZ, &size);
}

}  // namespace

PayloadTerminal::PayloadTerminal(bool forward_input) : forward_input_(forward_input) {
  primary_ = posix_openpt(O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (primary_ < 0) throw system_error("cannot open a pseudo-terminal (posix_openpt)");
  char name[128];
  if (grantpt(primary_) != 0 || unlockpt(primary_) != 0 ||
      ptsname_r(primary_, name, sizeof name) != 0) {
    close(primary_);
    throw system_error("cannot prepare the pseudo-terminal");
  }
  replica_ = open(name, O_RDWR | O_NOCTTY | O_CLOEXEC);
  if (replica_ < 0 || pipe2(wake_, O_CLOEXEC | O_NONBLOCK) != 0) {
    const auto error = system_error(std::string("cannot open ") + name);
    if (replica_ >= 0) close(replica_);
    close(primary_);
    throw error;
  }
  copy_window_size(primary_);
}

PayloadTerminal::~PayloadTerminal() {
  if (relay_.joinable()) {
    [[maybe_unused]] const ssize_t ignored = write(wake_[1], &kFinished, 1);
    relay_.join();
  }
  if (resize_fd.load() == wake_[1]) {
    sigaction(SIGWINCH, &previous_winch, nullptr);
    resize_fd = -1;
  }
  if (raw_) end_raw_mode();
  for (const int fd : {primary_, replica_, wake_[0], wake_[1]})
    if (fd >= 0) close(fd);
}

void PayloadTerminal::start() {
  if (isatty(STDIN_FILENO) && forward_input_ && tcgetattr(STDIN_FILENO, &saved_) == 0) {
    termios raw = saved_;
    cfmakeraw(&raw);
    guard_raw_mode(saved_);
    raw_ = tcsetattr(STDIN_FILENO, TCSANOW, &raw) == 0;
    if (!raw_) end_raw_mode();
  }
  resize_fd = wake_[1];
  struct sigaction action {};
  action.sa_handler = on_resize;
  action.sa_flags = SA_RESTART;
  sigaction(SIGWINCH, &action, &previous_winch);
  relay_ = std::thread([this] { relay(); });
}

void PayloadTerminal::finish() {
  // Ours is the last copy of the payload's side once the run is over: closing it lets the
  // relay read to the end (EIO) of what the payload wrote.
  close(replica_);
  replica_ = -1;
  if (!relay_.joinable()) return;
  [[maybe_unused]] const ssize_t ignored = write(wake_[1], &kFinished, 1);
  relay_.join();
  if (raw_) end_raw_mode();
  raw_ = false;
}

void PayloadTerminal::relay() {
  bool input_open = forward_input_ && fcntl(STDIN_FILENO, F_GETFD) != -1;
  std::chrono::steady_clock::time_point give_up{};
  bool finishing = false;
  char buffer[16 * 1024];
  for (;;) {
    pollfd fds[3] = {{primary_, POLLIN, 0},
                     {wake_[0], POLLIN, 0},
                     {input_open && !finishing ? STDIN_FILENO : -1, POLLIN, 0}};
    int timeout = -1;
    if (finishing) {
      const auto left = give_up - std::chrono::steady_clock::now();
      if (left <= std::chrono::steady_clock::duration::zero()) return;
      timeout =
          static_cast<int>(std::chrono::duration_cast<std::chrono::milliseconds>(left).count() + 1);
    }
    if (poll(fds, 3, timeout) < 0) {
      if (errno == EINTR) continue;
      return;
    }
    if (fds[0].revents & (POLLIN | POLLHUP | POLLERR)) {
      const ssize_t got = read(primary_, buffer, sizeof buffer);
      if (got <= 0 && errno != EINTR && errno != EAGAIN) return;  // EIO: every copy closed
      if (got > 0) write_all(STDOUT_FILENO, {buffer, static_cast<std::size_t>(got)});
    }
    if (fds[1].revents & POLLIN) {
      char what[64];
      const ssize_t got = read(wake_[0], what, sizeof what);
      for (ssize_t i = 0; i < got; ++i) {
        if (what[i] == kResized) copy_window_size(primary_);
        if (what[i] == kFinished && !finishing) {
          finishing = true;
          give_up = std::chrono::steady_clock::now() + kDrainLimit;
        }
      }
    }
    if (fds[2].revents & (POLLIN | POLLHUP | POLLERR)) {
      const ssize_t got = read(STDIN_FILENO, buffer, sizeof buffer);
      if (got > 0) {
        write_all(primary_, {buffer, static_cast<std::size_t>(got)});
      } else if (got == 0 || errno != EINTR) {
        // The end of a piped input is the end of the terminal's: its EOF character.
        if (!isatty(STDIN_FILENO)) {
          termios modes{};
          const char eof =
              tcgetattr(primary_, &modes) == 0 ? static_cast<char>(modes.c_cc[VEOF]) : '\x04';
          write_all(primary_, {&eof, 1});
        }
        input_open = false;
      }
    }
  }
}

}  // namespace rlm::cli
