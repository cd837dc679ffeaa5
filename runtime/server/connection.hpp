// What one client connection's thread works with: its socket, its peer, and the server's offered
// policies. The ops (admission.cpp, run_op.cpp, session_op.cpp) take it; server.cpp owns it.
#pragma once

#include <map>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "host/unique_fd.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/pool.hpp"
#include "rlm_sandbox/server.hpp"
#include "server/activities.hpp"
#include "server/event_log.hpp"
#include "server/node.hpp"
#include "server/peer.hpp"
#include "server/wire.hpp"

namespace rlm::server {

// One offered policy and its pool.
struct Offer {
  OfferedPolicy offered;
  std::unique_ptr<Pool> pool;
};

struct Connection {
  int socket = -1;
  Peer peer;
  const ServerConfig& config;
  const std::map<std::string, Offer>& offers;
  FrameBudget& frame_budget;  // the server's: every frame this peer sends counts against it
  Activities& activities;     // the server's runs and sessions, for status and kill
  Node& node;                 // this server as a fleet's node: max_sandboxes, drain
  const EventLog& log;
  uid_t server_uid;  // the server's own: like root, it sees and kills every client's activity

  // Root or the server's own uid: the operator.
  bool operator_peer() const { return peer.uid == 0 || peer.uid == server_uid; }
  // The peer, for a log line.
  nlohmann::json who() const {
    nlohmann::json who{{"uid", peer.uid}, {"gid", peer.gid}, {"pid", peer.pid}};
    if (!peer.identity.empty()) who["identity"] = peer.identity;
    if (!peer.remote.empty()) who["remote"] = peer.remote;
    return who;
  }

  // One frame of the client's, within the server's bounds (wire.hpp's receive_frame).
  std::optional<Frame> receive(Clock::time_point first_byte_deadline) const {
    return receive_frame(socket, first_byte_deadline, config.frame_timeout, config.max_frame_bytes,
                         {&frame_budget, peer.uid});
  }

  // Sends with the connection's write deadline (a client that does not read is dropped).
  void send(const nlohmann::json& message) const {
    send_frame(socket, message, Clock::now() + config.frame_timeout);
  }
};

// A request refused before anything ran: becomes an error frame (wire.hpp's error_frame).
class Refusal : public Error {
 public:
  Refusal(std::string kind, const std::string& message, std::vector<Diagnostic> diagnostics = {})
      : Error(message), kind(std::move(kind)), diagnostics(std::move(diagnostics)) {}
  std::string kind;  // "refused", "invalid", "unavailable", "internal"
  std::vector<Diagnostic> diagnostics;
};

// The offer a frame's "policy" names and the policy to run: the offered one, or the frame's
// "overrides" when they only tighten it (and bind only what this peer is permitted). Throws
// Refusal otherwise, listing every loosening.
struct Admitted {
  const Offer* offer = nullptr;
  std::shared_ptr<const Policy> candidate;  // null: the offered policy itself
  const Policy& policy() const { return candidate ? *candidate : offer->pool->policy(); }
};
Admitted admit(const Connection& connection, const nlohmann::json& frame);

// What a client's fd is for: a payload's stdio may also be a character device (/dev/null, a
// terminal); data the server reads itself (a session's context, add_context's input) may not.
enum class FdUse { stdio, data };
// The one check of every fd a client hands the server. Throws Refusal("invalid") naming `which`
// ("stdin", "context", ...) and why, unless `fd` is open (not O_PATH), is a pipe, socket or
// regular file (memfds included), or for stdio a character device, and is on no filesystem whose
// reads are checked against the reader's credentials (procfs, sysfs, ...: admission.cpp) and no
// anonymous inode (epoll, eventfd, signalfd, timerfd, inotify, pidfd, ...); data also on no
// filesystem whose reads wait on another process or host (FUSE, NFS, CIFS, 9P, ...).
void check_client_fd(int fd, std::string_view which, FdUse use);

// The ops. Each owns the connection until it returns; the caller closes it.
void serve_run(const Connection& connection, const nlohmann::json& frame,
               std::vector<host::UniqueFd> fds);
void serve_session(const Connection& connection, const nlohmann::json& frame,
                   std::vector<host::UniqueFd> fds);

}  // namespace rlm::server
