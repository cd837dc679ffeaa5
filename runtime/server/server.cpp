// rlm::Server: the accept loop, one thread per connection (at most max_clients; a few finished
// ones wait for the next connection instead of exiting), and the first frames of every
// connection: peer check, hello, policy, then one run or one session.
#include "rlm_sandbox/server.hpp"

#include <fcntl.h>
#include <openssl/crypto.h>
#include <poll.h>
#include <pthread.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <deque>
#include <functional>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <thread>
#include <variant>

#include "rlm_sys/sys.hpp"
#include "server/connection.hpp"
#include "server/listener.hpp"
#include "server/tls_gateway.hpp"
#include "server/tls_listener.hpp"

namespace rlm {

using host::UniqueFd;
using nlohmann::json;
using server::Clock;

struct Server::State {
  ServerConfig config;
  std::map<std::string, server::Offer> offers;
  server::Listener listener;
  std::optional<server::TlsListener> tls;  // --listen: TLS clients over TCP
  UniqueFd wake;                           // an eventfd: stop() and drain()
  std::atomic<bool> stop_requested{false};
  std::atomic<std::uint64_t> tls_connections{0};  // numbers each (Peer::connection)

  uid_t own_uid = geteuid();
  std::unique_ptr<server::FrameBudget> frame_budget;  // every connection's frames count in it
  server::Activities activities;
  std::unique_ptr<server::Node> node;
  // A drain's end: when it began and its grace (under `mutex`); set by drain(), watched by serve().
  std::optional<Clock::time_point> drain_deadline;
  std::unique_ptr<server::EventLog> log;
  const std::chrono::steady_clock::time_point started = std::chrono::steady_clock::now();

  std::mutex mutex;
  std::condition_variable idle;
  std::map<int, uid_t> connections;  // sockets being served (shut down on stop), by peer uid
  std::map<uid_t, std::size_t> connections_of;  // how many each uid holds
  bool stopping = false;
  // Threads: each serves a connection; a finished one waits (as a spare) for the next accepted
  // socket, which saves starting a thread on a run's path. The destructor waits for all to end.
  std::size_t workers = 0, spares = 0;
  std::deque<int> handed;  // accepted, for a spare (each also in `connections`)
  std::condition_variable handed_over;
  // TCP connections before their TLS client is known (shut down on stop), by their source
  // address: at most max_clients in all, and an eighth of them from any one address.
  std::map<int, std::string> handshaking;
  std::map<std::string, std::size_t> handshakes_from;

