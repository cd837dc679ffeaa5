// The server's client: connections, the "server" Backend, and $RLM_SANDBOX_SERVER.
#include <unistd.h>

#include <charconv>
#include <cstdint>
#include <cstdlib>

#include "host/context_fd.hpp"
#include "rlm_sys/sys.hpp"
#include "server/client_state.hpp"

namespace rlm {

using host::UniqueFd;
using nlohmann::json;
using server::Clock;

ServerConnection::ServerConnection(const std::string& endpoint, std::optional<uid_t> server_uid,
                                   std::optional<TlsFiles> tls)
    : state_(std::make_unique<State>()) {
  state_->path = endpoint;
  state_->socket = server::connect_to_server(endpoint, server_uid, std::nullopt, tls);
}

ServerConnection::~ServerConnection() = default;

json ServerConnection::hello() {
  server::send_to_server(state_->socket.get(),
                         {{"op", "hello"}, {"version", server::kProtocolVersion}});
  return server::server_reply(state_->socket.get(), Clock::now() + server::kReplyTimeout);
}

json ServerConnection::status() {
  server::send_to_server(state_->socket.get(), {{"op", "status"}});
  json reply = server::server_reply(state_->socket.get(), Clock::now() + server::kReplyTimeout);
  if (reply["op"] != "status" || !reply.value("running", json()).is_array())
    throw ServerRefused("internal", "the server answered out of turn");
  return reply;
}

void ServerConnection::kill(std::uint64_t id) {
  server::send_to_server(state_->socket.get(), {{"op", "kill"}, {"id", id}});
  const json reply =
      server::server_reply(state_->socket.get(), Clock::now() + server::kReplyTimeout);
  if (reply["op"] != "killed") throw ServerRefused("internal", "the server answered out of turn");
}

json ServerConnection::node_request(const json& request, const std::string& answer) {
  server::send_to_server(state_->socket.get(), request);
  json reply = server::server_reply(state_->socket.get(), Clock::now() + server::kReplyTimeout);
  if (reply.value("op", "") != answer)
    throw ServerRefused("internal", "the server answered out of turn");
  return reply;
}

json ServerConnection::health() {
  return node_request({{"op", "health"}}, "health");
}

json ServerConnection::ready() {
  return node_request({{"op", "ready"}}, "ready");
}

json ServerConnection::capacity() {
  return node_request({{"op", "capacity"}}, "capacity");
}

json ServerConnection::drain(std::optional<std::chrono::milliseconds> grace) {
  json request{{"op", "drain"}};
  if (grace) request["grace_ms"] = grace->count();
  return node_request(request, "draining");
}

Policy ServerConnection::policy(const std::string& name) {
  server::send_to_server(state_->socket.get(), {{"op", "policy"}, {"policy", name}});
  const json reply =
      server::server_reply(state_->socket.get(), Clock::now() + server::kReplyTimeout);
  if (reply["op"] != "policy" || !reply.contains("policy"))
    throw ServerRefused("internal", "the server answered out of turn");
  Policy policy = policy_from_json(reply["policy"], "the server's policy " + name);
  policy.name = name;
  return policy;
}

namespace {

// The context as an fd the server reads to EOF: the file (opened here, with this process's
// rights), or a memfd holding the text; none without a context.
UniqueFd context_fd(const SessionOptions& options) {
  if (options.context_file.empty() && options.context.empty() && !options.context_is_json)
    return {};
  return host::open_context_fd(options.context_file, options.context);
}

}  // namespace

std::unique_ptr<Session> ServerConnection::open_session(const std::string& policy_name,
                                                        const Policy* overrides,
                                                        SessionOptions options) {
  validate_tools(options.tools);
  const auto& limits = options.llm_limits;
  json frame{{"op", "session_open"},
             {"policy", policy_name},
             {"options",
              {{"context_is_json", options.context_is_json},
               {"lifetime_ms", std::max<std::int64_t>(1, options.lifetime.count())},
               {"llm", options.llm ? "client" : "none"},
               {"llm_concurrency", limits.concurrency},
               {"llm_timeout_ms", limits.call_timeout.count()},
               {"llm_budget", limits.budget},
               {"echo", options.echo_expression},
               {"tools", tools_to_json(options.tools)}}}};
  if (overrides) frame["overrides"] = overrides->to_json();
  UniqueFd context = context_fd(options);
  const int context_number = context.get();
  server::send_to_server(
      state_->socket.get(), frame,
      context ? std::span<const int>(&context_number, 1) : std::span<const int>{});
  context.reset();
  const auto deadline = Clock::now() + std::max<std::chrono::milliseconds>(options.start_timeout,
                                                                           server::kReplyTimeout);
  const json reply = server::server_reply(state_->socket.get(), deadline);
  if (reply["op"] != "session_opened")  // nothing opened: as for a run before "started"
    throw ServerRefused("unavailable", "the server answered out of turn (no session opened)");
  const json node = reply.value("node", json());
  return server::make_relayed_session(std::move(state_->socket), std::move(options),
                                      node.is_string() ? node.get<std::string>() : std::string());
}

namespace {

class ServerBackend final : public Backend {
 public:
  ServerBackend(std::string path, std::optional<uid_t> server_uid, std::optional<TlsFiles> tls)
      : path_(std::move(path)), server_uid_(server_uid), tls_(std::move(tls)) {}

