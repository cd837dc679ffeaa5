// The Docker Engine API over its unix socket, through rlm::http (libcurl). Every call is pinned
// to API version 1.41 (Docker 20.10), which every newer daemon still serves, so the JSON shapes
// the backend reads never change under it.
#pragma once

#include <chrono>
#include <optional>
#include <stdexcept>
#include <string>
#include <string_view>

#include <nlohmann/json.hpp>

namespace rlm::docker {

inline constexpr std::string_view kApiVersion = "1.41";
inline constexpr std::string_view kDefaultSocket = "/var/run/docker.sock";

// Where the daemon listens: DOCKER_HOST=unix://PATH, or /var/run/docker.sock.
struct Endpoint {
  std::string socket_path;  // "" when there is none usable
  std::string problem;      // why (DOCKER_HOST names a TCP or SSH daemon)
};
Endpoint endpoint_from_environment();

// "" when something accepts connections on the socket; otherwise which problem it is (no daemon,
// nothing listening, permission denied) and how to fix it, in words.
std::string socket_problem(const std::string& socket_path);

// A call the daemon did not answer, or answered with an error. The message is for the user.
class DaemonError : public std::runtime_error {
 public:
  DaemonError(std::string message, long status = 0)
      : std::runtime_error(std::move(message)), status_(status) {}
  long status() const { return status_; }  // the HTTP status; 0 when no answer came

 private:
  long status_;
};

struct ApiReply {
  long status = 0;  // 0 when no answer came
  std::string body;
  std::string transport_error;  // why no answer came
  bool timed_out = false;       // the call's own timeout passed first

  bool ok() const { return status >= 200 && status < 300; }
  nlohmann::json json() const;  // the body parsed; null when it is not JSON
  std::string message() const;  // Docker's {"message": ...}, or the body itself
};

class EngineApi {
 public:
  static constexpr std::chrono::milliseconds kCallTimeout{60'000};

  explicit EngineApi(std::string socket_path) : socket_path_(std::move(socket_path)) {}
  const std::string& socket_path() const { return socket_path_; }

  // METHOD /v1.41PATH with an optional JSON body. Never throws for what the daemon says or for a
  // transport failure (see ApiReply); `timeout` 0 waits as long as it takes.
  ApiReply call(std::string_view method, const std::string& path,
                const nlohmann::json* body = nullptr,
                std::chrono::milliseconds timeout = kCallTimeout) const;

  // As call(), but anything other than a 2xx answer throws DaemonError with Docker's own message.
  nlohmann::json expect_json(std::string_view method, const std::string& path,
                             const nlohmann::json* body = nullptr,
                             std::chrono::milliseconds timeout = kCallTimeout) const;
  void expect_ok(std::string_view method, const std::string& path,
                 const nlohmann::json* body = nullptr,
                 std::chrono::milliseconds timeout = kCallTimeout) const;

  // The DaemonError for a reply that is not 2xx: the transport problem with its fix, or Docker's
  // message with the call it answered.
  DaemonError failure(std::string_view method, const std::string& path,
                      const ApiReply& reply) const;

 private:
  std::string socket_path_;
};

// Percent-encodes a query value (filters are JSON).
std::string url_encode(std::string_view text);

}  // namespace rlm::docker