  void work(UniqueFd first);
  void serve_connection(UniqueFd socket);
  // A TLS client, on a thread of its own: the handshake, its certificate's uid, then its
  // frames relayed (tls_gateway.hpp) to dispatch() on another thread, as a unix client's.
  void accept_remote();
  void forget_handshake(int socket);  // with `mutex` held
  void serve_remote(UniqueFd tcp);
  void serve_tls_client(server::TlsStream& stream, json who);
  void serve_ops(UniqueFd ops, server::Peer peer);
  // A thread's end: the count the destructor waits on, given back after everything it did.
  void leave();
  void dispatch(const server::Connection& connection);
  // The status and kill ops: answered, then the connection ends.
  void serve_status(const server::Connection& connection);
  void serve_kill(const server::Connection& connection, const json& frame);
  // The node contract's ops (health, ready, capacity, drain): answered, then the connection ends.
  void serve_node_op(const server::Connection& connection, const std::string& op,
                     const json& frame);
  void begin_drain(std::chrono::milliseconds grace);
  // Logs a refusal (`who`: the peer as far as it is known) and sends it as an error frame now.
  void refuse_now(int socket, json who, const std::string& op, const std::string& kind,
                  const std::string& message) const;
  // Why a connection of `uid` cannot be served now (max_clients, the slots kept for the
  // server's own uid, max_clients_per_uid); nullopt when it can. With `mutex` held.
  std::optional<std::string> over_capacity(uid_t uid) const;
  void add_connection(int socket, uid_t uid);
  void remove_connection(int socket);  // with `mutex` held
  // Stops handing out connections, ends those being served (their runs stop) and waits until
  // every worker is gone; then removes the socket file.
  void end_connections();
};

namespace {

constexpr std::size_t kSpareWorkers = 4;
constexpr auto kSpareIdle = std::chrono::seconds(30);  // a spare nobody needed this long exits

// A refusal's log line.
json refusal_event(json who, const std::string& op, const std::string& kind,
                   const std::string& message) {
  json event{{"event", "refusal"}, {"kind", kind}, {"message", message}};
  if (!op.empty()) event["op"] = op;
  for (auto& [key, value] : who.items()) event[key] = value;
  return event;
}

json policy_names(const std::map<std::string, server::Offer>& offers) {
  json names = json::array();
  for (const auto& [name, offer] : offers) names.push_back(name);
  return names;
}

// What each pool has served and holds ready (hello's "pools").
json pool_stats(const std::map<std::string, server::Offer>& offers) {
  json pools = json::object();
  for (const auto& [name, offer] : offers) {
    const PoolStats stats = offer.pool->stats();
    pools[name] = {{"warm_runs", stats.warm_runs},
                   {"cold_runs", stats.cold_runs},
                   {"warm_sessions", stats.warm_sessions},
                   {"cold_sessions", stats.cold_sessions},
                   {"ready_sandboxes", stats.ready_sandboxes},
                   {"recycled", stats.recycled},
                   {"ready_sessions", stats.ready_sessions}};
  }
  return pools;
}

}  // namespace

std::optional<std::string> Server::State::over_capacity(uid_t uid) const {
  const std::size_t max = config.max_clients;
  if (connections.size() >= max)
    return "the server is serving its maximum of " + std::to_string(max) +
           " clients; try again later";
  if (uid == own_uid) return std::nullopt;
  if (connections.size() >= max - config.owner_reserve())
    return "the server is serving its maximum of " + std::to_string(max) + " clients (the last " +
           std::to_string(config.owner_reserve()) + " are kept for its own uid); try again later";
  const auto held = connections_of.find(uid);
  if (held != connections_of.end() && held->second >= config.clients_per_uid())
    return "uid " + std::to_string(uid) + " already holds " + std::to_string(held->second) +
           " connections, the most one uid may hold at once (max_clients_per_uid, a cap per "
           "uid); try again when one of them ends";
  return std::nullopt;
}

void Server::State::refuse_now(int socket, json who, const std::string& op, const std::string& kind,
                               const std::string& message) const {
  const auto uid = who.contains("uid")
                       ? std::optional<std::uint32_t>(who["uid"].get<std::uint32_t>())
                       : std::nullopt;
  log->record_limited(refusal_event(std::move(who), op, kind, message), uid);
  server::send_frame_now(socket, server::error_frame(kind, message));
}

void Server::State::add_connection(int socket, uid_t uid) {
  connections.emplace(socket, uid);
  ++connections_of[uid];
}

void Server::State::end_connections() {
  std::unique_lock lock(mutex);
  stopping = true;
  handed_over.notify_all();
  for (const auto& [socket, uid] : connections) shutdown(socket, SHUT_RDWR);
  for (const auto& [socket, source] : handshaking) shutdown(socket, SHUT_RDWR);
  idle.wait(lock, [&] { return connections.empty() && workers == 0; });
  lock.unlock();
  server::remove_socket_file(listener);
}

void Server::State::remove_connection(int socket) {
  const auto found = connections.find(socket);
  if (found == connections.end()) return;
  const auto held = connections_of.find(found->second);
  if (held != connections_of.end() && --held->second == 0) connections_of.erase(held);
  connections.erase(found);
}

Server::Server(ServerConfig config) : state_(std::make_unique<State>()) {
  if (config.policies.empty())
    throw Error("the server offers no policy: give at least one --pool or --session-pool");
  if (config.max_clients == 0) throw Error("max_clients must be at least 1");
  for (const auto& offered : config.policies) {
    if (state_->offers.count(offered.name))
      throw Error("policy '" + offered.name + "' is offered twice");
    Policy policy = load_policy(offered.source.empty() ? offered.name : offered.source);
    server::Offer offer;
    offer.offered = offered;
    offer.pool = std::make_unique<Pool>(
        std::move(policy), PoolOptions{offered.sandboxes, offered.sessions, offered.recycle});
    state_->offers.emplace(offered.name, std::move(offer));
  }
  state_->wake = UniqueFd(eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK));
  if (!state_->wake) throw Error("eventfd: " + sys::errno_text(errno));
  if (config.listen_fd >= 0) {
    state_->listener.fd = UniqueFd(config.listen_fd);
    config.listen_fd = -1;
  } else {
    if (config.socket_path.empty()) throw Error("the server needs a socket path (--socket)");
    const int backlog = static_cast<int>(std::min<std::size_t>(config.max_clients * 2, 4096));
    state_->listener = server::listen_at(config.socket_path, config.socket_mode, backlog,
                                         config.allow_uids, config.allow_gids);
  }
  if (!config.tls_listen.empty()) {
    const int backlog = static_cast<int>(std::min<std::size_t>(config.max_clients * 2, 4096));
    // A new revocation list, loaded or not, is logged (the log is made below, before any client).
    const auto reloaded = [state = state_.get()](bool loaded, const std::string& why) {
      json event{{"event", "client_crl"}, {"loaded", loaded}};
      if (!loaded) event["error"] = why + " (the list loaded before stays in force)";
      if (state->log) state->log->record(std::move(event));
    };
    state_->tls =
        server::listen_tls(config.tls_listen, config.tls_cert, config.tls_key, config.tls_client_ca,
                           config.tls_client_crl, backlog, reloaded);
  } else if (!config.tls_cert.empty() || !config.tls_key.empty() || !config.tls_client_ca.empty() ||
             !config.tls_client_crl.empty() || !config.tls_identities.empty()) {
    throw Error(
        "--tls-cert, --tls-key, --client-ca, --client-crl and --tls-identity are for a TLS "
        "listener: give --listen HOST:PORT too");
  }
  // A uid's share is at most the whole (lowering max_bytes_in_flight alone lowers both).
  state_->log = std::make_unique<server::EventLog>(config.log);
  state_->frame_budget = std::make_unique<server::FrameBudget>(
      config.max_bytes_in_flight,
      std::min(config.max_bytes_in_flight, config.max_bytes_in_flight_per_uid));
  if (config.node_id.empty()) config.node_id = server::default_node_id();
  if (const auto why = node_id_problem(config.node_id)) throw Error("--node-id: " + *why);
  state_->node = std::make_unique<server::Node>(config.node_id, config.max_sandboxes,
                                                config.max_sandboxes_per_uid, state_->own_uid);
  state_->config = std::move(config);
}

