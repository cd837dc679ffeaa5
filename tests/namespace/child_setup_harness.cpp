#include "child_setup_harness.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <fstream>
#include <optional>
#include <sstream>
#include <stdexcept>

#include "support/subprocess.hpp"

namespace rlm::ns::test {
namespace {

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
  out.flush();
  if (!out) throw std::runtime_error("cannot write " + path);
}

// Async-signal-safe reporting from the sandboxed child.
void put(const char* text) {
  const ssize_t ignored = ::write(2, text, std::strlen(text));
  (void)ignored;
}
void put_number(int value) {
  char digits[16];
  int n = 0;
  unsigned v = value < 0 ? 0u - static_cast<unsigned>(value) : static_cast<unsigned>(value);
  do {
    digits[n++] = static_cast<char>('0' + v % 10);
    v /= 10;
  } while (v != 0 && n < 15);
  if (value < 0) put("-");
  char text[16];
  for (int i = 0; i < n; ++i) text[i] = digits[n - 1 - i];
  text[n] = '\0';
  put(text);
}
[[noreturn]] void step_failed(const process::ChildFailure& failure) {
  put("step failed: ");
  put(failure.step[0] ? failure.step : "(unnamed)");
  put(": errno ");
  put_number(failure.error);
  put("\n");
  _exit(125);
}
[[noreturn]] void harness_failed(const char* what) {
  const int error = errno;
  put("harness failed: ");
  put(what);
  put(": errno ");
  put_number(error);
  put("\n");
  _exit(124);
}

}  // namespace

