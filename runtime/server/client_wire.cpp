#include "server/client_wire.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <fcntl.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <thread>

#include "rlm_sys/sys.hpp"
#include "server/peer.hpp"
#include "server/tls_relay.hpp"

namespace rlm {

using nlohmann::json;

ServerRefused::ServerRefused(std::string kind, const std::string& message,
                             std::vector<Diagnostic> diagnostics)
    : Error(message), kind_(std::move(kind)), diagnostics_(std::move(diagnostics)) {}

TlsFiles tls_files_from_environment() {
  const auto named = [](const char* name) {
    const char* value = std::getenv(name);
    return std::string(value ? value : "");
  };
  return {named("RLM_SANDBOX_TLS_CERT"), named("RLM_SANDBOX_TLS_KEY"), named("RLM_SANDBOX_TLS_CA")};
}

namespace server {

namespace {

// Whoever listens first at a socket path receives what a client sends -- the payload's stdin fd,
// its output pipes -- and may answer with forged output. A server another tenant could have
// bound is used only when it runs as root, as this process's uid, or as the uid the caller names.
void check_listener(int socket, const std::string& path, std::optional<uid_t> server_uid) {
  const auto credentials = peer_credentials(socket);
  if (!credentials)
    throw ServerRefused("unavailable", "cannot tell who listens at " + path +
                                           " (SO_PEERCRED: " + sys::errno_text(errno) +
                                           "); refusing to send it anything");
  if (!server_uid) server_uid = server_uid_from_environment();
  const uid_t uid = credentials->uid;
  if (uid == 0 || uid == geteuid() || uid == getuid() || (server_uid && uid == *server_uid)) return;
  const std::string text = std::to_string(uid);
  throw ServerRefused("unavailable", "the process listening at " + path + " runs as uid " + text +
                                         ", not root or you; refusing to send it anything (set "
                                         "RLM_SANDBOX_SERVER_UID=" +
                                         text + " if it is yours)");
}

}  // namespace

host::UniqueFd connect_to_server(const std::string& path, std::optional<uid_t> server_uid,
                                 std::optional<Clock::time_point> deadline,
                                 const std::optional<TlsFiles>& tls) {
  if (is_tls_endpoint(path))
    return connect_tls(path, tls ? *tls : tls_files_from_environment(),
                       deadline.value_or(Clock::now() + std::chrono::seconds(10)));
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (path.empty() || path.size() >= sizeof address.sun_path)
    throw ServerRefused("unavailable", "server socket '" + path + "': not a usable socket path");
  std::memcpy(address.sun_path, path.c_str(), path.size() + 1);
  host::UniqueFd socket(
      ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | (deadline ? SOCK_NONBLOCK : 0), 0));
  if (!socket) throw ServerRefused("unavailable", "socket(): " + sys::errno_text(errno));
  while (connect(socket.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) != 0) {
    if (errno == EINTR) continue;
    if (deadline && errno == EAGAIN) {  // its backlog is full: it is not accepting
      if (Clock::now() >= *deadline)
        throw ServerRefused("unavailable", "the server at " + path + " is not accepting");
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
      continue;
    }
    if (errno == EACCES)
      throw ServerRefused(
          "unavailable",
          "permission denied on the socket " + path + ": the socket file does not let uid " +
              std::to_string(geteuid()) +
              " connect; the server's owner can allow it (rlm-sandbox serve --allow-uid " +
              std::to_string(geteuid()) +
              ", which grants it the socket too, or --allow-gid with one of its groups)");
    throw ServerRefused("unavailable", "no server at " + path + ": " + sys::errno_text(errno));
  }
  if (deadline) fcntl(socket.get(), F_SETFL, fcntl(socket.get(), F_GETFL) & ~O_NONBLOCK);
  check_listener(socket.get(), path, server_uid);
  return socket;
}

namespace {

// A frame once it begins must end within `frame_timeout`, and hold at most `max_bytes`.
json reply_of(int socket, Clock::time_point deadline, std::uint64_t max_bytes,
              std::chrono::milliseconds frame_timeout) {
  std::optional<Frame> frame;
  try {
    frame = receive_frame(socket, deadline, frame_timeout, max_bytes);
  } catch (const WireError& error) {
    throw ConnectionLost(std::string("the server's answer broke off: ") + error.what());
  }
  if (!frame) throw ConnectionLost("the server closed the connection");
  json& message = frame->message;
  if (message["op"] == "error") {
    std::vector<Diagnostic> diagnostics;
    if (const auto list = message.find("diagnostics"); list != message.end() && list->is_array())
      for (const auto& item : *list)
        if (item.is_object())
          diagnostics.push_back({item.value("path", ""), item.value("message", "")});
    const std::string text = message.value("message", json()).is_string()
                                 ? message.value("message", std::string())
                                 : std::string("(no message)");
    throw ServerRefused(message.value("kind", json()).is_string()
                            ? message.value("kind", std::string())
                            : std::string("internal"),
                        "the server refused: " + text, std::move(diagnostics));
  }
  return std::move(message);
}

}  // namespace

json server_reply(int socket, Clock::time_point deadline) {
  return reply_of(socket, deadline, kMaxServerFrame, kServerFrameTimeout);
}

json server_reply_within(int socket, Clock::time_point deadline, std::uint64_t max_bytes) {
  const auto left = std::chrono::duration_cast<std::chrono::milliseconds>(deadline - Clock::now());
  return reply_of(socket, deadline, max_bytes, std::max(left, std::chrono::milliseconds(1)));
}

void send_to_server(int socket, const json& message, std::span<const int> fds) {
  try {
    send_frame(socket, message, Clock::now() + kReplyTimeout, fds);
  } catch (const WireError& error) {
    // What the server said before it closed, if it said anything.
    server_reply(socket, Clock::now() + std::chrono::milliseconds(100));
    throw ConnectionLost(std::string("the server dropped the connection: ") + error.what());
  }
}

}  // namespace server
}  // namespace rlm