Server::~Server() {
  stop();
  state_->end_connections();
}

const ServerConfig& Server::config() const {
  return state_->config;
}

std::string Server::tls_address() const {
  return state_->tls ? state_->tls->address : "";
}

void Server::stop() {
  state_->stop_requested = true;
  const std::uint64_t one = 1;
  [[maybe_unused]] auto written = write(state_->wake.get(), &one, sizeof one);
}

void Server::drain(std::optional<std::chrono::milliseconds> grace) {
  state_->begin_drain(grace.value_or(state_->config.drain_grace));
}

void Server::State::begin_drain(std::chrono::milliseconds grace) {
  {
    std::lock_guard lock(mutex);
    const auto deadline = Clock::now() + grace;
    if (drain_deadline && *drain_deadline <= deadline) return;  // a shorter one stands
    drain_deadline = deadline;
    node->begin_drain();
  }
  log->record({{"event", "draining"},
               {"node", node->id()},
               {"grace_ms", grace.count()},
               {"running", activities.count()}});
  const std::uint64_t one = 1;  // serve() looks again
  [[maybe_unused]] auto written = write(wake.get(), &one, sizeof one);
}

void Server::serve(int stop_fd, int drain_fd) {
  json offered = json::object();
  for (const auto& [name, offer] : state_->offers)
    offered[name] = {{"sandboxes", offer.offered.sandboxes},
                     {"sessions", offer.offered.sessions},
                     {"recycle", offer.offered.recycle}};
  state_->log->record(
      {{"event", "listening"},
       {"socket", state_->config.socket_path.empty() ? json("(the socket systemd passed)")
                                                     : json(state_->config.socket_path)},
       {"pid", getpid()},
       {"node", state_->node->id()},
       {"tls", state_->tls ? json(state_->tls->address) : json()},
       {"max_sandboxes", state_->config.max_sandboxes},
       {"pools", offered}});
  const std::string endpoint_file = server::register_endpoint(
      state_->config.register_dir, state_->node->id(), state_->config.socket_path);
  if (!endpoint_file.empty())
    state_->log->record({{"event", "registered"}, {"endpoint_file", endpoint_file}});
  constexpr auto kDrainPoll = std::chrono::milliseconds(20);
  for (;;) {
    pollfd fds[5] = {{state_->listener.fd.get(), POLLIN, 0},
                     {state_->wake.get(), POLLIN, 0},
                     {stop_fd, POLLIN, 0},
                     {drain_fd, POLLIN, 0},
                     {state_->tls ? state_->tls->fd.get() : -1, POLLIN, 0}};
    std::optional<Clock::time_point> drain_deadline;
    {
      std::lock_guard lock(state_->mutex);
      drain_deadline = state_->drain_deadline;
    }
    if (poll(fds, 5, drain_deadline ? static_cast<int>(kDrainPoll.count()) : -1) < 0) {
      if (errno == EINTR) continue;
      throw Error("poll: " + sys::errno_text(errno));
    }
    if (fds[2].revents) break;
    if (fds[3].revents) {
      char drop[256];  // a signalfd's siginfo, or whatever woke it
      [[maybe_unused]] auto got = read(drain_fd, drop, sizeof drop);
      if (drain_deadline) break;  // asked twice: stop now
      drain(std::nullopt);
      continue;
    }
    if (fds[1].revents) {
      std::uint64_t count = 0;
      [[maybe_unused]] auto got = read(state_->wake.get(), &count, sizeof count);
      if (state_->stop_requested) break;
      continue;  // a drain began: its deadline is read above
    }
    if (drain_deadline) {
      // Draining: done once nothing runs; past the grace, what still runs is ended and given a
      // moment to tell its client so before the connections are shut.
      constexpr auto kEndingGrace = std::chrono::seconds(5);
      if (state_->node->held() == 0 || Clock::now() >= *drain_deadline + kEndingGrace) break;
      if (Clock::now() >= *drain_deadline && !state_->node->drained()) {
        state_->node->mark_drained();
        const std::size_t ended = state_->activities.kill_all(
            "node_drained: node " + state_->node->id() + " drained and its grace ran out");
        state_->log->record({{"event", "drained"}, {"node", state_->node->id()}, {"ended", ended}});
      }
    }
    if (fds[4].revents & POLLIN) state_->accept_remote();
    if (!(fds[0].revents & POLLIN)) continue;
    UniqueFd socket(accept4(state_->listener.fd.get(), nullptr, nullptr, SOCK_CLOEXEC));
    if (!socket) continue;  // the peer left already, or fds ran out: go on serving the rest
    const auto uid = server::peer_uid(socket.get());
    if (!uid) {
      state_->refuse_now(socket.get(), json::object(), "", "refused",
                         "the peer's credentials are unknown");
      continue;
    }
    std::unique_lock lock(state_->mutex);
    if (const auto full = state_->over_capacity(*uid)) {
      lock.unlock();
      state_->refuse_now(socket.get(), {{"uid", *uid}}, "", "unavailable", *full);
      continue;
    }
    state_->add_connection(socket.get(), *uid);
    if (state_->spares > state_->handed.size()) {
      state_->handed.push_back(socket.release());
      lock.unlock();
      state_->handed_over.notify_one();
      continue;
    }
    ++state_->workers;
    lock.unlock();
    try {
      std::thread([state = state_.get(), fd = socket.get()] {
        state->work(UniqueFd(fd));
      }).detach();
      socket.release();
    } catch (const std::system_error&) {  // no thread to be had: refuse this one
      std::lock_guard relock(state_->mutex);
      --state_->workers;
      state_->remove_connection(socket.get());
    }
  }
  // Stopped: no new clients find it; no new connections; those being served are ended, their
  // runs stopped.
  server::unregister_endpoint(endpoint_file, state_->config.socket_path);
  state_->end_connections();
  state_->log->record({{"event", "stopped"}, {"pid", getpid()}});
}

