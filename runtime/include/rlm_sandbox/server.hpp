// The resident server (`rlm-sandbox serve`): pools of warm sandboxes behind a unix socket, for
// clients on the same host (client.hpp, the Python client, `run --server`). The server is a
// privilege boundary: a peer's credentials (SO_PEERCRED) are checked against an allow list
// before anything else; a client may use only the policies the server offers, may only tighten
// them (tightening.hpp), and may bind only host directories this configuration permits it.
// Everything a client sends is bounded. docs/pools-and-server.md.
#pragma once

#include <sys/types.h>

#include <algorithm>
#include <chrono>
#include <cstddef>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "rlm_sandbox/tightening.hpp"

namespace rlm {

// One policy the server offers, under the name clients ask for it by.
struct OfferedPolicy {
  std::string name;    // what a client sends as "policy"
  std::string source;  // a shipped name or a path on the server's side; "" means `name` itself
  std::size_t sandboxes = 0;  // warm run sandboxes kept ready
  std::size_t sessions = 0;   // warm REPL sessions kept ready
  std::size_t recycle = 0;    // runs one warm sandbox serves (PoolOptions::recycle); 0: one
};

// The most runs a recycled sandbox may serve (PoolOptions::recycle through a server's config).
inline constexpr std::size_t kMaxRecycledRuns = 1'000'000;

struct ServerConfig {
  std::string socket_path;  // where to listen (a stale socket nobody listens on is replaced)
  int listen_fd = -1;       // or an inherited listening socket (systemd); the server keeps it
  mode_t socket_mode = 0660;

  std::vector<OfferedPolicy> policies;

