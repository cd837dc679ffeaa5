// What the client's run and session share: connecting, and asking for a reply that is not an
// error frame.
#pragma once

#include <sys/types.h>

#include <optional>
#include <string>

#include <nlohmann/json.hpp>

#include "host/unique_fd.hpp"
#include "rlm_sandbox/client.hpp"
#include "server/wire.hpp"

namespace rlm::server {

// A frame from the server may be as large as its biggest Result or cell result.
inline constexpr std::uint64_t kMaxServerFrame = 1ull << 30;
inline constexpr std::chrono::seconds kServerFrameTimeout{60};
inline constexpr std::chrono::seconds kReplyTimeout{60};

// The connection to the server broke or ended with no answer (not an error frame the server
// sent): kind "unavailable", told apart by its type where it matters (a run or session whose
// node went away: node_lost).
class ConnectionLost final : public ServerRefused {
 public:
  explicit ConnectionLost(const std::string& message) : ServerRefused("unavailable", message) {}
};

// Connects to the server at `path` and checks who listens there before anything is sent: the
// listener's uid (SO_PEERCRED) must be root, this process's, or `server_uid` (default
// $RLM_SANDBOX_SERVER_UID). Throws ServerRefused ("unavailable") naming why not.
// With `deadline`, a listener whose backlog is full (a stopped server, or one that never accepts)
// is waited for only until then. A "tls://HOST:PORT" endpoint is reached over TLS (tls_relay.hpp)
// with `tls`'s files (default tls_files_from_environment()), within `deadline` (default 10 s).
host::UniqueFd connect_to_server(const std::string& path,
                                 std::optional<uid_t> server_uid = std::nullopt,
                                 std::optional<Clock::time_point> deadline = std::nullopt,
                                 const std::optional<TlsFiles>& tls = std::nullopt);

// The next frame from the server, waiting until `deadline` for it; throws ServerRefused for an
// error frame, and for the end of the connection (the server died or dropped us).
nlohmann::json server_reply(int socket, Clock::time_point deadline);
// The same with one hard deadline for the whole frame and a cap on its size: for answers from a
// node that may be hostile or stuck (a fleet's capacity asks).
nlohmann::json server_reply_within(int socket, Clock::time_point deadline, std::uint64_t max_bytes);

// Sends, turning a failure into the server's reason when it left one (a refused peer's error
// frame is waiting in the socket by the time our request is sent).
void send_to_server(int socket, const nlohmann::json& message, std::span<const int> fds = {});

}  // namespace rlm::server