void Server::State::work(UniqueFd first) {
  pthread_setname_np(pthread_self(), "rlm-connection");  // what ps -L and /proc show
  UniqueFd socket = std::move(first);
  for (;;) {
    serve_connection(std::move(socket));
    std::unique_lock lock(mutex);
    if (stopping || spares >= kSpareWorkers) {
      --workers;
      // The destructor may free this State once it sees the count: the notification and the
      // mutex's release happen after everything else this thread does.
      std::notify_all_at_thread_exit(idle, std::move(lock));
      return;
    }
    ++spares;
    handed_over.wait_for(lock, kSpareIdle, [this] { return stopping || !handed.empty(); });
    --spares;
    if (handed.empty()) {  // idle too long, or stopping with nothing handed over
      --workers;
      std::notify_all_at_thread_exit(idle, std::move(lock));
      return;
    }
    socket = UniqueFd(handed.front());
    handed.pop_front();
  }
}

void Server::State::serve_connection(UniqueFd socket) {
  const int fd = socket.get();
  try {
    const auto peer = server::peer_of(fd);
    if (!peer) {
      refuse_now(fd, json::object(), "", "refused", "the peer's credentials are unknown");
    } else if (!server::peer_allowed(*peer, geteuid(), config.allow_uids, config.allow_gids)) {
      refuse_now(fd, {{"uid", peer->uid}, {"gid", peer->gid}, {"pid", peer->pid}}, "", "refused",
                 server::describe(*peer) +
                     " is not allowed to use this server (its --allow-uid / --allow-gid)");
    } else {
      dispatch(server::Connection{fd, *peer, config, offers, *frame_budget, activities, *node, *log,
                                  own_uid});
    }
  } catch (...) {
  }
  // Forgotten before it is closed: once closed, its number is the next accepted connection's,
  // whose count this would otherwise take away (leaving the new one's uncounted for ever).
  {
    std::lock_guard lock(mutex);
    remove_connection(fd);
    idle.notify_all();
  }
  socket.reset();
}

