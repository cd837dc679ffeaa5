// An attach hands the HTTP connection over to a raw two-way byte stream ("hijack", HTTP 101 with
// Upgrade: tcp): the payload's stdin goes one way, its multiplexed stdout and stderr the other.
// libcurl has no interface for a connection that turns two-way after the response headers, so
// this one request is written and its headers parsed here, on a plain unix socket; every other
// call goes through EngineApi.
#pragma once

#include <chrono>
#include <optional>
#include <string>
#include <string_view>

#include "host/unique_fd.hpp"

namespace rlm::docker {

struct HijackedConnection {
  host::UniqueFd fd;        // nonblocking, close-on-exec
  std::string early_bytes;  // stream bytes that came in the same read as the response headers
};

// Sends METHOD /v1.41PATH (with a JSON body when given) asking for the upgrade and reads the
// response headers. Throws DaemonError with Docker's message for any other answer, and for a
// daemon that cannot be reached or does not answer within `timeout`.
HijackedConnection open_hijacked(const std::string& socket_path, std::string_view method,
                                 const std::string& path, const std::optional<std::string>& body,
                                 std::chrono::milliseconds timeout);

}  // namespace rlm::docker
