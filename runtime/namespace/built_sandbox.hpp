// A namespace sandbox, built and then launched: the policy's namespaces, root filesystem, cgroup,
// seccomp filter and sandbox uid in place, and rlm-sandbox-init started in await mode
// (rlm_init/protocol.hpp), waiting on a socket for its payload. Nothing of any request is in it
// until launch() hands it one; a sandbox is used once and destroyed.
//
// Every namespace run goes through it: the backend's run() is build() + launch() at once (the
// cold path), and a Pool's sandboxes are built ahead (Backend::build_ahead, the warm path) and
// launched later -- one code path. docs/namespace-backend.md, docs/pools-and-server.md.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/request.hpp"
#include "rlm_sandbox/result.hpp"
#include "supervisor/run_start.hpp"

namespace rlm::ns {

class BuiltSandbox final : public PreparedSandbox {
 public:
  // Builds a sandbox of `policy` whose init is `init_path`, waiting at most until `deadline` for
  // init to start; its read-write binds write as caller_ids(). Throws Error saying what failed;
  // nothing is left behind then.
  static std::unique_ptr<BuiltSandbox> build(const Policy& policy, const std::string& init_path,
                                             std::chrono::steady_clock::time_point deadline);

  // Kills init (and with it everything in the sandbox) unless launch() already reaped it, removes
  // the cgroup (waiting, bounded, for the kernel to let go of it) and frees the sandbox uid.
  ~BuiltSandbox() override;
  BuiltSandbox(const BuiltSandbox&) = delete;
  BuiltSandbox& operator=(const BuiltSandbox&) = delete;

  // Whether launch() can give a policy with these limits what it asks for -- the root
  // filesystem's tmpfs sizes are the built ones, and a CPU bandwidth other than the built one
  // needs a group that has one -- and whether files written through its read-write binds become
  // `bind_owner`'s (a root runtime idmaps them to the owner it was built for, idmap.hpp): a
  // request of another owner needs another sandbox. (Whether
  // the limits are no looser is the caller's to check.)
  bool can_serve(const Limits& limits, const HostIds& bind_owner) const override;

  // Whether init still waits for its payload (it may have been killed from outside meanwhile).
  bool waiting() const override;

  // Runs the request here, once: `policy` is the one the sandbox was built from, or one that
  // differs from it only in limits that are no looser and that can_serve() accepts. The request's
  // limits are applied before the payload starts (the cgroup's memory, pids and CPU bandwidth
  // files, init's rlimits in the message; the wall time, output cap, grace and CPU budget on this
  // side); `run` is the request resolved (its argv and environment are moved into the message),
  // and its clock restarts when the payload is released. Supervises until everything in the
  // sandbox is gone, and returns the Result (a payload that could not start is a sandbox_error).
  Result launch(const Request& request, const Policy& policy, supervisor::RunStart& run);

  // Recycling (PreparedSandbox::recycle, docs/pools-and-server.md#recycled-sandboxes): after a
  // launch, a new init in new PID, IPC, UTS and mount namespaces inside the kept user and network
  // namespaces and cgroup, with a fresh /proc, /dev/shm and writable tmpfs; false -- destroy it --
  // when the policy or host does not allow it (a rootless runtime, cgroup v1, a network other
  // than "none", ...), when the last run left a socket in the network namespace, or when any step
  // fails. Call it on the thread that built the sandbox.
  bool recycle() override;

  // launch() with a RunStart of its own: a Pool's run. Throws Error for an invalid request.
  Result run(const Request& request, const Policy& policy) override;

  // The cold path: build() and launch() at once, except that nobody waits for init's exec. The
  // payload's message is queued on init's socket while the child still builds the sandbox, so
  // init starts its payload without a round trip through this process, and this process sleeps
  // from the release until the report. A failure before the exec is read after supervision.
  // The payload's wall time counts from the release (before init's exec).
  static Result run_cold(const Request& request, const Policy& policy, const std::string& init_path,
                         supervisor::RunStart& run);

 private:
  BuiltSandbox();
  static std::unique_ptr<BuiltSandbox> start(const Policy& policy, const std::string& init_path,
                                             std::chrono::steady_clock::time_point deadline,
                                             bool wait_exec, const HostIds& bind_owner);
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace rlm::ns