void Server::State::leave() {
  std::unique_lock lock(mutex);
  --workers;
  // The destructor may free this State once it sees the count: the notification and the mutex's
  // release happen after everything else this thread does.
  std::notify_all_at_thread_exit(idle, std::move(lock));
}

void Server::State::accept_remote() {
  UniqueFd socket(accept4(tls->fd.get(), nullptr, nullptr, SOCK_CLOEXEC));
  if (!socket) return;
  std::string source = server::remote_address(socket.get());
  source = source.substr(0, source.rfind(':'));  // the address, whatever its port
  {
    std::lock_guard lock(mutex);
    // Before a certificate names anyone, connections are bounded as a whole (max_clients of
    // them shaking hands at once, each for a few seconds) and, once half of those are taken, per
    // source address (an eighth), so one host holding connections open does not shut every other
    // out, while one client host opening many at once (a burst of placements) is not turned away
    // from an idle listener.
    const std::size_t per_source = std::max<std::size_t>(1, config.max_clients / 8);
    if (stopping || handshaking.size() >= config.max_clients ||
        (handshakes_from[source] >= per_source && handshaking.size() >= config.max_clients / 2)) {
      if (handshakes_from[source] == 0) handshakes_from.erase(source);
      return;
    }
    handshaking.emplace(socket.get(), source);
    ++handshakes_from[source];
    ++workers;
  }
  try {
    std::thread([this, fd = socket.get()] { serve_remote(UniqueFd(fd)); }).detach();
    socket.release();
  } catch (const std::system_error&) {
    std::lock_guard lock(mutex);
    forget_handshake(socket.get());
    --workers;
  }
}