SandboxRun run_in_sandbox(const Policy& policy, const std::vector<std::string>& argv, Steps steps) {
  // Everything that allocates happens here, before fork.
  std::optional<RootfsPlan> rootfs;
  std::optional<LoopbackPlan> loopback;
  std::optional<PrivilegePlan> privileges;
  if (steps.rootfs) rootfs.emplace(RootfsPlan::prepare(policy));
  if (steps.loopback) loopback.emplace(LoopbackPlan::prepare());
  if (steps.privileges) privileges.emplace(PrivilegePlan::prepare(policy));
  std::vector<std::string> args_storage = argv;
  std::vector<char*> args;
  for (auto& a : args_storage) args.push_back(a.data());
  args.push_back(nullptr);
  std::string env_storage[] = {"PATH=/usr/bin:/bin:/usr/sbin:/sbin", "HOME=/tmp", "LANG=C"};
  char* envp[] = {env_storage[0].data(), env_storage[1].data(), env_storage[2].data(), nullptr};
  const std::string map_uid = std::to_string(policy.user.uid) + " 65534 1\n";
  const std::string map_gid = std::to_string(policy.user.gid) + " 65534 1\n";
  const uid_t uid = policy.user.uid;
  const gid_t gid = policy.user.gid;
  const char* hostname = policy.hostname.c_str();
  const int exec_fd = steps.exec_fd;

  int out_pipe[2], err_pipe[2], ready_pipe[2], go_pipe[2];
  if (pipe2(out_pipe, O_CLOEXEC) || pipe2(err_pipe, O_CLOEXEC) || pipe2(ready_pipe, O_CLOEXEC) ||
      pipe2(go_pipe, O_CLOEXEC))
    throw std::runtime_error("pipe2 failed");

  const pid_t outer = fork();
  if (outer < 0) throw std::runtime_error("fork failed");
  if (outer == 0) {
    // The "clone" half: host root drops its supplementary groups (with setgroups denied in the
    // user namespace they could never be dropped later), then unshares the namespaces.
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    if (geteuid() == 0 && syscall(SYS_setgroups, 0, nullptr) != 0) harness_failed("setgroups");
    if (unshare(CLONE_NEWUSER | CLONE_NEWNS | CLONE_NEWPID | CLONE_NEWNET | CLONE_NEWUTS |
                CLONE_NEWIPC) != 0)
      harness_failed("unshare");
    char byte = 1;
    if (write(ready_pipe[1], &byte, 1) != 1) harness_failed("signal readiness");
    if (read(go_pipe[0], &byte, 1) != 1) harness_failed("wait for the id maps");
    // unshare(CLONE_NEWPID) applies to the next child, which becomes PID 1.
    const pid_t inner = fork();
    if (inner < 0) harness_failed("fork PID 1");
    if (inner == 0) {
      prctl(PR_SET_PDEATHSIG, SIGKILL);
      if (syscall(SYS_setresgid, gid, gid, gid) != 0) harness_failed("setresgid");
      if (syscall(SYS_setresuid, uid, uid, uid) != 0) harness_failed("setresuid");
      process::ChildFailure failure;
      if (rootfs && !rootfs->apply(failure)) step_failed(failure);
      if (sethostname(hostname, std::strlen(hostname)) != 0) harness_failed("sethostname");
      if (loopback && !loopback->apply(failure)) step_failed(failure);
      if (privileges && !privileges->apply(failure)) step_failed(failure);
      if (exec_fd >= 0)
        syscall(SYS_execveat, exec_fd, "", args.data(), envp, AT_EMPTY_PATH);
      else
        execve(args[0], args.data(), envp);
      harness_failed("execve");
    }
    int status = 0;
    while (waitpid(inner, &status, 0) < 0 && errno == EINTR) {
    }
    _exit(WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status));
  }

  close(out_pipe[1]);
  close(err_pipe[1]);
  close(ready_pipe[1]);
  close(go_pipe[0]);
  // The parent's half of the backend's job: the id maps.
  char byte = 0;
  if (read(ready_pipe[0], &byte, 1) == 1) {
    const std::string proc = "/proc/" + std::to_string(outer);
    write_text(proc + "/setgroups", "deny");
    write_text(proc + "/gid_map", map_gid);
    write_text(proc + "/uid_map", map_uid);
    if (write(go_pipe[1], &byte, 1) != 1) throw std::runtime_error("cannot release the child");
  }
  close(ready_pipe[0]);
  close(go_pipe[1]);

  SandboxRun run;
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  int fds[2] = {out_pipe[0], err_pipe[0]};
  std::string* sinks[2] = {&run.out, &run.err};
  while (fds[0] >= 0 || fds[1] >= 0) {
    pollfd polled[2] = {{fds[0], POLLIN, 0}, {fds[1], POLLIN, 0}};
    const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(
        deadline - std::chrono::steady_clock::now());
    if (left.count() <= 0) {
      kill(outer, SIGKILL);  // PID 1 follows through its parent-death signal
      run.err += "\n[harness: timed out]";
      break;
    }
    if (poll(polled, 2, static_cast<int>(left.count())) < 0 && errno != EINTR) break;
    for (int i = 0; i < 2; ++i) {
      if (fds[i] < 0 || !(polled[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      char buffer[4096];
      const ssize_t n = read(fds[i], buffer, sizeof buffer);
      if (n > 0) {
        sinks[i]->append(buffer, static_cast<std::size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(fds[i]);
        fds[i] = -1;
      }
    }
  }
  for (int fd : fds)
    if (fd >= 0) close(fd);
  int status = 0;
  while (waitpid(outer, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) {
    run.exit_code = WEXITSTATUS(status);
    if (run.exit_code > 128 && run.exit_code < 128 + 65) run.signal = run.exit_code - 128;
  } else {
    run.signal = WTERMSIG(status);
  }
  return run;
}

SandboxRun run_script(const Policy& policy, const std::string& script, Steps steps) {
  return run_in_sandbox(policy, {"/bin/sh", "-c", script}, steps);
}

std::string probe_path() {
  return rlm::test::bin_path("child_setup_probe");
}

Policy test_policy() {
  Policy policy = load_policy("default");
  policy.limits.tmpfs_bytes = 1 << 20;
  Mount probe;
  probe.source = probe_path();
  probe.target = "/probe";
  policy.filesystem.mounts.push_back(probe);
  return policy;
}

std::vector<std::string> lines_with(const std::string& text, const std::string& needle) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);)
    if (line.find(needle) != std::string::npos) lines.push_back(line);
  return lines;
}

std::string mount_options(const std::string& mountinfo, const std::string& point) {
  std::string options;
  std::istringstream in(mountinfo);
  for (std::string line; std::getline(in, line);) {
    std::istringstream fields(line);
    std::string id, parent, device, root, mount_point, opts;
    if (fields >> id >> parent >> device >> root >> mount_point >> opts && mount_point == point)
      options = opts;  // the last one is on top
  }
  return options;
}

}  // namespace rlm::ns::test
