// This server as one node of a fleet (docs/fleet.md): its id, its cap on runs and sessions at once
// (max_sandboxes: past it a request is refused "resource_exhausted" at once, never queued, so a
// client's placement tries another node), whether it is draining, and the node contract's
// answers: health, ready and capacity.
#pragma once

#include <sys/types.h>

#include <atomic>
#include <cstddef>
#include <map>
#include <mutex>
#include <string>

#include <nlohmann/json.hpp>

namespace rlm::server {

struct Offer;
class Activities;

class Node {
 public:
  // `max_sandboxes` 0: no cap of its own (the pools and the host's limits still bound it).
  // `per_uid`: the most of them one uid may hold, the server's own uid (`owner`) excepted; 0: all.
  Node(std::string id, std::size_t max_sandboxes, std::size_t per_uid = 0, uid_t owner = 0);
  Node(const Node&) = delete;
  Node& operator=(const Node&) = delete;

  const std::string& id() const { return id_; }
  std::size_t max_sandboxes() const { return max_sandboxes_; }

  // One run's or session's place under max_sandboxes, from its request to its end. Starting until
  // started() (a session's sandbox and worker coming up), then running.
  class Slot {
   public:
    Slot() = default;
    Slot(Node* node, uid_t uid) : node_(node), uid_(uid) {}
    Slot(Slot&& other) noexcept : node_(other.node_), uid_(other.uid_), running_(other.running_) {
      other.node_ = nullptr;
    }
    Slot& operator=(Slot&&) = delete;
    ~Slot() { release(); }
    void started();
    // Gives the place back now: before the answer that ends the run or session is sent, so a
    // client that asks again at once finds it free.
    void release();

   private:
    Node* node_ = nullptr;
    uid_t uid_ = 0;
    bool running_ = false;
  };
  // For a client of `uid`. Throws Refusal("draining") while the node drains,
  // Refusal("resource_exhausted") when max_sandboxes runs and sessions are held already, or `uid`
  // holds its share.
  Slot take(uid_t uid);

  // Runs and sessions holding a slot now, starting or running.
  std::size_t held() const;

  // Drain: ready turns false and new runs and sessions are refused; those running go on.
  void begin_drain() { draining_ = true; }
  bool draining() const { return draining_; }
  // The drain's grace ran out: what still runs is ended, a run with status node_drained.
  void mark_drained() { drained_ = true; }
  bool drained() const { return drained_; }

  // {"op":"health","alive":true,"node":ID,"pid":N}
  nlohmann::json health() const;
  // {"op":"ready","ready":BOOL,"node":ID,"why":[...]}: ready when not draining and every pool
  // holds its minimum of warm sandboxes and sessions; `why` says what is missing otherwise.
  nlohmann::json readiness(const std::map<std::string, Offer>& offers) const;
  // {"op":"capacity","node_id","version","features":{...},"cores","memory_bytes",
  //  "memory_available_bytes","max_sandboxes","running","starting","warm_idle":{POOL:{...}},
  //  "pressure":{...},"draining","ready"}: docs/fleet.md.
  nlohmann::json capacity(const std::map<std::string, Offer>& offers) const;

 private:
  const std::string id_;
  const std::size_t max_sandboxes_;
  std::atomic<bool> draining_{false}, drained_{false};
  mutable std::mutex mutex_;
  const std::size_t per_uid_;
  const uid_t owner_;
  std::size_t starting_ = 0, running_ = 0;  // slots held, under mutex_
  std::map<uid_t, std::size_t> held_by_;    // and by whom
  mutable std::once_flag features_once_;
  mutable nlohmann::json features_;  // probed once, on the first capacity request
};

// The host's name, for a node id nobody gave.
std::string default_node_id();

// Writes DIR/NODE_ID.endpoint holding "unix:" and `socket_path` made absolute (aside first, then
// renamed, so a client never reads half of it); returns its path, "" when `dir` is "". Throws
// Error when it cannot, or when there is no socket path (an inherited socket).
std::string register_endpoint(const std::string& dir, const std::string& node_id,
                              const std::string& socket_path);
// Removes `file` (register_endpoint's) if it still names `socket_path`: a node registered later
// under the same id (a restart, or a duplicate id) keeps its own.
void unregister_endpoint(const std::string& file, const std::string& socket_path);

}  // namespace rlm::server