void Server::State::forget_handshake(int socket) {
  const auto found = handshaking.find(socket);
  if (found == handshaking.end()) return;
  const auto from = handshakes_from.find(found->second);
  if (from != handshakes_from.end() && --from->second == 0) handshakes_from.erase(from);
  handshaking.erase(found);
}

void Server::State::serve_remote(UniqueFd tcp) {
  pthread_setname_np(pthread_self(), "rlm-tls");
  const int fd = tcp.get();
  json who{{"remote", server::remote_address(fd)}};
  std::optional<server::TlsStream> stream;
  try {
    // A handshake is a few round trips: 3 s at most (first_frame_timeout, if shorter).
    const auto deadline = Clock::now() + std::min<std::chrono::milliseconds>(
                                             config.first_frame_timeout, std::chrono::seconds(3));
    if (!server::speaks_tls(fd, deadline)) {
      refuse_now(fd, who, "", "refused",
                 "this port speaks TLS 1.3 only, with a client certificate (rlm-sandbox "
                 "--server tls://HOST:PORT --tls-cert FILE --tls-key FILE --tls-ca FILE)");
    } else {
      // On a copy of the fd: `tcp` stays open (its number ours) until it leaves `handshaking`.
      stream.emplace(server::TlsStream::accept(tls->context->current(),
                                               UniqueFd(fcntl(fd, F_DUPFD_CLOEXEC, 0)), deadline));
    }
  } catch (const server::WireError& refused) {
    log->record_limited(refusal_event(who, "", "refused", refused.what()), std::nullopt);
  }
  {
    std::lock_guard lock(mutex);
    forget_handshake(fd);
  }
  tcp.reset();
  if (stream) {
    try {
      serve_tls_client(*stream, std::move(who));
    } catch (...) {
    }
  }
  stream.reset();
  OPENSSL_thread_stop();  // the error queue OpenSSL keeps for this thread
  leave();
}

void Server::State::serve_tls_client(server::TlsStream& stream, json who) {
  const auto refuse = [&](const std::string& kind, const std::string& message) {
    log->record_limited(refusal_event(who, "", kind, message), std::nullopt);
    try {
      server::send_tls_frame(stream, server::error_frame(kind, message),
                             Clock::now() + std::chrono::seconds(1));
    } catch (const Error&) {
    }
    stream.close_now();
  };
  auto mapped = server::peer_of_identities(stream.peer_identities(), config.tls_identities);
  if (auto* why = std::get_if<std::string>(&mapped)) return refuse("refused", *why);
  server::Peer peer = std::get<server::Peer>(mapped);
  peer.remote = who.value("remote", "");
  peer.connection = ++tls_connections;
  who["uid"] = peer.uid;
  who["gid"] = peer.gid;
  who["identity"] = peer.identity;
  if (!server::peer_allowed(peer, own_uid, config.allow_uids, config.allow_gids))
    return refuse("refused", server::describe(peer) +
                                 " is not allowed to use this server (its --allow-uid / "
                                 "--allow-gid)");
  // The TLS connection is one of its uid's connections for as long as it lasts, op after op;
  // the stop shuts it down, which ends the op in progress.
  const int tcp = stream.fd();
  {
    std::unique_lock lock(mutex);
    if (stopping) return;
    if (const auto full = over_capacity(peer.uid)) {
      lock.unlock();
      return refuse("unavailable", *full);
    }
    add_connection(tcp, peer.uid);
  }
  // Each op gets a socket pair: its far end is served by dispatch() on a thread of its own, as a
  // unix client's connection is.
  const std::function<UniqueFd()> open_ops = [&]() -> UniqueFd {
    int ends[2];
    if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0)
      throw server::Refused("unavailable", "socketpair: " + sys::errno_text(errno));
    UniqueFd ops(ends[0]), gateway(ends[1]);
    {
      std::lock_guard lock(mutex);
      if (stopping) throw server::Refused("unavailable", "the server is stopping");
      ++workers;
    }
    try {
      std::thread([this, fd = ops.get(), peer] { serve_ops(UniqueFd(fd), peer); }).detach();
      ops.release();
    } catch (const std::system_error&) {
      std::lock_guard lock(mutex);
      --workers;
      throw server::Refused("unavailable", "no thread to serve the request");
    }
    return gateway;
  };
  // A revocation reaches connections already open, sessions and kept connections alike: when the
  // listener's context is made anew from a changed --client-crl, this client's certificate is
  // checked against it, once.
  std::shared_ptr<server::TlsContext> checked_against = stream.context();
  const auto withdrawn = [&]() -> std::string {
    auto now_in_force = tls->context->current();
    if (now_in_force == checked_against) return "";
    checked_against = now_in_force;
    std::string why = stream.peer_verification_failure(*now_in_force);
    if (why.empty()) return why;
    log->record_limited(refusal_event(who, "", "refused", "connection cut: " + why), peer.uid);
    // What it started ends now, a cell in progress included (a client that merely left would
    // have its cell finish first).
    activities.kill_connection(peer.connection, "connection cut: " + why);
    return why;
  };
  server::relay_tls_client(
      stream, open_ops,
      {config.max_frame_bytes,
       config.frame_timeout,
       config.max_context_bytes,
       {frame_budget.get(), peer.uid},
       config.tls_client_crl.empty() ? std::function<std::string()>() : withdrawn});
  std::lock_guard lock(mutex);
  remove_connection(tcp);
  idle.notify_all();
}

