// HTTP/1.1 requests from the host: the Docker Engine API over its unix socket and the HTTP LM
// handler. The only code that touches libcurl lives behind this header (runtime/http/), in its own
// library: the static CLI links a stub whose every function throws NeedsFullBinary, and the CLI
// then re-executes its dynamically linked sibling (which has libcurl) with the same arguments.
#pragma once

#include <chrono>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rlm_sandbox/error.hpp"

namespace rlm::http {

struct Request {
  std::string method = "GET";            // GET, POST, DELETE, ...
  std::string url;                       // "http://localhost/v1.43/containers/json", "https://..."
  std::string unix_socket;               // when set, connect here instead of the URL's host
  std::vector<std::string> headers;      // "Content-Type: application/json"; sent as given, and
                                         // none is added for a body (not even Content-Type)
  std::optional<std::string> body;       // sent as is; a POST, PUT or PATCH without one sends
                                         // "Content-Length: 0"
  std::chrono::milliseconds timeout{0};  // whole transfer; 0 = none
  std::chrono::milliseconds connect_timeout{5'000};
  // When set, the response body is delivered here as it arrives instead of being kept in
  // Response::body; returning false aborts the transfer (Response::aborted). An exception it
  // throws ends the transfer and propagates out of perform().
  std::function<bool(std::string_view)> on_body;
};

struct Response {
  long status = 0;                             // HTTP status; 0 when no response came
  std::map<std::string, std::string> headers;  // lower-cased names; repeats joined with ", "
  std::string body;
  bool aborted = false;  // on_body returned false; not an error (Response::error stays "")
  std::string error;     // transport failure in words (connect refused, timeout, ...); "" on
                         // success, whatever the HTTP status
};

// Performs one request; never throws for transport failures (they are Response::error). Thread-safe
// (one easy handle per call, no signals). Speaks http:// and https:// only and follows no
// redirects. Throws NeedsFullBinary in the static CLI build.
Response perform(const Request& request);

// Whether this build has a real HTTP client (false in the static CLI's stub).
bool available();

}  // namespace rlm::http
