// The client of `rlm-sandbox serve` (server.hpp): runs and REPL sessions in the server's warm
// sandboxes, through a Backend like any other. The payload's stdin, stdout and stderr are pipes
// this process passes to the server as fds and reads itself, so output never crosses the server,
// and the policy's output cap is enforced here exactly as a direct run enforces it.
// docs/pools-and-server.md.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/request.hpp"
#include "rlm_sandbox/result.hpp"
#include "rlm_sandbox/session.hpp"

namespace rlm {

// The server could not or would not serve: no server at the socket, a refused peer, a policy not
// offered or loosened, a bind not permitted. `kind` is the server's ("refused", "invalid",
// "unavailable", "internal", "resource_exhausted", "draining"), "unavailable" when no server
// answered, or "node_lost" when the server went away after a run had started; `diagnostics` lists
// each way a refused policy loosens the server's.
class ServerRefused : public Error {
 public:
  ServerRefused(std::string kind, const std::string& message,
                std::vector<Diagnostic> diagnostics = {});
  const std::string& kind() const { return kind_; }
  const std::vector<Diagnostic>& diagnostics() const { return diagnostics_; }

 private:
  std::string kind_;
  std::vector<Diagnostic> diagnostics_;
};

// What a client presents to a server it reaches over TLS (an endpoint "tls://HOST:PORT";
// docs/fleet.md): its certificate and key (the identity the server maps to a uid's permits), and
// the CA the server's certificate must chain to, which must also name HOST.
struct TlsFiles {
  std::string cert;
  std::string key;
  std::string ca;
};
// $RLM_SANDBOX_TLS_CERT, $RLM_SANDBOX_TLS_KEY and $RLM_SANDBOX_TLS_CA ("" for each unset).
TlsFiles tls_files_from_environment();

// One connection to a server. Each run or session takes a connection of its own.
//
// Whoever binds a socket path first listens there, so before anything is sent the client checks
// the listener's uid (SO_PEERCRED): root, this process's own uid, or `server_uid` (default
// $RLM_SANDBOX_SERVER_UID, server_uid_from_environment()). Any other uid is refused: it could be
// another tenant waiting for the payload's stdin fd, answering with forged output.
//
// `endpoint` is a socket path, or "tls://HOST:PORT" for a server's TLS listener: then the server's
// certificate is checked instead (against `tls`'s CA, default tls_files_from_environment()), and
// the payload's stdio is streamed over the connection rather than passed as fds; everything else
// is the same.
class ServerConnection {
 public:
  // Connects; throws ServerRefused when nobody listens at `endpoint`, when the listener runs as a
  // uid not accepted above, or when the TLS handshake fails (saying why).
  explicit ServerConnection(const std::string& endpoint,
                            std::optional<uid_t> server_uid = std::nullopt,
                            std::optional<TlsFiles> tls = std::nullopt);
  ~ServerConnection();
  ServerConnection(const ServerConnection&) = delete;
  ServerConnection& operator=(const ServerConnection&) = delete;

  // {"op":"hello","version":1,"policies":[...],"pid":N}
  nlohmann::json hello();
  // The effective policy the server offers under `name` (a base to tighten).
  Policy policy(const std::string& name);

  // What the server runs, as this client may see it (ends the connection):
  // {"op":"status","pid":N,"uptime_ms":N,"pools":{NAME:{...}},"scope":"own"|"all",
  //  "running":[{"id","op":"run"|"session","policy","uid","gid","pid","age_ms","started",
  //  "killed"}]}. A client sees its own uid's runs and sessions; root and the server's uid see all.
  nlohmann::json status();
  // Ends run or session `id` (from status) now: a run ends interrupted, a session's cell and
  // every later call fail, each saying who killed it. A client may kill only its own uid's; root
  // and the server's uid any. Throws ServerRefused ("refused") otherwise (ends the connection).
  void kill(std::uint64_t id);

  // The node contract (docs/fleet.md), each ending the connection:
  // {"op":"health","alive":true,"node":ID,"pid":N}
  nlohmann::json health();
  // {"op":"ready","node":ID,"ready":BOOL,"why":[...]}: not draining, every pool at its minimum.
  nlohmann::json ready();
  // {"op":"capacity","node_id","version","features","cores","memory_bytes","max_sandboxes",
  //  "running","starting","warm_idle","pressure","draining","ready",...}
  nlohmann::json capacity();
  // Drains the node (root and the server's uid only; ServerRefused "refused" otherwise): new work
  // is refused, what runs gets `grace` (default the server's drain_grace), then ends.
  // {"op":"draining","node":ID,"grace_ms":N}
  nlohmann::json drain(std::optional<std::chrono::milliseconds> grace = std::nullopt);

  // Runs `request` under the offered policy `policy_name`, tightened to `overrides` when given.
  // Ends the connection. Throws ServerRefused when the server refuses, Error for a request invalid
  // for the policy; a failing payload is a Result, as with every backend.
  Result run(const Request& request, const std::string& policy_name,
             const Policy* overrides = nullptr);
  // A REPL session in the server's sandbox; `options.llm` answers the cell's llm_query calls.
  // The session owns the connection from here on.
  std::unique_ptr<Session> open_session(const std::string& policy_name, const Policy* overrides,
                                        SessionOptions options);

 private:
  nlohmann::json node_request(const nlohmann::json& request, const std::string& answer);
  struct State;
  std::unique_ptr<State> state_;
};

// A Backend named "server" over the server at `socket_path`: run(request, policy) asks the server
// for policy.name with `policy` as the tightened candidate (the server refuses anything looser
// than what it offers), and open_session likewise. `server_uid` as for ServerConnection.
std::unique_ptr<Backend> make_server_client(std::string socket_path,
                                            std::optional<uid_t> server_uid = std::nullopt,
                                            std::optional<TlsFiles> tls = std::nullopt);

// The socket named by $RLM_SANDBOX_SERVER, or nullopt when it is unset or empty.
std::optional<std::string> server_from_environment();

// The server uid named by $RLM_SANDBOX_SERVER_UID (accepted besides root and this process's own),
// or nullopt when it is unset or empty; throws Error when it is not a uid.
std::optional<uid_t> server_uid_from_environment();

// `text` as a uid (decimal digits only, not (uid_t)-1); throws Error naming `what` otherwise.
uid_t parse_server_uid(const std::string& text, const std::string& what);

}  // namespace rlm