void Server::State::serve_ops(UniqueFd ops, server::Peer peer) {
  pthread_setname_np(pthread_self(), "rlm-connection");
  const int fd = ops.get();
  try {
    dispatch(server::Connection{fd, std::move(peer), config, offers, *frame_budget, activities,
                                *node, *log, own_uid});
  } catch (...) {
  }
  ops.reset();
  leave();
}

// hello and policy, each within first_frame_timeout of the last, at most max_negotiation_frames
// of them and all within negotiation_timeout of connecting (no frame moves that deadline, so
// chatting does not hold a connection); then one run or one session; the connection then ends.
void Server::State::dispatch(const server::Connection& connection) {
  const auto negotiation_end = Clock::now() + config.negotiation_timeout;
  std::size_t negotiation_frames = 0;
  for (;;) {
    std::optional<server::Frame> frame;
    try {
      frame =
          connection.receive(std::min(Clock::now() + config.first_frame_timeout, negotiation_end));
    } catch (const server::FrameRefused& refused) {
      refuse_now(connection.socket, connection.who(), "", "unavailable", refused.what());
      return;
    } catch (const server::WireError& error) {
      const std::string message =
          Clock::now() >= negotiation_end
              ? "no run or session_open within " +
                    std::to_string(config.negotiation_timeout.count()) +
                    " ms of connecting (the negotiation deadline, which hello and policy frames "
                    "do not move)"
              : std::string(error.what());
      refuse_now(connection.socket, connection.who(), "", "invalid", message);
      return;
    }
    if (!frame) return;
    const std::string op = frame->message["op"].get<std::string>();
    if ((op == "hello" || op == "policy") && ++negotiation_frames > config.max_negotiation_frames) {
      refuse_now(connection.socket, connection.who(), op, "invalid",
                 "more than " + std::to_string(config.max_negotiation_frames) +
                     " hello and policy frames (the negotiation's bound) without a run or "
                     "session_open");
      return;
    }
    try {
      if (op == "hello") {
        connection.send({{"op", "hello"},
                         {"version", server::kProtocolVersion},
                         {"policies", policy_names(offers)},
                         {"pools", pool_stats(offers)},
                         {"pid", getpid()}});
        continue;
      }
      if (op == "policy") {
        json ask = json::object();
        ask["policy"] = frame->message.value("policy", json());
        const server::Admitted admitted = server::admit(connection, ask);
        json policy = admitted.policy().to_json();
        connection.send({{"op", "policy"}, {"policy", std::move(policy)}});
        continue;
      }
      if (op == "run") return server::serve_run(connection, frame->message, std::move(frame->fds));
      if (op == "session_open")
        return server::serve_session(connection, frame->message, std::move(frame->fds));
      if (op == "status") return serve_status(connection);
      if (op == "kill") return serve_kill(connection, frame->message);
      if (op == "health" || op == "ready" || op == "capacity" || op == "drain")
        return serve_node_op(connection, op, frame->message);
      throw server::Refusal("invalid",
                            "unknown op; expected hello, policy, run, session_open, status, kill, "
                            "health, ready, capacity or drain");
    } catch (const server::Refusal& refusal) {
      log->record_limited(refusal_event(connection.who(), op, refusal.kind, refusal.what()),
                          connection.peer.uid);
      connection.send(server::error_frame(refusal.kind, refusal.what(), refusal.diagnostics));
      if (op == "policy") continue;
      return;
    } catch (const server::WireError&) {
      return;
    } catch (const std::exception& error) {
      log->record_limited(refusal_event(connection.who(), op, "internal", error.what()),
                          connection.peer.uid);
      connection.send(server::error_frame("internal", error.what()));
      return;
    }
  }
}

