// A docker run under an egress allowlist (docs/network.md, "docker"): the payload's container
// joins the network namespace of a holder container (NetworkMode "container:<holder>"), which
// this process sets up before the payload's is even created -- every destination made local and
// a listener per allowed port, laid by a thread of this process that joins the holder's
// namespace (netns/egress_capture.hpp) -- and whose listeners the host side serves
// (egress/proxy.hpp), exactly as for the namespace backend. The holder runs the image's `sleep`
// as nobody, with no capability, no network and 64 MiB; nothing of ours runs in either
// container. It carries the run's labels, so a crashed runtime's holder is collected with its
// payload.
#pragma once

#include <chrono>
#include <memory>
#include <optional>
#include <string>

#include "docker/container_control.hpp"
#include "docker/engine_api.hpp"
#include "docker/trust_store.hpp"
#include "egress/proxy.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm::docker {

class EgressHolder {
 public:
  // Creates and starts the holder and the host side. Throws DaemonError for the daemon's
  // refusals and Error for everything else (the image has no `sleep`, the holder's namespace
  // cannot be joined from here: another host, another PID namespace, not root), each saying so.
  // `remaps_users`: the daemon's userns-remap (its containers' capabilities are not the host's).
  EgressHolder(const EngineApi& api, const Policy& policy, bool remaps_users,
               const std::string& run_id, std::chrono::steady_clock::time_point deadline);
  ~EgressHolder();  // stops the host side and removes the holder
  EgressHolder(const EgressHolder&) = delete;
  EgressHolder& operator=(const EgressHolder&) = delete;

  // The payload container's NetworkMode.
  std::string network_mode() const { return "container:" + id_; }
  // With injected credentials, the payload's extra mount: the trust store, read-only at
  // kInjectionTrustBundle (a file of this run's own directory on the host); null otherwise.
  nlohmann::json trust_mount() const;
  egress::EgressProxy& proxy() { return *proxy_; }
  // Ends the host side (every connection) and returns what the sandbox did; then removes the
  // holder, returning the problem in `removal` ("" when it is gone).
  NetworkAccount finish(std::string& removal);

 private:
  ContainerRemover remover_;
  std::string id_;
  std::optional<TrustFile> trust_file_;  // with injected credentials
  std::unique_ptr<egress::EgressProxy> proxy_;
};

// The holder's POST /containers/create body (container_spec_test checks it).
nlohmann::json holder_create_body(const Policy& policy, const std::string& run_id);

}  // namespace rlm::docker
