#include "interrupts.hpp"

#include <fcntl.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <string>

#include "rlm_sandbox/error.hpp"

namespace rlm::cli {
namespace {

constexpr int kSignals[] = {SIGINT, SIGTERM, SIGHUP};

// One Interrupts at a time (a CLI runs one payload); the handler reaches it through these.
std::atomic<int> first_signal{0};
std::atomic<int> wake_fd{-1};
struct sigaction previous[3];

void on_signal(int signal) {
  const int saved = errno;
  int none = 0;
  first_signal.compare_exchange_strong(none, signal);
  const char byte = 1;
  [[maybe_unused]] const ssize_t ignored = write(wake_fd.load(), &byte, 1);  // nonblocking
  errno = saved;
}

}  // namespace

Interrupts::Interrupts() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC | O_NONBLOCK) != 0)
    throw Error(std::string("cannot make the interrupt pipe: ") + strerror(errno));
  read_fd_ = fds[0];
  write_fd_ = fds[1];
  first_signal = 0;
  wake_fd = write_fd_;
  struct sigaction action {};
  action.sa_handler = on_signal;
  action.sa_flags = SA_RESTART;
  sigfillset(&action.sa_mask);
  for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &action, &previous[i]);
}

Interrupts::~Interrupts() {
  for (int i = 0; i < 3; ++i) sigaction(kSignals[i], &previous[i], nullptr);
  wake_fd = -1;
  close(read_fd_);
  close(write_fd_);
}

int Interrupts::caught() const {
  return first_signal.load();
}

void Interrupts::explain(Result& result) const {
  const int signal = caught();
  if (signal == 0 || result.status != Status::interrupted) return;
  result.signal = signal;
  const char* name = sigabbrev_np(signal);
  result.detail = std::string("stopped by SIG") + (name ? name : "?") +
                  "; the payload was sent SIGTERM and given the policy's kill grace";
}

}  // namespace rlm::cli