void Server::State::serve_status(const server::Connection& connection) {
  const bool all = connection.operator_peer();
  json request{{"event", "request"}, {"op", "status"}};
  request.update(connection.who());
  log->record_limited(std::move(request), connection.peer.uid);
  json status{{"op", "status"},
              {"pid", getpid()},
              {"uptime_ms", std::chrono::duration_cast<std::chrono::milliseconds>(
                                std::chrono::steady_clock::now() - started)
                                .count()},
              {"pools", pool_stats(offers)},
              {"scope", all ? "all" : "own"},
              {"running", activities.list(connection.peer, all)}};
  connection.send(status);
}

void Server::State::serve_node_op(const server::Connection& connection, const std::string& op,
                                  const json& frame) {
  if (op == "health") return connection.send(node->health());
  if (op == "ready") return connection.send(node->readiness(offers));
  if (op == "capacity") return connection.send(node->capacity(offers));
  // drain: the operator's alone (it ends every tenant's work).
  if (!connection.operator_peer())
    throw server::Refusal("refused", "only root and the server's own uid may drain the node");
  std::chrono::milliseconds grace = config.drain_grace;
  if (const auto asked = frame.find("grace_ms"); asked != frame.end()) {
    if (!asked->is_number_unsigned() || asked->get<std::uint64_t>() > 86'400'000)
      throw server::Refusal("invalid",
                            "drain's \"grace_ms\" is a whole number of ms, at most a day");
    grace = std::chrono::milliseconds(asked->get<std::uint64_t>());
  }
  json request{{"event", "request"}, {"op", "drain"}, {"grace_ms", grace.count()}};
  request.update(connection.who());
  log->record(std::move(request));
  begin_drain(grace);
  connection.send({{"op", "draining"}, {"node", node->id()}, {"grace_ms", grace.count()}});
}

void Server::State::serve_kill(const server::Connection& connection, const json& frame) {
  const auto id = frame.find("id");
  if (id == frame.end() || !id->is_number_unsigned())
    throw server::Refusal("invalid", "kill needs \"id\" (a number from status)");
  const std::uint64_t target = id->get<std::uint64_t>();
  json request{{"event", "request"}, {"op", "kill"}, {"target", target}};
  request.update(connection.who());
  log->record_limited(std::move(request), connection.peer.uid);
  if (!activities.kill(target, connection.peer, connection.operator_peer()))
    throw server::Refusal("refused", "no run or session " + std::to_string(target) +
                                         (connection.operator_peer() ? "" : " of yours") +
                                         " is running (rlm-sandbox server status lists them)");
  connection.send({{"op", "killed"}, {"id", target}});
}

}  // namespace rlm
