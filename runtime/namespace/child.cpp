#include "namespace/child.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>

#include <string>

#include "namespace/setup_fix.hpp"
#include "process/child_failure.hpp"
#include "rlm_init/protocol.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"
#include "supervisor/launch.hpp"

namespace rlm::ns {
namespace {

constexpr int kFirstFreeFd = init_protocol::kReportFd + 1;

[[noreturn]] void fail(const ChildPlan& plan, const process::ChildFailure& failure) noexcept {
  fail_child(plan.error_write, failure);
}

[[noreturn]] void fail(const ChildPlan& plan, const char* step) noexcept {
  fail_child(plan.error_write, step);
}

}  // namespace

void fail_child(int error_write, const process::ChildFailure& failure) noexcept {
  process::exit_with_failure(error_write, failure, init_protocol::kInitFailureExit);
}

void fail_child(int error_write, const char* step) noexcept {
  fail_child(error_write, process::ChildFailure::at(step, errno));
}

void exec_init(const InitExec& exec, int error_write) noexcept {
  if (!exec.launch->install_stdio()) fail_child(error_write, "dup2 (stdio and report pipe)");
  supervisor::KeptFds keep = exec.launch->inherited();  // the request's fds, then ours
  keep[supervisor::kMaxInheritedFds] = exec.pass_fds[0];
  keep[supervisor::kMaxInheritedFds + 1] = exec.pass_fds[1];
  if (!supervisor::clear_cloexec(keep)) fail_child(error_write, "fcntl (inherited fds)");
  keep[supervisor::kMaxInheritedFds + 2] = error_write;
  keep[supervisor::kMaxInheritedFds + 3] = exec.init_fd;
  keep[supervisor::kMaxInheritedFds + 4] = exec.landlock ? exec.landlock->ruleset_fd() : -1;
  supervisor::close_fds_except(kFirstFreeFd, keep, exec.max_fd);

  process::ChildFailure failure;
  if (exec.privileges && !exec.privileges->apply(failure)) fail_child(error_write, failure);
  // Last: no_new_privs is set, and nothing after it mounts or opens a path but init's exec.
  if (exec.landlock && !exec.landlock->apply(failure)) fail_child(error_write, failure);
  syscall(SYS_execveat, exec.init_fd, "", exec.launch->argv(), exec.launch->envp(), AT_EMPTY_PATH);
  fail_child(error_write, "execveat (rlm-sandbox-init)");
}

void run_child(const ChildPlan& plan) noexcept {
  // The sandbox's own file-creation mask, not whatever the host process had at the clone (an
  // embedding program's choice, or another thread's brief change): the root filesystem gets the
  // modes its plan names, and init passes the same mask to the payload.
  umask(init_protocol::kPayloadUmask);
  // Our copies of the parent's ends, so that the parent's exit reads as EOF/POLLHUP here.
  close(plan.release_write);
  close(plan.error_read);
  char go = 0;
  ssize_t got;
  while ((got = read(plan.release_read, &go, 1)) < 0 && errno == EINTR) {
  }
  if (got != 1) _exit(init_protocol::kInitFailureExit);  // the parent gave up on us

  // Into the run's cgroups (v1) while our euid is still the runtime's, which may write there.
  for (int fd : plan.join_cgroup_fds)
    if (fd >= 0 && write(fd, "0", 1) != 1) fail(plan, "joining the run's cgroup (tasks)");

  process::ChildFailure failure;
  if (!apply_ids(*plan.ids, /*set_namespace_limits=*/true, failure)) fail(plan, failure);
  // After the id change, which clears the parent-death signal. If the runtime dies from here on,
  // PID 1 of the namespace dies and the kernel kills everything in it. The parent holds the
  // release pipe open until the exec, so a hangup there means it died before the prctl.
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail(plan, "prctl(PR_SET_PDEATHSIG)");
  pollfd parent{plan.release_read, POLLIN, 0};
  if (poll(&parent, 1, 0) != 0) _exit(init_protocol::kInitFailureExit);
  // No controlling terminal: /dev/tty cannot reach the host's terminal, and the host's job-control
  // signals do not reach the sandbox.
  if (setsid() < 0) fail(plan, "setsid");
  // Now that the parent has put us in the run's cgroup, that cgroup becomes our root.
  if (plan.cgroup_namespace && unshare(CLONE_NEWCGROUP) != 0)
    fail(plan, "unshare(CLONE_NEWCGROUP)");
  if (plan.rootfs && !plan.rootfs->apply(failure)) fail(plan, failure);
  if (plan.hostname && sethostname(plan.hostname, plan.hostname_length) != 0)
    fail(plan, "sethostname");
  if (plan.loopback && !plan.loopback->apply(failure)) fail(plan, failure);
  if (plan.egress && !plan.egress->apply(failure)) fail(plan, failure);

  exec_init(plan.exec, plan.error_write);
}

void wait_for_exec(int error_read, int timeout_ms) {
  const auto report = process::read_child_report(error_read, timeout_ms);
  switch (report.kind) {
    case process::ChildReport::Kind::exec:
      return;  // the pipe closed on the exec
    case process::ChildReport::Kind::timed_out:
      throw SetupError("setup timed out", ETIMEDOUT);
    case process::ChildReport::Kind::unreadable:
      throw SetupError("reading the setup result", report.failure.error);
    case process::ChildReport::Kind::failed:
      break;
  }
  throw SetupError(report.failure.step, report.failure.error);
}

}  // namespace rlm::ns
