// `run --server` and `repl --server` (or $RLM_SANDBOX_SERVER): the command goes to a running
// `rlm-sandbox serve`, and when that server cannot serve, the command fails (exit 125) with its
// reason; it never runs anywhere else.
#pragma once

#include <sys/types.h>

#include <functional>
#include <optional>
#include <string>

#include <boost/program_options.hpp>

#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/request.hpp"
#include "rlm_sandbox/result.hpp"

namespace rlm::cli {

// The --server flag's description, for run and repl.
inline constexpr const char* kServerFlagHelp =
    "PATH: run in the warm sandboxes of `rlm-sandbox serve` at this socket (also "
    "$RLM_SANDBOX_SERVER); if it cannot serve, fail with exit 125, never run elsewhere";

// The --server-uid flag's description, for run and repl.
inline constexpr const char* kServerUidFlagHelp =
    "UID: the server may run as this uid (also $RLM_SANDBOX_SERVER_UID); otherwise a server "
    "listening as any uid but root or yours is refused before anything is sent to it (exit 125)";

// The socket named by --server, else by $RLM_SANDBOX_SERVER; nullopt for neither. Throws Error
// when --backend names a backend too (the server's policy chooses).
std::optional<std::string> server_socket(const boost::program_options::variables_map& values);

// The uid named by --server-uid (nullopt: $RLM_SANDBOX_SERVER_UID, read by the client library);
// throws Error when it is not a uid.
std::optional<uid_t> server_uid(const boost::program_options::variables_map& values);

// Runs `request` on the server under its policy `policy_name`. When `change` is set (a flag
// changed the policy), it is applied to the server's own copy of that policy and the result sent
// as the tightened candidate; otherwise nothing about the policy is sent, loaded or checked here.
Result run_on_server(const std::string& socket, std::optional<uid_t> server_uid,
                     const std::string& policy_name, const Request& request,
                     const std::function<Policy(Policy)>& change);

}  // namespace rlm::cli