  std::string_view name() const override { return "server"; }
  bool isolated() const override { return true; }
  Health health() const override {
    Health health;
    health.backend = "server";
    health.isolated = true;
    try {
      ServerConnection connection(path_, server_uid_, tls_);
      const json hello = connection.hello();
      health.available = true;
      health.detail = "rlm-sandbox serve at " + path_ + " (pid " +
                      hello.value("pid", json()).dump() + ") offers " +
                      hello.value("policies", json::array()).dump();
      health.host = hello;
    } catch (const Error& error) {
      health.detail = error.what();
      health.fix = "start it: rlm-sandbox serve --socket " + path_ + " --pool default=4";
    }
    return health;
  }
  std::string unavailable_reason() const override {
    try {
      ServerConnection connection(path_, server_uid_, tls_);
      return "";
    } catch (const Error& error) {
      return error.what();
    }
  }
  Result run(const Request& request, const Policy& policy) override {
    ServerConnection connection(path_, server_uid_, tls_);
    return connection.run(request, policy.name, &policy);
  }
  std::unique_ptr<Session> open_session(const Policy& policy, SessionOptions options) override {
    ServerConnection connection(path_, server_uid_, tls_);
    return connection.open_session(policy.name, &policy, std::move(options));
  }

 private:
  std::string path_;
  std::optional<uid_t> server_uid_;
  std::optional<TlsFiles> tls_;
};

}  // namespace

std::unique_ptr<Backend> make_server_client(std::string socket_path,
                                            std::optional<uid_t> server_uid,
                                            std::optional<TlsFiles> tls) {
  return std::make_unique<ServerBackend>(std::move(socket_path), server_uid, std::move(tls));
}

std::optional<std::string> server_from_environment() {
  const char* value = std::getenv("RLM_SANDBOX_SERVER");
  if (!value || !*value) return std::nullopt;
  return std::string(value);
}

uid_t parse_server_uid(const std::string& text, const std::string& what) {
  std::uint64_t value = 0;
  const auto end = text.data() + text.size();
  const auto [stop, error] = std::from_chars(text.data(), end, value);
  if (text.empty() || error != std::errc() || stop != end ||
      value >= static_cast<std::uint64_t>(static_cast<uid_t>(-1)))
    throw Error(what + " '" + text + "': not a uid (a number, e.g. 0 or 1000)");
  return static_cast<uid_t>(value);
}

std::optional<uid_t> server_uid_from_environment() {
  const char* value = std::getenv("RLM_SANDBOX_SERVER_UID");
  if (!value || !*value) return std::nullopt;
  return parse_server_uid(value, "RLM_SANDBOX_SERVER_UID");
}

}  // namespace rlm
