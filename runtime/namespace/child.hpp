// The sandbox's first process between clone and exec: waits for the parent to write its id maps,
// then takes the setup steps in order and execs rlm-sandbox-init by fd. Everything it touches is
// prepared by the parent before clone; it makes raw syscalls only (process/child_start.hpp). A
// failing step is reported as a process::ChildFailure on the error pipe; a successful exec closes
// that pipe.
#pragma once

#include <sys/types.h>

#include <array>
#include <cstddef>

#include "namespace/child_setup.hpp"
#include "namespace/userns.hpp"
#include "netns/egress_capture.hpp"
#include "supervisor/launch.hpp"

namespace rlm::ns {

// The last steps before init, the same for a sandbox's first process (run_child) and a recycled
// sandbox's next init (rearm.hpp): stdio and the report pipe on fds 0-3, the fds init keeps, every
// other fd closed, privileges dropped, Landlock, the exec of rlm-sandbox-init by fd.
struct InitExec {
  const supervisor::InitLaunch* launch = nullptr;
  std::array<int, 2> pass_fds{-1, -1};  // inherited by init (the seccomp memfds)
  const PrivilegePlan* privileges = nullptr;
  const LandlockPlan* landlock = nullptr;  // null: no Landlock (ABI 0, or no mount namespace)
  int init_fd = -1;                        // rlm-sandbox-init, opened on the host; close-on-exec
  unsigned max_fd = 1024;                  // close() ceiling when close_range is missing
};

// A failed step: its ChildFailure on `error_write`, and the exit (raw syscalls only).
[[noreturn]] void fail_child(int error_write, const process::ChildFailure& failure) noexcept;
[[noreturn]] void fail_child(int error_write, const char* step) noexcept;  // with errno

// The steps of InitExec, in order; `error_write` crosses the exec (close-on-exec: EOF on success).
[[noreturn]] void exec_init(const InitExec& exec, int error_write) noexcept;

struct ChildPlan {
  // Pipes: the parent writes one byte on `release` once the maps are written (EOF: give up), and
  // keeps its end open until the exec, so the child can tell whether its parent still exists.
  int release_read = -1, release_write = -1;
  int error_read = -1, error_write = -1;  // ChildFailure records; close-on-exec

  // v1: the run's groups' `tasks` files; the child writes "0" to each, moving itself, before it
  // changes its ids (RunCgroup::self_join_fds). -1: none (v2, or no cgroup).
  std::array<int, 4> join_cgroup_fds{-1, -1, -1, -1};  // memory, pids, cpuacct, cpu
  const IdMapping* ids = nullptr;
  bool cgroup_namespace = false;       // unshare(CLONE_NEWCGROUP) once inside the run's cgroup
  const RootfsPlan* rootfs = nullptr;  // null: no mount namespace
  const char* hostname = nullptr;      // null: no UTS namespace
  std::size_t hostname_length = 0;
  const LoopbackPlan* loopback = nullptr;            // null: no network namespace
  const netns::EgressCapturePlan* egress = nullptr;  // null: no allowlist (after the loopback)
  InitExec exec;
};

[[noreturn]] void run_child(const ChildPlan& plan) noexcept;

// Parent: waits for the child's exec (EOF on `error_read`), at most `timeout_ms` (-1: forever).
// Throws SetupError ("sandbox setup failed: <step>: <error>", with the fix where one is known:
// setup_fix.hpp) with the ChildFailure the child reported, or {"setup timed out", ETIMEDOUT} for a
// child that did not finish in time.
void wait_for_exec(int error_read, int timeout_ms);

}  // namespace rlm::ns
