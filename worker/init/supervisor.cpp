#include "supervisor.hpp"

#include <poll.h>
#include <sys/signalfd.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <ctime>

#include "guard_program.hpp"

#include "process_tree.hpp"

namespace rlm::init {
namespace {

constexpr int kForwarded[] = {SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2};

long long now_ms() {
  timespec now{};
  clock_gettime(CLOCK_MONOTONIC, &now);
  return static_cast<long long>(now.tv_sec) * 1000 + now.tv_nsec / 1'000'000;
}

long long cpu_microseconds(const rusage& usage) {
  const auto us = [](const timeval& t) {
    return static_cast<long long>(t.tv_sec) * 1'000'000 + t.tv_usec;
  };
  return us(usage.ru_utime) + us(usage.ru_stime);
}

}  // namespace

sigset_t supervised_signals() {
  sigset_t set;
  sigemptyset(&set);
  for (int signal : {SIGCHLD, SIGTERM, SIGINT, SIGHUP, SIGQUIT, SIGUSR1, SIGUSR2})
    sigaddset(&set, signal);
  return set;
}

Supervisor::Supervisor(pid_t payload, int signal_fd, int grace_ms, NotifyListener& listener,
                       bool pid1, const SignalGuard* guard, int host_fd)
    : self_(getpid()),
      launcher_(getppid()),
      payload_(payload),
      signal_fd_(signal_fd),
      grace_ms_(grace_ms),
      listener_(listener),
      pid1_(pid1),
      guard_(guard),
      host_fd_(host_fd) {}

Outcome Supervisor::run() {
  while (!payload_done_ && seccomp_syscall_ < 0 && !host_gone_) {
    int timeout_ms = -1;
    if (terminating_) {
      const long long left = kill_deadline_ms_ - now_ms();
      if (left <= 0) break;
      timeout_ms = static_cast<int>(left);
    }
    if (wait_for_signal(timeout_ms)) handle_signals();
    reap_exited();
  }
  // The main process is gone (or the grace ran out): nothing else may outlive it.
  kill_everything();

  Outcome outcome;
  outcome.terminated = terminating_ || host_gone_;
  outcome.terminated_by_payload = terminating_ && terminated_by_payload_;
  outcome.seccomp_syscall = seccomp_syscall_;
  outcome.cpu_us = cpu_microseconds(payload_usage_);
  if (WIFSIGNALED(payload_status_)) {
    outcome.kind = Outcome::Kind::signaled;
    outcome.value = WTERMSIG(payload_status_);
  } else {
    outcome.kind = Outcome::Kind::exited;
    outcome.value = WEXITSTATUS(payload_status_);
  }
  return outcome;
}

bool Supervisor::reap_exited() {
  for (;;) {
    int status = 0;
    rusage usage{};
    const pid_t pid = wait4(-1, &status, WNOHANG, &usage);
    if (pid > 0) {
      if (pid == payload_) {
        payload_done_ = true;
        payload_status_ = status;
        payload_usage_ = usage;
      }
      continue;
    }
    if (pid == 0) return true;  // children left, none exited yet
    if (errno == EINTR) continue;
    return false;  // ECHILD: no child at all
  }
}

bool Supervisor::wait_for_signal(int timeout_ms) {
  pollfd watched[3] = {{signal_fd_, POLLIN, 0},
                       {listener_.fd(), POLLIN, 0},
                       {host_gone_ ? -1 : host_fd_, POLLIN, 0}};
  int ready;
  while ((ready = poll(watched, 3, timeout_ms)) < 0 && errno == EINTR) {
  }
  if (ready <= 0) return false;
  if (watched[2].revents) handle_host();
  if (watched[1].revents & POLLIN) {
    handle_notification();
  } else if (watched[1].revents & (POLLHUP | POLLERR)) {
    listener_.close();  // no process uses the filter any more
  }
  return (watched[0].revents & POLLIN) != 0;
}

void Supervisor::handle_host() {
  char discard[256];
  for (;;) {
    const ssize_t count = recv(host_fd_, discard, sizeof discard, MSG_DONTWAIT);
    if (count > 0) continue;  // the host writes nothing after the message; ignore it
    if (count < 0 && errno == EINTR) continue;
    if (count < 0 && errno == EAGAIN) return;
    break;  // EOF or an error (ECONNRESET): the host is gone
  }
  // Nothing may outlive its host: no grace, the tree goes at once (run() then kills everything).
  host_gone_ = true;
  signal_tree(SIGKILL);
}

void Supervisor::handle_notification() {
  NotifyListener::Caught caught;
  if (!listener_.receive(caught)) return;
  if (guard_ && is_guarded_syscall(caught.syscall)) {
    // The guard's own question, not a policy violation. Whom the caller is was read from /proc by
    // its thread id: only trusted if the notification is still pending afterwards.
    if (guard_->allows(caught) && listener_.valid(caught) && listener_.allow(caught)) return;
    listener_.deny(caught);
    return;
  }
  // A straggler caught while the tree is torn down after the payload ended does not change how
  // the payload ended.
  if (seccomp_syscall_ < 0 && !payload_done_) seccomp_syscall_ = caught.syscall;
  // The caller is held inside the syscall until answered; a SIGKILL now means it never returns
  // to user space. The deny afterwards only matters if it somehow survived.
  signal_tree(SIGKILL);
  listener_.deny(caught);
}

void Supervisor::handle_signals() {
  signalfd_siginfo info{};
  while (read(signal_fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
    const int signal = static_cast<int>(info.ssi_signo);
    if (signal == SIGCHLD) continue;  // reaped after every wake-up
    // Guarded, no payload process may signal init (it is older than all of them): what still
    // comes from inside, the kernel sent on a payload's behalf (the SIGHUP of a process group the
    // payload orphaned on purpose). Forwarding it would reach past the guard.
    if (guard_ && sent_from_inside(info)) continue;
    if (signal == SIGTERM) {
      if (!terminating_) terminated_by_payload_ = sent_from_inside(info);
      begin_termination();
      continue;
    }
    for (int forwarded : kForwarded)
      // The payload is our unreaped child, so its pid cannot have been recycled.
      if (signal == forwarded && !payload_done_) kill(payload_, signal);
  }
}

bool Supervisor::sent_from_inside(const signalfd_siginfo& info) const {
  const int code = info.ssi_code;
  // Only kill(2)-like codes carry a sender pid the kernel vouches for; a queued signal's pid is
  // whatever its sender wrote, and a SIGIO (F_SETOWN + F_SETSIG) names none. The runtime sends
  // plain kills, so anything else came from inside.
  if (code != SI_USER && code != SI_TKILL) return true;
  const auto sender = static_cast<pid_t>(info.ssi_pid);
  // As PID 1, a sender outside the namespace shows as pid 0.
  if (pid1_) return sender != 0;
  if (sender == 0 || sender == launcher_) return false;
  for (const auto& member : find_descendants(self_))
    if (member.pid == sender) return true;
  return false;  // outside init's tree (or gone before init could look)
}

void Supervisor::begin_termination() {
  if (terminating_) return;
  terminating_ = true;
  kill_deadline_ms_ = now_ms() + grace_ms_;
  signal_tree(SIGTERM);
  // A stopped process would only act on SIGTERM once continued.
  signal_tree(SIGCONT);
}

void Supervisor::signal_tree(int signal) {
  // As PID 1, kill(-1) reaches every process of the namespace but init itself, in one atomic
  // sweep that a fork bomb cannot outrun. Elsewhere, walk /proc from init.
  if (pid1_)
    kill(-1, signal);
  else
    signal_descendants(self_, signal);
}

void Supervisor::kill_everything() {
  // No child at all means no descendant at all: init is the subreaper, so every process the
  // payload left behind is init's child by the time its parent is reaped. That skips the sweep
  // in the common case -- outside a PID namespace a walk over every /proc/PID/stat of the host.
  if (!reap_exited()) return;
  for (;;) {
    signal_tree(SIGKILL);
    if (!reap_exited()) return;
    // Something is left: a process forked since the scan, or one still dying. Wait briefly for a
    // SIGCHLD, drain whatever arrived (nothing more to forward now), and sweep again.
    if (wait_for_signal(10)) {
      signalfd_siginfo info{};
      while (read(signal_fd_, &info, sizeof info) == static_cast<ssize_t>(sizeof info)) {
      }
    }
  }
}

}  // namespace rlm::init
