// The "run" op: one payload in a sandbox of the client's pool, its stdio the client's three fds.
#include <poll.h>
#include <sys/socket.h>

#include <limits>

#include "rlm_sandbox/request.hpp"
#include "rlm_sandbox/units.hpp"
#include "server/connection.hpp"

namespace rlm::server {
namespace {

using host::UniqueFd;
using nlohmann::json;

constexpr std::size_t kMaxArgs = 65536;
constexpr std::size_t kMaxEnv = 4096;

[[noreturn]] void invalid(const std::string& message) {
  throw Refusal("invalid", "run request: " + message);
}

std::string string_field(const json& value, const char* name) {
  if (!value.is_string()) invalid(std::string("\"") + name + "\" must be a string");
  std::string text = value.get<std::string>();
  if (text.find('\0') != std::string::npos)
    invalid(std::string("\"") + name + "\" must not hold a NUL byte");
  return text;
}

// The client's request, every field checked (the frame is bounded already; this bounds meaning).
Request request_from_json(const json& body) {
  if (!body.is_object()) invalid("\"request\" must be an object");
  Request request;
  for (const auto& [key, value] : body.items()) {
    if (key == "argv") {
      if (!value.is_array() || value.empty() || value.size() > kMaxArgs)
        invalid("\"argv\" must be an array of 1 to " + std::to_string(kMaxArgs) + " strings");
      for (const auto& word : value) request.argv.push_back(string_field(word, "argv"));
    } else if (key == "code") {
      request.code = string_field(value, "code");
    } else if (key == "language") {
      request.language = string_field(value, "language");
    } else if (key == "env") {
      if (!value.is_object() || value.size() > kMaxEnv)
        invalid("\"env\" must be an object of at most " + std::to_string(kMaxEnv) + " strings");
      for (const auto& [name, text] : value.items()) {
        if (name.empty() || name.find_first_of(std::string("=\0", 2)) != std::string::npos)
          invalid("\"env\" has a name that is empty or holds '=' or NUL");
        request.env[name] = string_field(text, "env");
      }
    } else if (key == "timeout_ms") {
      if (!value.is_number_unsigned() || value.get<std::uint64_t>() == 0 ||
          value.get<std::uint64_t>() > std::numeric_limits<std::int32_t>::max())
        invalid("\"timeout_ms\" must be a positive integer");
      request.timeout = std::chrono::milliseconds(value.get<std::uint64_t>());
    } else if (key == "stdin") {
      if (value != "fd" && value != "null") invalid("\"stdin\" must be \"fd\" or \"null\"");
    } else {
      invalid("unknown key in \"request\"");
    }
  }
  try {
    request.argv = resolve_argv(request);
  } catch (const Error& error) {
    invalid(error.what());
  }
  request.code.clear();
  request.language.clear();
  return request;
}

// What the client's frame after the run said, if it sent one: {"op":"stop","reason":...}.
struct Stop {
  std::string reason;  // "output_limit", "interrupted", or "" for none or a disconnect
  std::string stream;  // for output_limit: "stdout" or "stderr"
};

Stop stop_frame(const Connection& connection) {
  Stop stop;
  pollfd entry{connection.socket, POLLIN, 0};
  if (poll(&entry, 1, 0) <= 0) return stop;
  try {
    auto frame = receive_frame(connection.socket, Clock::now() + std::chrono::milliseconds(100),
                               std::chrono::milliseconds(100), 4096);
    if (!frame || frame->message.value("op", "") != "stop") return stop;
    const json& message = frame->message;
    if (message.value("reason", json()) == "output_limit") {
      stop.reason = "output_limit";
      stop.stream = message.value("stream", json()) == "stderr" ? "stderr" : "stdout";
    } else {
      stop.reason = "interrupted";
    }
  } catch (const Error&) {
  }
  return stop;
}

// A run the client stopped says why, as a direct run would.
void explain(Result& result, const Stop& stop, std::uint64_t output_cap) {
  if (stop.reason == "output_limit") {
    result.status = Status::output_limit;
    result.detail = stop.stream + " exceeded the output limit of " + format_size(output_cap);
    (stop.stream == "stderr" ? result.stderr_truncated : result.stdout_truncated) = true;
  } else if (stop.reason == "interrupted" && result.status == Status::interrupted &&
             result.detail == "stopped by the caller") {
    result.detail = "stopped by the client";
  }
}

}  // namespace

void serve_run(const Connection& connection, const json& frame, std::vector<UniqueFd> fds) {
  const Admitted admitted = admit(connection, frame);
  const Policy& policy = admitted.policy();
  Request request = request_from_json(frame.value("request", json()));
  if (fds.size() != 3)
    throw Refusal("invalid", "a run takes exactly 3 fds (stdin, stdout, stderr); " +
                                 std::to_string(fds.size()) + " came");
  check_client_fd(fds[0].get(), "stdin", FdUse::stdio);
  check_client_fd(fds[1].get(), "stdout", FdUse::stdio);
  check_client_fd(fds[2].get(), "stderr", FdUse::stdio);
  try {
    (void)effective_wall_time(request, policy);
  } catch (const Error& error) {
    throw Refusal("invalid", error.what());
  }
  request.payload_stdio = {fds[0].get(), fds[1].get(), fds[2].get()};
  // What the payload writes through a read-write bind is the client's on the host, never the
  // sandbox uid's (request.hpp).
  request.bind_owner = HostIds{connection.peer.uid, connection.peer.gid};
  // The client's next frame (a stop) or its hangup stops the run.
  request.stop_fd = connection.socket;

  // Past max_sandboxes, or draining: refused now, never queued.
  Node::Slot slot = connection.node.take(connection.peer.uid);
  slot.started();
  const std::string& offered = admitted.offer->offered.name;
  // A kill (status and kill ops, another connection's thread) ends the run as the client's own
  // hangup would: our side of the socket stops reading, which the run's stop_fd sees.
  const auto activity = connection.activities.add(
      "run", connection.peer, offered,
      [socket = connection.socket](const std::string&) { shutdown(socket, SHUT_RD); });
  json request_event{{"event", "request"},
                     {"op", "run"},
                     {"id", activity->id()},
                     {"policy", offered},
                     {"tightened", admitted.candidate != nullptr}};
  request_event.update(connection.who());
  connection.log.record(std::move(request_event));

  const std::uint64_t cap = policy.limits.output_bytes;
  connection.send({{"op", "started"}, {"policy", offered}, {"output_bytes", cap}});
  Result result = admitted.candidate ? admitted.offer->pool->run(request, policy)
                                     : admitted.offer->pool->run(request);
  fds.clear();  // the client reads its pipes to EOF: none of their ends may stay here
  if (const auto killed = activity->killed()) {
    result.status = connection.node.drained() ? Status::node_drained : Status::interrupted;
    result.detail = *killed;
  } else {
    explain(result, stop_frame(connection), cap);
  }
  result.policy = offered;
  result.node = connection.node.id();
  json end{{"event", "end"},
           {"op", "run"},
           {"id", activity->id()},
           {"policy", offered},
           {"status", to_string(result.status)},
           {"wall_ms", std::chrono::duration_cast<std::chrono::milliseconds>(result.wall).count()},
           {"cpu_ms", std::chrono::duration_cast<std::chrono::milliseconds>(result.cpu).count()}};
  if (result.exit_code >= 0) end["exit_code"] = result.exit_code;
  if (result.signal > 0) end["signal"] = result.signal;
  if (!result.detail.empty()) end["detail"] = result.detail;
  end.update(connection.who());
  connection.log.record(std::move(end));
  slot.release();
  connection.send({{"op", "result"}, {"result", result.to_json()}});
}

}  // namespace rlm::server
