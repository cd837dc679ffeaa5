#include "server_client.hpp"

#include <cstdlib>

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

std::shared_ptr<Fleet> fleet_of(const boost::program_options::variables_map& values) {
  std::string source;
  if (values.count("fleet")) {
    source = values["fleet"].as<std::string>();
    if (source.empty())
      throw Error("--fleet needs a file of endpoints, a directory of them, or slurm:PORT");
  } else if (const char* named = std::getenv("RLM_SANDBOX_FLEET");
             named && *named && !values.count("server")) {  // a --server flag wins over it
    source = named;
  } else {
    return nullptr;
  }
  if (values.count("server")) throw Error("--fleet and --server name two places to run; give one");
  if (values.count("backend") && !values["backend"].defaulted() &&
      values["backend"].as<std::string>() != "auto")
    throw Error("--backend " + values["backend"].as<std::string>() +
                " cannot be used with a fleet: each node's policy chooses its backend");
  FleetOptions options;
  options.server_uid = server_uid(values);
  options.tls = tls_files(values);
  return std::make_shared<Fleet>(read_fleet(source), options);
}

Result run_on_fleet(Fleet& fleet, const std::string& policy_name, const Request& request,
                    const std::function<Policy(Policy)>& change) {
  if (!change) return fleet.run(request, policy_name);
  const Policy policy = change(fleet.policy(policy_name));
  return fleet.run(request, policy_name, &policy);
}

std::optional<uid_t> server_uid(const boost::program_options::variables_map& values) {
  if (!values.count("server-uid")) return std::nullopt;
  return parse_server_uid(values["server-uid"].as<std::string>(), "--server-uid");
}

void add_tls_flags(boost::program_options::options_description& options) {
  options.add_options()  //
      ("tls-cert", boost::program_options::value<std::string>(),
       "FILE: this client's certificate (PEM) for tls:// servers; its identity is what the "
       "server maps to a uid (also $RLM_SANDBOX_TLS_CERT)")  //
      ("tls-key", boost::program_options::value<std::string>(),
       "FILE: the certificate's private key (also $RLM_SANDBOX_TLS_KEY)")  //
      ("tls-ca", boost::program_options::value<std::string>(),
       "FILE: the CA (PEM) a tls:// server's certificate must be issued by; it must also name the "
       "host dialled (also $RLM_SANDBOX_TLS_CA)");
}

std::optional<TlsFiles> tls_files(const boost::program_options::variables_map& values) {
  if (!values.count("tls-cert") && !values.count("tls-key") && !values.count("tls-ca"))
    return std::nullopt;
  TlsFiles files = tls_files_from_environment();
  if (values.count("tls-cert")) files.cert = values["tls-cert"].as<std::string>();
  if (values.count("tls-key")) files.key = values["tls-key"].as<std::string>();
  if (values.count("tls-ca")) files.ca = values["tls-ca"].as<std::string>();
  return files;
}

Result run_on_server(const std::string& socket, std::optional<uid_t> server_uid,
                     const std::optional<TlsFiles>& tls, const std::string& policy_name,
                     const Request& request, const std::function<Policy(Policy)>& change) {
  ServerConnection connection(socket, server_uid, tls);
  if (!change) return connection.run(request, policy_name);
  const Policy policy = change(connection.policy(policy_name));
  return connection.run(request, policy_name, &policy);
}

}  // namespace rlm::cli
