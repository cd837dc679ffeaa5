#include "server/node.hpp"

#include <fcntl.h>
#include <sched.h>
#include <stdlib.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "landlock/landlock.hpp"
#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/error.hpp"
#include "server/connection.hpp"

#ifndef RLM_SANDBOX_VERSION
#define RLM_SANDBOX_VERSION "unknown"
#endif

namespace rlm::server {
namespace {

using nlohmann::json;

// The backends that work here, the cgroup version the namespace backend found, and the Landlock
// ABI: what a client's placement filters nodes by.
json probe_features() {
  json backends = json::array();
  std::string cgroup = "none";
  for (const char* name : {"namespace", "landlock", "docker", "local"}) {
    Health health;
    try {
      const auto backend = make_backend(name);
      if (!backend) continue;
      health = backend->health();
    } catch (const std::exception&) {  // this build cannot use it at all (a static one: docker)
      continue;
    }
    if (health.available) backends.push_back(name);
    if (std::string_view(name) == "namespace" && health.host.is_object())
      cgroup = health.host.value("cgroup", "none");
  }
  return {{"backends", std::move(backends)},
          {"cgroup", cgroup},
          {"landlock_abi", landlock::abi_version()},
          {"sessions", true}};
}

// The cores this process may run on.
std::size_t usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0) return static_cast<std::size_t>(CPU_COUNT(&set));
  const long online = sysconf(_SC_NPROCESSORS_ONLN);
  return online > 0 ? static_cast<std::size_t>(online) : 1;
}

// /proc/meminfo's value for `key` ("MemTotal"), in bytes; 0 when absent.
std::uint64_t meminfo_bytes(const std::string& key) {
  std::ifstream in("/proc/meminfo");
  std::string name;
  std::uint64_t kib = 0;
  std::string unit;
  while (in >> name >> kib) {
    std::getline(in, unit);
    if (name == key + ":") return kib * 1024;
  }
  return 0;
}

// PSI's "some avg10" of cpu, memory and io (percent of the last 10 s some task waited); null for
// a resource whose file is missing (a kernel without PSI).
json pressure() {
  json out = json::object();
  for (const char* resource : {"cpu", "memory", "io"}) {
    std::ifstream in(std::string("/proc/pressure/") + resource);
    std::string line;
    out[resource] = nullptr;
    if (!std::getline(in, line)) continue;
    const auto at = line.find("avg10=");
    if (line.rfind("some", 0) != 0 || at == std::string::npos) continue;
    try {
      out[resource] = std::stod(line.substr(at + 6));
    } catch (const std::exception&) {
    }
  }
  return out;
}

// Each pool's warm sandboxes and sessions idle now, and its minimum.
json warm_idle(const std::map<std::string, Offer>& offers) {
  json pools = json::object();
  for (const auto& [name, offer] : offers) {
    const PoolStats stats = offer.pool->stats();
    pools[name] = {{"sandboxes", stats.ready_sandboxes},
                   {"sessions", stats.ready_sessions},
                   {"min_sandboxes", offer.offered.sandboxes},
                   {"min_sessions", offer.offered.sessions}};
  }
  return pools;
}

}  // namespace

Node::Node(std::string id, std::size_t max_sandboxes, std::size_t per_uid, uid_t owner)
    : id_(std::move(id)), max_sandboxes_(max_sandboxes), per_uid_(per_uid), owner_(owner) {}

void Node::Slot::release() {
  if (!node_) return;
  std::lock_guard lock(node_->mutex_);
  --(running_ ? node_->running_ : node_->starting_);
  if (const auto held = node_->held_by_.find(uid_);
      held != node_->held_by_.end() && --held->second == 0)
    node_->held_by_.erase(held);
  node_ = nullptr;
}

void Node::Slot::started() {
  if (!node_ || running_) return;
  std::lock_guard lock(node_->mutex_);
  --node_->starting_;
  ++node_->running_;
  running_ = true;
}

Node::Slot Node::take(uid_t uid) {
  if (draining_)
    throw Refusal("draining", "node " + id_ +
                                  " is draining: it takes no new runs or sessions (place this "
                                  "one on another node)");
  std::lock_guard lock(mutex_);
  if (max_sandboxes_ && starting_ + running_ >= max_sandboxes_)
    throw Refusal("resource_exhausted",
                  "node " + id_ + " holds its maximum of " + std::to_string(max_sandboxes_) +
                      " runs and sessions at once (--max-sandboxes); place this one on another "
                      "node or try again when one ends");
  std::size_t& mine = held_by_[uid];
  if (per_uid_ && uid != owner_ && mine >= per_uid_) {
    if (mine == 0) held_by_.erase(uid);
    throw Refusal("resource_exhausted",
                  "uid " + std::to_string(uid) + " holds its share of node " + id_ + ": " +
                      std::to_string(per_uid_) +
                      " runs and sessions at once (--max-sandboxes-per-uid); try again when one "
                      "of them ends");
  }
  ++mine;
  ++starting_;
  return Slot(this, uid);
}

