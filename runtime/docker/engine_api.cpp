#include "docker/engine_api.hpp"

#include <sys/socket.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <system_error>

#include "host/container.hpp"
#include "host/unique_fd.hpp"
#include "http/http_client.hpp"

namespace rlm::docker {
namespace {

using Clock = std::chrono::steady_clock;

constexpr std::string_view kStartFix =
    "start it: dockerd & (or systemctl start docker); install it with apt-get install docker.io";

// Inside a container the daemon to use is the host's: installing one in the container would not
// help (a daemon there needs a privileged container).
std::string start_fix() {
  const auto container = host::detect_container();
  if (!container.confirmed) return std::string(kStartFix);
  return std::string("rlm-sandbox runs inside a ") + host::container_name(container.kind) +
         " container (" + container.evidence +
         "), where the host's Docker daemon is the one to use: mount its socket into the "
         "container (docker run -v /var/run/docker.sock:/var/run/docker.sock; in Kubernetes a "
         "hostPath volume), knowing that whoever reaches that socket controls the host, or use the "
         "namespace backend";
}

}  // namespace

Endpoint endpoint_from_environment() {
  const char* host = std::getenv("DOCKER_HOST");
  if (host == nullptr || *host == '\0') return {std::string(kDefaultSocket), ""};
  const std::string_view value = host;
  if (value.starts_with("unix://") && value.size() > 7) return {std::string(value.substr(7)), ""};
  return {"", "DOCKER_HOST=" + std::string(value) +
                  ": the docker backend talks to a local daemon over its unix socket only; set "
                  "DOCKER_HOST=unix:///path/to/docker.sock or unset it for " +
                  std::string(kDefaultSocket)};
}

std::string socket_problem(const std::string& socket_path) {
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  if (socket_path.size() >= sizeof address.sun_path)
    return "the Docker socket path " + socket_path + " is too long for a unix socket";
  socket_path.copy(address.sun_path, socket_path.size());
  host::UniqueFd fd(::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0));
  if (!fd) return "cannot create a unix socket: " + std::generic_category().message(errno);
  if (::connect(fd.get(), reinterpret_cast<const sockaddr*>(&address), sizeof address) == 0)
    return "";
  const int error = errno;
  switch (error) {
    case ENOENT:
      return "the Docker daemon is not running: " + socket_path + " does not exist; " + start_fix();
    case ECONNREFUSED:
      return "the Docker daemon is not running: nothing listens on " + socket_path + "; " +
             start_fix();
    case EACCES:
    case EPERM:
      return "permission denied on the Docker socket " + socket_path +
             ": add your user to the docker group (sudo usermod -aG docker $USER, then log in "
             "again) or run as root";
    default:
      return "cannot connect to the Docker daemon at " + socket_path + ": " +
             std::generic_category().message(error);
  }
}

nlohmann::json ApiReply::json() const {
  return nlohmann::json::parse(body, nullptr, /*allow_exceptions=*/false);
}

std::string ApiReply::message() const {
  const auto parsed = json();
  if (parsed.is_object() && parsed.contains("message") && parsed["message"].is_string())
    return parsed["message"].get<std::string>();
  std::string text = body;
  while (!text.empty() && (text.back() == '\n' || text.back() == '\r')) text.pop_back();
  return text;
}

ApiReply EngineApi::call(std::string_view method, const std::string& path,
                         const nlohmann::json* body, std::chrono::milliseconds timeout) const {
  http::Request request;
  request.method = std::string(method);
  request.url = "http://localhost/v" + std::string(kApiVersion) + path;
  request.unix_socket = socket_path_;
  request.timeout = timeout;
  if (body) {
    request.headers.push_back("Content-Type: application/json");
    request.body = body->dump();
  } else if (method == "POST") {
    request.body = std::string();  // an explicit empty body: Content-Length: 0
  }
  const auto start = Clock::now();
  auto response = http::perform(request);
  ApiReply reply;
  reply.status = response.status;
  reply.body = std::move(response.body);
  reply.transport_error = std::move(response.error);
  reply.timed_out = reply.status == 0 && timeout.count() > 0 && Clock::now() - start >= timeout;
  return reply;
}

DaemonError EngineApi::failure(std::string_view method, const std::string& path,
                               const ApiReply& reply) const {
  const std::string call_name = std::string(method) + " " + path.substr(0, path.find('?'));
  if (reply.status == 0) {
    if (reply.timed_out)
      return DaemonError("the Docker daemon at " + socket_path_ + " did not answer " + call_name +
                         " in time");
    auto problem = socket_problem(socket_path_);
    if (problem.empty())
      problem = "no answer from the Docker daemon at " + socket_path_ + " to " + call_name + ": " +
                reply.transport_error;
    return DaemonError(problem);
  }
  return DaemonError("Docker refused " + call_name + " (HTTP " + std::to_string(reply.status) +
                         "): " + reply.message(),
                     reply.status);
}

nlohmann::json EngineApi::expect_json(std::string_view method, const std::string& path,
                                      const nlohmann::json* body,
                                      std::chrono::milliseconds timeout) const {
  const auto reply = call(method, path, body, timeout);
  if (!reply.ok()) throw failure(method, path, reply);
  auto parsed = reply.json();
  if (parsed.is_discarded())
    throw DaemonError("the Docker daemon answered " + std::string(method) + " " + path +
                      " with something that is not JSON: " + reply.body.substr(0, 200));
  return parsed;
}

void EngineApi::expect_ok(std::string_view method, const std::string& path,
                          const nlohmann::json* body, std::chrono::milliseconds timeout) const {
  const auto reply = call(method, path, body, timeout);
  if (!reply.ok()) throw failure(method, path, reply);
}

std::string url_encode(std::string_view text) {
  static constexpr char kHex[] = "0123456789ABCDEF";
  std::string out;
  for (const unsigned char c : text) {
    const bool plain = (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') ||
                       c == '-' || c == '_' || c == '.' || c == '~';
    if (plain) {
      out += static_cast<char>(c);
    } else {
      out += '%';
      out += kHex[c >> 4];
      out += kHex[c & 15];
    }
  }
  return out;
}

}  // namespace rlm::docker