  // This server as a node of a fleet (docs/fleet.md): the id its answers, results and session ids
  // carry ("": the host's name); the runs and sessions it holds at once, past which a request is
  // refused "resource_exhausted" at once (0: no cap of its own); and how long a drain lets those
  // running go on before it ends them (node_drained).
  std::string node_id;
  std::size_t max_sandboxes = 0;
  // Of those, the most one client uid may hold at once (the server's own uid excepted), so one
  // tenant cannot hold a shared node's every slot; 0: no share of its own (a node one client
  // uses, as a fleet's nodes usually are).
  std::size_t max_sandboxes_per_uid = 0;
  std::chrono::milliseconds drain_grace{30'000};
  // A directory where the server, once listening, writes NODE_ID.endpoint ("unix:SOCKET", the
  // socket's absolute path) for a fleet's clients to find it (read_fleet); the file is removed
  // when serve() returns. "": none.
  std::string register_dir;

  // A TLS listener beside the socket (docs/fleet.md, "Remote access"): "HOST:PORT" ("": none;
  // port 0 picks a free one, Server::tls_address() says which), the server's certificate and
  // key, the CA client certificates must chain to, and the uid each client identity (a
  // certificate's common name or subject alternative name) stands for, with that uid's permits;
  // an identity not listed is refused. TLS 1.3 only; a client certificate is required. With
  // `tls_client_crl` (PEM revocation lists of the client CA, and of any CA under it that issues
  // client certificates), a revoked certificate is refused too; the file is read again when it
  // changes.
  std::string tls_listen;
  std::string tls_cert;
  std::string tls_key;
  std::string tls_client_ca;
  std::string tls_client_crl;
  std::map<std::string, uid_t> tls_identities;

  // Who may connect, besides the server's own uid: a peer whose uid is listed, or whose primary
  // or supplementary group is.
  std::vector<uid_t> allow_uids;
  std::vector<gid_t> allow_gids;
  // Host directories a peer uid may bind beneath (a policy's new bind mounts).
  std::map<uid_t, std::vector<PermittedBind>> permitted_binds;

  std::size_t max_clients = 64;  // connections served at once; beyond: refused
  // Connections one uid may hold at once; 0: a quarter of max_clients (at least 1). The server's
  // own uid has no such cap, and other uids together leave it max_clients / 16 (at least 1) of
  // max_clients (owner_reserve()).
  std::size_t max_clients_per_uid = 0;
  std::uint64_t max_context_bytes = 1u << 30;  // a session's context, read from the client's fd
  std::uint64_t max_frame_bytes = 64u << 20;   // one client frame
  // Bytes of frames being received, reserved when a frame's header announces its length and
  // released once it is parsed: all clients together, and each uid's share (at most the whole).
  // A frame that does not fit is refused at once ("unavailable"); frames up to 64 KiB need no
  // reservation.
  std::uint64_t max_bytes_in_flight = 256u << 20;
  std::uint64_t max_bytes_in_flight_per_uid = 64u << 20;
  std::chrono::milliseconds first_frame_timeout{5000};  // silent after connecting: closed
  std::chrono::milliseconds frame_timeout{10'000};      // a frame begun must end within this
  // hello and policy frames before run or session_open: a deadline from the connection's start
  // that no frame moves, and a count.
  std::chrono::milliseconds negotiation_timeout{10'000};
  std::size_t max_negotiation_frames = 16;

  // Where the server's account goes: one JSON object per line (no newline in `line`) for each
  // request, refusal and end, called from the connections' threads. Empty: none is kept.
  // docs/pools-and-server.md lists the events and their fields.
  std::function<void(std::string_view line)> log;

  // max_clients_per_uid with its default applied, and the slots kept for the server's own uid.
  std::size_t clients_per_uid() const {
    return max_clients_per_uid ? max_clients_per_uid : std::max<std::size_t>(1, max_clients / 4);
  }
  std::size_t owner_reserve() const {
    return max_clients < 2 ? 0 : std::max<std::size_t>(1, max_clients / 16);
  }
};

// A configuration file (JSON; docs/pools-and-server.md):
//   {"socket": PATH, "socket_mode": "0660",
//    "pools": {NAME: {"policy": SOURCE?, "sandboxes": N, "sessions": N}},
//    "allow": {"uids": [U...], "gids": [G...]},
//    "permit_binds": {"UID": [{"beneath": DIR, "writable": BOOL}]},
//    "max_clients": N, "max_clients_per_uid": N, "max_context_bytes": SIZE,
//    "max_bytes_in_flight": SIZE, "max_bytes_in_flight_per_uid": SIZE,
//    "node_id": ID, "max_sandboxes": N, "drain_grace": DURATION,
//    "tls": {"listen": "HOST:PORT", "cert": FILE, "key": FILE, "client_ca": FILE,
//            "client_crl": FILE, "identities": {IDENTITY: UID}}}
// Throws Error naming the key that is wrong.
ServerConfig server_config_from_json(const nlohmann::json& document, std::string_view origin);
ServerConfig load_server_config(const std::string& path);
// A file of TLS identities, {"identities": {IDENTITY: UID}} (a Secret or ConfigMap mounted into a
// pod, say); throws Error naming what is wrong.
std::map<std::string, uid_t> load_tls_identities(const std::string& path);

// Why `id` cannot be a node id (1 to 64 of letters, digits, '.', '-', '_'), or nullopt.
std::optional<std::string> node_id_problem(std::string_view id);

// The listening socket systemd passed (socket activation: LISTEN_PID is this process and
// LISTEN_FDS is 1), or -1 when none was. Clears those variables. Throws Error for anything but
// one stream socket.
int systemd_listen_fd();

class Server {
 public:
  // Loads every offered policy, starts its pool and binds the socket (or takes listen_fd).
  // Throws Error (PolicyError, BackendUnavailable) when it cannot serve.
  explicit Server(ServerConfig config);
  ~Server();  // stops, if serve() was not stopped, and waits for every connection to end
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Serves until `stop_fd` becomes readable (or stop() is called): each connection on a thread of
  // its own, at most max_clients at once. On return every connection is closed, every run and
  // session it had is stopped, and the socket file is removed. `drain_fd` readable (a signalfd of
  // SIGTERM; what is readable is read and dropped) drains as drain() does; readable again during
  // the drain, it stops at once.
  void serve(int stop_fd = -1, int drain_fd = -1);
  // Makes serve() return; callable from any thread.
  void stop();
  // Drains: ready turns false, new runs and sessions are refused ("draining"), those running go
  // on for drain_grace (or `grace`, when given); then what still runs is ended (a run with status
  // node_drained) and serve() returns. It returns as soon as nothing runs. Callable from any
  // thread; the `drain` op of an operator's client does the same.
  void drain(std::optional<std::chrono::milliseconds> grace = std::nullopt);

  const ServerConfig& config() const;
  // The TLS listener's address as bound ("127.0.0.1:40123"), "" without one.
  std::string tls_address() const;

 private:
  struct State;
  std::unique_ptr<State> state_;
};

}  // namespace rlm