std::size_t Node::held() const {
  std::lock_guard lock(mutex_);
  return starting_ + running_;
}

json Node::health() const {
  return {{"op", "health"}, {"alive", true}, {"node", id_}, {"pid", getpid()}};
}

json Node::readiness(const std::map<std::string, Offer>& offers) const {
  json why = json::array();
  if (draining_) why.push_back("node " + id_ + " is draining");
  for (const auto& [name, offer] : offers) {
    const PoolStats stats = offer.pool->stats();
    if (stats.ready_sandboxes < offer.offered.sandboxes)
      why.push_back("pool " + name + " holds " + std::to_string(stats.ready_sandboxes) +
                    " of its " + std::to_string(offer.offered.sandboxes) + " warm sandboxes");
    if (stats.ready_sessions < offer.offered.sessions)
      why.push_back("pool " + name + " holds " + std::to_string(stats.ready_sessions) + " of its " +
                    std::to_string(offer.offered.sessions) + " warm sessions");
  }
  // A pool refilling after a run is not ready for that moment: it would serve the next one cold.
  return {{"op", "ready"}, {"node", id_}, {"ready", why.empty()}, {"why", why}};
}

json Node::capacity(const std::map<std::string, Offer>& offers) const {
  std::call_once(features_once_, [this] { features_ = probe_features(); });
  std::size_t starting = 0, running = 0;
  {
    std::lock_guard lock(mutex_);
    starting = starting_;
    running = running_;
  }
  return {{"op", "capacity"},
          {"node_id", id_},
          {"version", RLM_SANDBOX_VERSION},
          {"features", features_},
          {"cores", usable_cores()},
          {"memory_bytes", meminfo_bytes("MemTotal")},
          {"memory_available_bytes", meminfo_bytes("MemAvailable")},
          {"max_sandboxes", max_sandboxes_},
          {"running", running},
          {"starting", starting},
          {"warm_idle", warm_idle(offers)},
          {"pressure", pressure()},
          {"draining", draining()},
          {"ready", readiness(offers)["ready"]}};
}

std::string register_endpoint(const std::string& dir, const std::string& node_id,
                              const std::string& socket_path) {
  if (dir.empty()) return {};
  if (socket_path.empty())
    throw Error("--register needs --socket: an inherited socket has no path to tell clients");
  std::error_code error;
  const std::string socket = std::filesystem::absolute(socket_path, error).string();
  const std::string file = dir + "/" + node_id + ".endpoint";
  // Created anew under a name nobody can guess ahead, never through what another user of a shared
  // directory put there.
  std::string aside = dir + "/." + node_id + ".endpoint.XXXXXX";
  const int fd = mkostemp(aside.data(), O_CLOEXEC);
  if (fd < 0) throw Error("--register " + dir + ": cannot create a file in it");
  fchmod(fd, 0644);
  const std::string line = "unix:" + socket + "\n";
  const bool written = write(fd, line.data(), line.size()) == static_cast<ssize_t>(line.size());
  close(fd);
  if (!written) {
    unlink(aside.c_str());
    throw Error("--register " + dir + ": cannot write " + aside);
  }
  if (std::rename(aside.c_str(), file.c_str()) != 0) {
    std::remove(aside.c_str());
    throw Error("--register " + dir + ": cannot write " + file);
  }
  return file;
}

void unregister_endpoint(const std::string& file, const std::string& socket_path) {
  if (file.empty()) return;
  std::error_code error;
  const std::string ours = "unix:" + std::filesystem::absolute(socket_path, error).string() + "\n";
  // Read as the directory's other users may have left it: never through a symlink, never waiting
  // on a FIFO, never more than our own line.
  const int fd = open(file.c_str(), O_RDONLY | O_NOFOLLOW | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return;
  struct stat status {};
  std::string text(ours.size() + 1, '\0');
  ssize_t got = -1;
  if (fstat(fd, &status) == 0 && S_ISREG(status.st_mode)) got = read(fd, text.data(), text.size());
  close(fd);
  if (got == static_cast<ssize_t>(ours.size()) && text.compare(0, ours.size(), ours) == 0)
    unlink(file.c_str());
}

std::string default_node_id() {
  char name[256] = {};
  if (gethostname(name, sizeof name - 1) != 0 || name[0] == '\0') return "node";
  return name;
}

}  // namespace rlm::server
