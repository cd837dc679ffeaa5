// `run --server` and `repl --server` (or $RLM_SANDBOX_SERVER): the command goes to a running
// `rlm-sandbox serve`, and when that server cannot serve, the command fails (exit 125) with its
// reason; it never runs anywhere else.
#pragma once

#include <sys/types.h>

#include <functional>
#include <memory>
#include <optional>
#include <string>

#include <boost/program_options.hpp>

#include "rlm_sandbox/client.hpp"
#include "rlm_sandbox/fleet.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/request.hpp"
#include "rlm_sandbox/result.hpp"

namespace rlm::cli {

// The --server flag's description, for run and repl.
inline constexpr const char* kServerFlagHelp =
    "PATH or tls://HOST:PORT: run in the warm sandboxes of `rlm-sandbox serve` at this socket, "
    "or at its TLS listener (with --tls-cert, --tls-key, --tls-ca) (also $RLM_SANDBOX_SERVER); "
    "if it cannot serve, fail with exit 125, never run elsewhere";

// The client's TLS files, for tls:// servers and fleet nodes: added to `options` by
// add_tls_flags, read by tls_files.
void add_tls_flags(boost::program_options::options_description& options);
// The files the --tls-* flags name, each unset one from $RLM_SANDBOX_TLS_*; nullopt with no flag
// (the client library then reads the environment itself).
std::optional<TlsFiles> tls_files(const boost::program_options::variables_map& values);

// The --server-uid flag's description, for run and repl.
inline constexpr const char* kServerUidFlagHelp =
    "UID: the server may run as this uid (also $RLM_SANDBOX_SERVER_UID); otherwise a server "
    "listening as any uid but root or yours is refused before anything is sent to it (exit 125)";

// The --fleet flag's description, for run and repl.
inline constexpr const char* kFleetFlagHelp =
    "SOURCE: place the run or session on one node of a fleet of `rlm-sandbox serve` nodes: a "
    "file of endpoints (unix:PATH or tls://HOST:PORT, one per line), a directory of "
    "NODE.endpoint files (serve --register DIR), or slurm:PORT (the TLS listener on PORT of "
    "each host in $SLURM_JOB_NODELIST); also $RLM_SANDBOX_FLEET. The best of 3 random nodes by "
    "free room; a full, draining or dead node is passed over (docs/fleet.md)";

// The fleet named by --fleet, else by $RLM_SANDBOX_FLEET; nullptr for neither. Throws Error
// when --server or --backend is given too, or the fleet cannot be read.
std::shared_ptr<Fleet> fleet_of(const boost::program_options::variables_map& values);

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
                     const std::optional<TlsFiles>& tls, const std::string& policy_name,
                     const Request& request, const std::function<Policy(Policy)>& change);
// The same on a node of `fleet` (the policy to change is the first answering node's copy).
Result run_on_fleet(Fleet& fleet, const std::string& policy_name, const Request& request,
                    const std::function<Policy(Policy)>& change);

}  // namespace rlm::cli
