// A fleet: several `rlm-sandbox serve` nodes, each kept alive by the site's engine, and the
// placement of runs and sessions among them done here, in the client (docs/fleet.md). A request
// goes to the best of K nodes chosen at random, scored by the free room their `capacity` reports;
// a node that refuses it ("resource_exhausted", "draining") or does not answer is passed over
// for the next. A session stays on its node; when that node dies, its calls fail saying
// node_lost. Nothing is shared between clients or nodes: a session's id names its node.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <random>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/client.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/request.hpp"
#include "rlm_sandbox/result.hpp"
#include "rlm_sandbox/session.hpp"

namespace rlm {

// A fleet's endpoints from `source`:
//  - a directory: every regular file named *.endpoint in it holds one endpoint (what
//    `rlm-sandbox serve --register DIR` writes; a node removes its file when it exits);
//  - a file: one endpoint per line; blank lines and '#' comments are skipped;
//  - "slurm:PORT": tls://HOST:PORT for every host of the Slurm job this runs in
//    ($SLURM_JOB_NODELIST, e.g. "node[01-03]"), the TLS listeners the pilot's nodes open.
// An endpoint is "unix:PATH" or an absolute PATH of a server's socket, or "tls://HOST:PORT" of a
// server's TLS listener. Throws Error naming the
// source (and line) for one that cannot be read, holds none, or names an endpoint of another kind.
std::vector<std::string> read_fleet(const std::string& source);

// What ServerConnection takes for `endpoint`: the socket path of "unix:/run/a.sock" or
// "/run/a.sock", or "tls://HOST:PORT" itself; throws Error for any other kind.
std::string endpoint_socket(const std::string& endpoint);

struct FleetOptions {
  std::size_t choices = 3;  // K: nodes asked for their capacity per placement (at least 1)
  // Backends a node must offer (its capacity's features.backends), e.g. {"namespace"}.
  std::vector<std::string> backends;
  std::optional<uid_t> server_uid;  // as for ServerConnection
  std::optional<TlsFiles> tls;      // for tls:// nodes, as for ServerConnection
  // How long a node may take to answer `capacity` before it is passed over (one stopped but
  // still accepting must not stall every placement that samples it).
  std::chrono::milliseconds ask_timeout{2000};
  std::uint64_t seed = 0;  // of the random choice; 0: from std::random_device
};

// One node as status() found it.
struct FleetNode {
  std::string endpoint;
  std::optional<nlohmann::json> capacity;  // its answer; nullopt when it did not give one
  std::string error;                       // why not
  nlohmann::json to_json() const;          // the capacity with "endpoint", or {endpoint, error}
};

class Fleet {
 public:
  // Throws Error for no endpoints or choices of 0.
  explicit Fleet(std::vector<std::string> endpoints, FleetOptions options = {});

  const std::vector<std::string>& endpoints() const { return endpoints_; }

  // Every node's capacity, in the endpoints' order.
  std::vector<FleetNode> status() const;

  // Places `request` (under the offered policy `policy_name`, tightened to `overrides`) on a node
  // and runs it there; the Result names its node. Throws ServerRefused "resource_exhausted" when
  // every node refused it or was unreachable (saying each one's reason), and a node's other
  // refusals (an unknown policy, a loosening) as they are: the next node would say the same.
  Result run(const Request& request, const std::string& policy_name,
             const Policy* overrides = nullptr);
  // The offered policy `name` as the first node that answers has it (the nodes of a fleet offer
  // the same), a base for a client to tighten. Throws ServerRefused when none answers.
  Policy policy(const std::string& name) const;
  // A session placed the same way; it stays on its node (Session::node()).
  std::unique_ptr<Session> open_session(const std::string& policy_name, const Policy* overrides,
                                        SessionOptions options);

 private:
  template <typename Attempt>
  auto place(Attempt&& attempt);

  std::vector<std::string> endpoints_;
  FleetOptions options_;
  std::mutex random_mutex_;
  std::mt19937_64 random_;
};

// A Backend named "fleet" over `fleet`: run and open_session place each request as Fleet does,
// asking each node for policy.name with `policy` as the tightened candidate.
std::unique_ptr<Backend> make_fleet_client(std::shared_ptr<Fleet> fleet);

}  // namespace rlm
