// One long-lived container per session: made on the first run from the session's policy, with a
// keep-alive command under Docker's init, and each run an exec in it (so files in /tmp and other
// writable mounts persist from one run to the next). Runs may be concurrent; they share the
// container and its limits (memory, pids, CPU bandwidth). A run that hits its wall time, its CPU
// time (the container's, from the run's start: concurrent runs count too) or output cap, or is
// stopped by its caller, stops the whole container -- every process in it, the only way Docker
// offers to stop an exec's process tree -- and the next run starts a fresh one. close() removes it.
//
// The keep-alive command is `/bin/sh -c 'while :; do sleep 3600; done'`, so the image needs a
// shell and sleep (a distroless image can still serve one-shot runs).
#pragma once

#include <atomic>
#include <memory>
#include <mutex>
#include <string>

#include "docker/engine_api.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/request.hpp"
#include "rlm_sandbox/result.hpp"

namespace rlm::docker {

class DockerSessionContainer {
 public:
  // Nothing is created yet. Throws NeedsFullBinary without an HTTP client, Error for a policy
  // Docker cannot honour (checked against the daemon, which must answer).
  explicit DockerSessionContainer(Policy policy, std::string session_id = "");
  ~DockerSessionContainer();
  DockerSessionContainer(const DockerSessionContainer&) = delete;
  DockerSessionContainer& operator=(const DockerSessionContainer&) = delete;

  // One execution in the session's container, which is created on first use. Thread-safe.
  // Same contract as Backend::run: a failing payload is a Result, an invalid request an Error.
  Result run(const Request& request);

  // Removes the container; later runs throw Error. Idempotent; never throws.
  void close() noexcept;

  const std::string& session_id() const { return session_id_; }
  // The current container's id, "" when there is none (before the first run, after close()).
  std::string container_id() const;

 private:
  struct Container;
  std::shared_ptr<Container> acquire();
  void retire(const std::shared_ptr<Container>& container, bool stop_first) noexcept;

  Policy policy_;
  std::string session_id_;
  EngineApi api_;
  mutable std::mutex mutex_;
  std::shared_ptr<Container> current_;
  bool closed_ = false;
};

}  // namespace rlm::docker
