#include "supervisor/launch.hpp"

#include <fcntl.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/resource.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <system_error>

#include "host/stdio_pipe.hpp"
#include "process/child_failure.hpp"
#include "process/child_start.hpp"
#include "rlm_init/protocol.hpp"
#include "rlm_sandbox/error.hpp"

namespace rlm::supervisor {
namespace {

constexpr int kFirstFreeFd = init_protocol::kReportFd + 1;

std::system_error system_error(const char* what) {
  return std::system_error(errno, std::generic_category(), what);
}

void close_span(unsigned first, unsigned last, unsigned ceiling) noexcept {
  if (first > last) return;
  if (syscall(SYS_close_range, first, last, 0) == 0) return;
  for (unsigned fd = first; fd <= last && fd < ceiling; ++fd) close(static_cast<int>(fd));
}

void set_nonblocking(const UniqueFd& fd) {
  const int flags = fcntl(fd.get(), F_GETFL);
  if (flags >= 0) fcntl(fd.get(), F_SETFL, flags | O_NONBLOCK);
}

std::vector<char*> pointers(std::vector<std::string>& strings) {
  std::vector<char*> result;
  result.reserve(strings.size() + 1);
  for (auto& s : strings) result.push_back(s.data());
  result.push_back(nullptr);
  return result;
}

[[noreturn]] void fail_before_exec(int failure_fd, const char* step) noexcept {
  process::exit_with_failure(failure_fd, process::ChildFailure::at(step, errno),
                             init_protocol::kInitFailureExit);
}

}  // namespace

void close_fds_except(unsigned first, KeptFds keep, unsigned ceiling) noexcept {
  std::sort(keep.begin(), keep.end());  // in place on a copy: no allocation
  unsigned next = first;
  for (const int fd : keep) {
    if (fd < 0 || static_cast<unsigned>(fd) < next) continue;
    close_span(next, static_cast<unsigned>(fd) - 1, ceiling);
    next = static_cast<unsigned>(fd) + 1;
  }
  close_span(next, ~0u, ceiling);
}

bool clear_cloexec(const KeptFds& keep) noexcept {
  for (const int fd : keep)
    if (fd >= 0 && fcntl(fd, F_SETFD, 0) != 0) return false;
  return true;
}

UniqueFd above_stdio(UniqueFd fd) {
  if (!fd || fd.get() >= kFirstFreeFd) return fd;
  const int moved = fcntl(fd.get(), F_DUPFD_CLOEXEC, kFirstFreeFd);
  if (moved < 0) throw system_error("fcntl(F_DUPFD_CLOEXEC)");
  return UniqueFd(moved);
}

Pipe make_pipe() {
  int fds[2];
  if (pipe2(fds, O_CLOEXEC) != 0) throw system_error("pipe2");
  UniqueFd read_end(fds[0]), write_end(fds[1]);
  return {above_stdio(std::move(read_end)), above_stdio(std::move(write_end))};
}

StdioPipes make_stdio_pipes() {
  StdioPipes pipes;
  auto in = make_pipe(), out = make_pipe(), err = make_pipe();
  // /dev/stdin and the others open by path, also under the sandbox's uid (host/stdio_pipe.hpp).
  for (const auto* pipe : {&in, &out, &err}) host::open_pipe_to_its_holders(pipe->read.get());
  pipes.child = {std::move(in.read), std::move(out.write), std::move(err.write)};
  pipes.host = {std::move(in.write), std::move(out.read), std::move(err.read)};
  return pipes;
}

void attach_stdio(InitProcess& process, std::array<UniqueFd, 3> host) {
  for (auto& end : host) set_nonblocking(end);
  process.stdin_pipe = std::move(host[0]);
  process.stdout_pipe = std::move(host[1]);
  process.stderr_pipe = std::move(host[2]);
}

InitLaunch::InitLaunch(std::string init_path, std::vector<std::string> args,
                       std::vector<std::string> env, InitStdio stdio)
    : path_(std::move(init_path)),
      args_(std::move(args)),
      env_(std::move(env)),
      argv_(pointers(args_)),
      envp_(pointers(env_)),
      parent_pid_(getpid()) {
  rlimit files{};
  max_fd_ = getrlimit(RLIMIT_NOFILE, &files) == 0 && files.rlim_cur < (1u << 20)
                ? static_cast<unsigned>(files.rlim_cur)
                : (1u << 20);
  switch (stdio.kind) {
    case InitStdio::Kind::pipes: {
      auto pipes = make_stdio_pipes();
      child_stdin_ = std::move(pipes.child[0]);
      child_stdout_ = std::move(pipes.child[1]);
      child_stderr_ = std::move(pipes.child[2]);
      stdin_ = std::move(pipes.host[0]);
      stdout_ = std::move(pipes.host[1]);
      stderr_ = std::move(pipes.host[2]);
      break;
    }
    case InitStdio::Kind::given:
    case InitStdio::Kind::null: {
      UniqueFd null_fd;
      if (stdio.kind == InitStdio::Kind::null) {
        null_fd = UniqueFd(open("/dev/null", O_RDWR | O_CLOEXEC));
        if (!null_fd) throw system_error("open(/dev/null)");
      }
      // Our own copies above init's stdio: the caller's may sit on 0-2 and would be overwritten
      // by an earlier dup2 in the child.
      UniqueFd* copies[3] = {&child_stdin_, &child_stdout_, &child_stderr_};
      for (int i = 0; i < 3; ++i) {
        const int source = null_fd ? null_fd.get() : stdio.fds[static_cast<std::size_t>(i)];
        const int copy = fcntl(source, F_DUPFD_CLOEXEC, kFirstFreeFd);
        if (copy < 0) throw system_error("fcntl(F_DUPFD_CLOEXEC)");
        *copies[i] = UniqueFd(copy);
      }
      break;
    }
  }
  auto report = make_pipe();
  report_ = std::move(report.read);
  child_report_ = std::move(report.write);
  auto failure = make_pipe();
  failure_ = std::move(failure.read);
  child_failure_ = std::move(failure.write);
}

void InitLaunch::exec_in_child() const noexcept {
  // Its own process group: the runtime's last-resort kill(-pgid) reaches every member that did
  // not leave it, and a terminal's job-control signals meant for the host do not.
  setpgid(0, 0);
  // SIGTERM, not SIGKILL: init answers it by tearing the whole tree down; SIGKILL would orphan it.
  prctl(PR_SET_PDEATHSIG, SIGTERM);
  if (getppid() != parent_pid_) _exit(init_protocol::kInitFailureExit);  // parent already gone

  const int failure_fd = child_failure_.get();
  if (!install_stdio()) fail_before_exec(failure_fd, "dup2 (stdio and report pipe)");
  if (!clear_cloexec(inherited_)) fail_before_exec(failure_fd, "fcntl (inherited fds)");
  // Nothing else crosses: not the host's fds, nor another thread's pipes created concurrently.
  // The failure pipe stays open until the exec closes it (close-on-exec).
  KeptFds keep = inherited_;
  keep.back() = failure_fd;
  close_fds_except(kFirstFreeFd, keep, max_fd_);

  execve(path_.c_str(), argv_.data(), envp_.data());
  fail_before_exec(failure_fd, "execve");
}

void check_inherit_fds(const std::vector<int>& fds) {
  if (fds.size() > kMaxInheritedFds)
    throw Error("at most " + std::to_string(kMaxInheritedFds) +
                " fds can be inherited by the payload");
  for (const int fd : fds) {
    if (fd < kFirstFreeFd)
      throw Error("an inherited fd must be >= " + std::to_string(kFirstFreeFd) + " (0-" +
                  std::to_string(kFirstFreeFd - 1) + " are init's stdio and report pipe), got " +
                  std::to_string(fd));
    if (std::count(fds.begin(), fds.end(), fd) > 1)
      throw Error("an inherited fd is listed twice: " + std::to_string(fd));
  }
}

void InitLaunch::inherit(const std::vector<int>& fds) {
  check_inherit_fds(fds);
  for (std::size_t i = 0; i < fds.size(); ++i) inherited_[i] = fds[i];
}

void InitLaunch::keep_for_init(int fd) {
  if (fd < kFirstFreeFd)
    throw Error("an fd kept for init must be >= " + std::to_string(kFirstFreeFd));
  for (std::size_t i = 0; i + 1 < inherited_.size(); ++i)  // the last slot: the failure pipe's
    if (inherited_[i] < 0) {
      inherited_[i] = fd;
      return;
    }
  throw Error("no room left to keep fd " + std::to_string(fd) + " for rlm-sandbox-init");
}

bool InitLaunch::install_stdio() const noexcept {
  // dup2 clears close-on-exec on the targets; every source is >= kFirstFreeFd, so none is
  // overwritten before it has been moved.
  return dup2(child_stdin_.get(), STDIN_FILENO) >= 0 &&
         dup2(child_stdout_.get(), STDOUT_FILENO) >= 0 &&
         dup2(child_stderr_.get(), STDERR_FILENO) >= 0 &&
         dup2(child_report_.get(), init_protocol::kReportFd) >= 0;
}

InitProcess InitLaunch::finish(pid_t pid, UniqueFd pidfd) {
  child_stdin_.reset();
  child_stdout_.reset();
  child_stderr_.reset();
  child_report_.reset();
  child_failure_.reset();
  InitProcess process;
  process.pid = pid;
  // Our unreaped child, so the pid cannot have been recycled yet.
  process.pidfd =
      pidfd ? std::move(pidfd) : UniqueFd(static_cast<int>(syscall(SYS_pidfd_open, pid, 0)));
  for (UniqueFd* end : {&stdin_, &stdout_, &stderr_, &report_})
    if (*end) set_nonblocking(*end);
  process.stdin_pipe = std::move(stdin_);
  process.stdout_pipe = std::move(stdout_);
  process.stderr_pipe = std::move(stderr_);
  process.report_pipe = std::move(report_);
  process.start_failure = std::move(failure_);
  return process;
}

InitProcess launch_init(std::string init_path, std::vector<std::string> args,
                        std::vector<std::string> env, const std::vector<int>& inherit_fds,
                        InitStdio stdio) {
  InitLaunch launch(std::move(init_path), std::move(args), std::move(env), stdio);
  launch.inherit(inherit_fds);
  // Signals stay blocked in the child until init has set up its signalfd: a SIGTERM that arrives
  // early stays pending for init.
  const auto child = process::start_child({}, [&launch] { launch.exec_in_child(); });
  if (child.pid < 0) throw std::system_error(child.error, std::generic_category(), "fork");
  return launch.finish(child.pid);
}

}  // namespace rlm::supervisor
