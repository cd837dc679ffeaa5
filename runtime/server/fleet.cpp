// Placement across a fleet's nodes, in the client (rlm_sandbox/fleet.hpp, docs/fleet.md).
#include "rlm_sandbox/fleet.hpp"

#include <dirent.h>
#include <sys/stat.h>

#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <limits>
#include <numeric>

#include "rlm_sandbox/client.hpp"
#include "rlm_sandbox/error.hpp"
#include "server/client_wire.hpp"
#include "server/slurm_hostlist.hpp"
#include "server/tls.hpp"
#include "server/tls_relay.hpp"

namespace rlm {
namespace {

using nlohmann::json;

constexpr std::size_t kMaxEndpoints = 100'000;
constexpr std::size_t kMaxEndpointBytes = 4096;

std::string trimmed(std::string text) {
  const auto first = text.find_first_not_of(" \t\r");
  if (first == std::string::npos) return {};
  const auto last = text.find_last_not_of(" \t\r");
  return text.substr(first, last - first + 1);
}

// A refusal a node gives for itself (full, draining, not serving now, gone): the next node may
// take the request. Other kinds (a policy not offered, a loosening) would be the same anywhere.
bool passes_over(const ServerRefused& refused) {
  const std::string& kind = refused.kind();
  return kind == "resource_exhausted" || kind == "draining" || kind == "unavailable";
}

// The room a node has by its capacity: free slots, or a large number less what runs for a node
// with no cap of its own; nullopt when it cannot take work (draining, full, lacking a backend).
std::optional<double> room(const json& capacity, const std::vector<std::string>& backends,
                           std::string& why) {
  if (capacity.value("draining", false)) {
    why = "draining";
    return std::nullopt;
  }
  const json offered = capacity.value("features", json::object()).value("backends", json::array());
  for (const auto& backend : backends)
    if (std::find(offered.begin(), offered.end(), backend) == offered.end()) {
      why = "has no " + backend + " backend";
      return std::nullopt;
    }
  const auto count = [&](const char* key) {  // at most a billion: room stays finite and exact
    const json value = capacity.value(key, json());
    return value.is_number_unsigned() ? static_cast<double>(std::min<std::uint64_t>(
                                            value.get<std::uint64_t>(), 1'000'000'000))
                                      : 0.0;
  };
  const double held = count("running") + count("starting");
  const double max = count("max_sandboxes");
  if (max > 0 && held >= max) {
    why = "full (" + std::to_string(static_cast<std::uint64_t>(held)) + " of " +
          std::to_string(static_cast<std::uint64_t>(max)) + ")";
    return std::nullopt;
  }
  // Warm sandboxes and sessions idle break ties: the request is served warm there.
  double warm = 0;
  const json pools = capacity.value("warm_idle", json::object());
  for (const auto& [name, pool] : pools.items())
    if (pool.is_object())
      for (const char* key : {"sandboxes", "sessions"})
        warm += std::clamp(pool.value(key, 0.0), 0.0, 1000.0);  // NaN and -inf cannot get in
  const double free = (max > 0 ? max - held : 1e9 - held) + std::min(warm, 1000.0) / 1e4;
  if (!std::isfinite(free)) {
    why = "its capacity answer is malformed";
    return std::nullopt;
  }
  return free;
}

// The node's capacity, connected to, asked and answered within `timeout` all told, the answer at
// most 64 KiB: a node that is stopped, never accepts or trickles is passed over, not waited on.
json ask_capacity(const std::string& socket_path, const FleetOptions& options) {
  const auto deadline = server::Clock::now() + options.ask_timeout;
  const auto socket =
      server::connect_to_server(socket_path, options.server_uid, deadline, options.tls);
  try {
    server::send_frame(socket.get(), {{"op", "capacity"}}, deadline);
  } catch (const server::WireError& error) {
    throw server::ConnectionLost(std::string("the node dropped the connection: ") + error.what());
  }
  json reply = server::server_reply_within(socket.get(), deadline, 64u << 10);
  if (reply.value("op", "") != "capacity")
    throw ServerRefused("internal", "the node answered out of turn");
  return reply;
}

// "slurm:PORT": a node's TLS listener on PORT of every host of the Slurm job this client runs in
// (the pilot's nodes, packaging/slurm), from SLURM_JOB_NODELIST.
std::vector<std::string> slurm_job_endpoints(const std::string& source) {
  const std::string port = source.substr(6);
  if (!server::split_host_port("host:" + port))  // the port as any tls:// endpoint's
    throw Error("fleet " + source + ": expected slurm:PORT, the port of the nodes' TLS listeners");
  const char* list = std::getenv("SLURM_JOB_NODELIST");
  if (list == nullptr || *list == '\0') list = std::getenv("SLURM_NODELIST");
  if (list == nullptr || *list == '\0')
    throw Error("fleet " + source +
                ": SLURM_JOB_NODELIST is not set (is this inside a Slurm job's allocation?)");
  std::vector<std::string> endpoints;
  try {
    for (auto& host : server::expand_slurm_hostlist(list, kMaxEndpoints))
      endpoints.push_back("tls://" + host + ":" + port);
  } catch (const Error& error) {
    throw Error("fleet " + source + ": " + error.what());
  }
  return endpoints;
}

}  // namespace

std::string endpoint_socket(const std::string& endpoint) {
  if (server::is_tls_endpoint(endpoint)) {
    if (!server::split_host_port(std::string_view(endpoint).substr(6)))
      throw Error("endpoint '" + endpoint + "': expected tls://HOST:PORT");
    return endpoint;
  }
  std::string path = endpoint.rfind("unix:", 0) == 0 ? endpoint.substr(5) : endpoint;
  if (path.empty() || path.front() != '/')
    throw Error("endpoint '" + endpoint +
                "': expected unix:/PATH or /PATH of a server's socket, or tls://HOST:PORT of "
                "its TLS listener");
  return path;
}

std::vector<std::string> read_fleet(const std::string& source) {
  if (source.rfind("slurm:", 0) == 0) return slurm_job_endpoints(source);
  std::vector<std::string> endpoints;
  struct stat status {};
  if (stat(source.c_str(), &status) != 0)
    throw Error("fleet " + source + ": no such file or directory");
  const auto add = [&](std::string endpoint, const std::string& where) {
    endpoint = trimmed(std::move(endpoint));
    if (endpoint.size() > kMaxEndpointBytes) throw Error(where + ": an endpoint this long");
    try {
      endpoint_socket(endpoint);
    } catch (const Error& error) {
      throw Error(where + ": " + error.what());
    }
    if (endpoints.size() >= kMaxEndpoints)
      throw Error("fleet " + source + ": more than " + std::to_string(kMaxEndpoints) + " nodes");
    endpoints.push_back(std::move(endpoint));
  };
  if (S_ISDIR(status.st_mode)) {
    std::vector<std::string> names;
    if (DIR* dir = opendir(source.c_str())) {
      while (const dirent* entry = readdir(dir)) {
        const std::string name = entry->d_name;
        if (name.size() > 9 && name.compare(name.size() - 9, 9, ".endpoint") == 0)
          names.push_back(name);
      }
      closedir(dir);
    } else {
      throw Error("fleet " + source + ": cannot read the directory");
    }
    std::sort(names.begin(), names.end());
    // Each file as a node wrote it: never through a symlink, never waiting on a FIFO, at most
    // 4 KiB; one that is not a good endpoint is skipped, so a stray or hostile file in a shared
    // directory does not take the fleet down (the registry should be writable by the nodes'
    // operator alone: docs/fleet.md).
    for (const auto& name : names) {
      const std::string path = source + "/" + name;
      const int fd = open(path.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
      if (fd < 0) continue;
      struct stat file {};
      std::string text(kMaxEndpointBytes + 1, '\0');
      ssize_t got = -1;
      if (fstat(fd, &file) == 0 && S_ISREG(file.st_mode)) got = read(fd, text.data(), text.size());
      close(fd);
      if (got <= 0 || static_cast<std::size_t>(got) > kMaxEndpointBytes) continue;
      text.resize(static_cast<std::size_t>(got));
      std::string line = trimmed(text.substr(0, text.find('\n')));
      if (line.empty()) continue;  // being written
      try {
        add(line, "fleet " + path);
      } catch (const Error&) {
        continue;  // not an endpoint this client can use
      }
      if (endpoints.size() >= kMaxEndpoints) break;
    }
  } else {
    std::ifstream in(source);
    if (!in) throw Error("fleet " + source + ": cannot read it");
    std::string line;
    for (std::size_t number = 1; std::getline(in, line); ++number) {
      if (const auto hash = line.find('#'); hash != std::string::npos) line.resize(hash);
      if (trimmed(line).empty()) continue;
      add(line, "fleet " + source + " line " + std::to_string(number));
    }
  }
  if (endpoints.empty())
    throw Error(
        "fleet " + source + ": no endpoints in it" +
        (S_ISDIR(status.st_mode) ? " (no *.endpoint file: is a node registered there?)" : ""));
  return endpoints;
}

json FleetNode::to_json() const {
  if (!capacity) return {{"endpoint", endpoint}, {"error", error}};
  json out = *capacity;
  out.erase("op");
  out["endpoint"] = endpoint;
  return out;
}

Fleet::Fleet(std::vector<std::string> endpoints, FleetOptions options)
    : endpoints_(std::move(endpoints)), options_(std::move(options)) {
  if (endpoints_.empty()) throw Error("a fleet needs at least one endpoint");
  if (options_.choices == 0) throw Error("a fleet's placement asks at least 1 node (choices)");
  for (const auto& endpoint : endpoints_) endpoint_socket(endpoint);
  random_.seed(options_.seed ? options_.seed : std::random_device{}());
}

std::vector<FleetNode> Fleet::status() const {
  std::vector<FleetNode> nodes;
  for (const auto& endpoint : endpoints_) {
    FleetNode node;
    node.endpoint = endpoint;
    try {
      node.capacity = ask_capacity(endpoint_socket(endpoint), options_);
    } catch (const Error& error) {
      node.error = error.what();
    }
    nodes.push_back(std::move(node));
  }
  return nodes;
}

template <typename Attempt>
auto Fleet::place(Attempt&& attempt) {
  std::vector<std::size_t> left(endpoints_.size());
  std::iota(left.begin(), left.end(), 0);
  // The nodes passed over and why: the first few by name, the rest counted (a fleet of
  // thousands must not make a message of thousands).
  constexpr std::size_t kNamed = 8;
  std::string passed;
  std::size_t passed_count = 0;
  const auto pass_over = [&](std::size_t index, const std::string& why) {
    if (passed_count++ < kNamed)
      passed += (passed.empty() ? "" : "; ") + endpoints_[index] + ": " + why;
    left.erase(std::find(left.begin(), left.end(), index));
  };
  while (!left.empty()) {
    // K of the nodes left, at random (the first K after a partial shuffle).
    const std::size_t k = std::min(options_.choices, left.size());
    {
      std::lock_guard lock(random_mutex_);
      for (std::size_t i = 0; i < k; ++i) {
        std::uniform_int_distribution<std::size_t> pick(i, left.size() - 1);
        std::swap(left[i], left[pick(random_)]);
      }
    }
    const std::vector<std::size_t> sample(left.begin(), left.begin() + static_cast<long>(k));
    std::optional<std::size_t> best;
    double best_room = -std::numeric_limits<double>::infinity();
    for (const std::size_t index : sample) {
      std::string why;
      try {
        const json capacity = ask_capacity(endpoint_socket(endpoints_[index]), options_);
        try {
          if (const auto free = room(capacity, options_.backends, why)) {
            if (*free > best_room) best = index, best_room = *free;
            continue;
          }
        } catch (const std::exception&) {  // a field of another type: a node not to trust
          why = "its capacity answer is malformed";
        }
      } catch (const Error& error) {
        why = std::string("unreachable: ") + error.what();
      }
      pass_over(index, why);
    }
    if (!best) continue;
    try {
      return attempt(endpoint_socket(endpoints_[*best]));
    } catch (const ServerRefused& refused) {
      if (!passes_over(refused)) throw;
      pass_over(*best, refused.what());
    }
  }
  if (passed_count > kNamed)
    passed += "; and " + std::to_string(passed_count - kNamed) + " more nodes";
  throw ServerRefused("resource_exhausted", "no node of the fleet could take it: " + passed);
}

Result Fleet::run(const Request& request, const std::string& policy_name, const Policy* overrides) {
  return place([&](const std::string& socket) {
    return ServerConnection(socket, options_.server_uid, options_.tls)
        .run(request, policy_name, overrides);
  });
}

std::unique_ptr<Session> Fleet::open_session(const std::string& policy_name,
                                             const Policy* overrides, SessionOptions options) {
  return place([&](const std::string& socket) {
    // Each attempt gets its own copy: a refused one must leave the options for the next.
    return ServerConnection(socket, options_.server_uid, options_.tls)
        .open_session(policy_name, overrides, options);
  });
}

Policy Fleet::policy(const std::string& name) const {
  std::string why;
  for (const auto& endpoint : endpoints_) {
    try {
      return ServerConnection(endpoint_socket(endpoint), options_.server_uid, options_.tls)
          .policy(name);
    } catch (const ServerRefused& refused) {
      if (!passes_over(refused)) throw;
      why += (why.empty() ? "" : "; ") + endpoint + ": " + refused.what();
    }
  }
  throw ServerRefused("unavailable", "no node of the fleet answered: " + why);
}

namespace {

class FleetBackend final : public Backend {
 public:
  explicit FleetBackend(std::shared_ptr<Fleet> fleet) : fleet_(std::move(fleet)) {}

  std::string_view name() const override { return "fleet"; }
  bool isolated() const override { return true; }
  Health health() const override {
    Health health;
    health.backend = "fleet";
    health.isolated = true;
    json nodes = json::array();
    std::size_t answering = 0;
    for (const auto& node : fleet_->status()) {
      answering += node.capacity ? 1 : 0;
      nodes.push_back(node.to_json());
    }
    health.available = answering > 0;
    health.detail = std::to_string(answering) + " of " +
                    std::to_string(fleet_->endpoints().size()) + " nodes answer";
    health.host = {{"nodes", std::move(nodes)}};
    return health;
  }
  std::string unavailable_reason() const override { return ""; }
  Result run(const Request& request, const Policy& policy) override {
    return fleet_->run(request, policy.name, &policy);
  }
  std::unique_ptr<Session> open_session(const Policy& policy, SessionOptions options) override {
    return fleet_->open_session(policy.name, &policy, std::move(options));
  }

 private:
  std::shared_ptr<Fleet> fleet_;
};

}  // namespace

std::unique_ptr<Backend> make_fleet_client(std::shared_ptr<Fleet> fleet) {
  return std::make_unique<FleetBackend>(std::move(fleet));
}

}  // namespace rlm
