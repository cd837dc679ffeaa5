#include "server_client.hpp"

#include "cli.hpp"
#include "rlm_sandbox/client.hpp"
#include "rlm_sandbox/error.hpp"

namespace rlm::cli {

std::optional<std::string> server_socket(const boost::program_options::variables_map& values) {
  std::optional<std::string> socket;
  if (values.count("server"))
    socket = values["server"].as<std::string>();
  else
    socket = server_from_environment();
  if (!socket) return std::nullopt;
  if (socket->empty()) throw Error("--server needs the server's socket path");
  if (values.count("backend") && !values["backend"].defaulted() &&
      values["backend"].as<std::string>() != "auto")
    throw Error("--backend " + values["backend"].as<std::string>() +
                " cannot be used with a server (--server or RLM_SANDBOX_SERVER): the server's "
                "policy chooses its backend");
  return socket;
}

std::optional<uid_t> server_uid(const boost::program_options::variables_map& values) {
  if (!values.count("server-uid")) return std::nullopt;
  return parse_server_uid(values["server-uid"].as<std::string>(), "--server-uid");
}

Result run_on_server(const std::string& socket, std::optional<uid_t> server_uid,
                     const std::string& policy_name, const Request& request,
                     const std::function<Policy(Policy)>& change) {
  ServerConnection connection(socket, server_uid);
  if (!change) return connection.run(request, policy_name);
  const Policy policy = change(connection.policy(policy_name));
  return connection.run(request, policy_name, &policy);
}

}  // namespace rlm::cli
