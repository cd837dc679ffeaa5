// What happened to one execution, in the one JSON shape every backend, the CLI and tests share.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

namespace rlm {

enum class Status {
  ok,                 // exited 0
  exit_nonzero,       // exited with another code
  signaled,           // died of a signal we did not send
  timeout,            // wall time ran out; we stopped it
  cpu_limit,          // CPU time ran out
  memory_limit,       // killed or starved by the memory limit
  pids_limit,         // process limit reached
  output_limit,       // stdout or stderr exceeded the cap; we stopped it
  seccomp_violation,  // killed by the seccomp filter
  sandbox_error,      // the sandbox could not be set up
  interrupted,        // the caller stopped it (Request::stop_fd; a signal to the CLI): the payload
                      // got SIGTERM and the policy's kill grace
  node_drained,       // the server's node drained and its grace ran out (docs/fleet.md); as
                      // interrupted otherwise
};

std::string_view to_string(Status status);
std::optional<Status> status_from_string(std::string_view text);

// What a sandbox under an egress allowlist did on the network (docs/network.md, "The account").
struct NetworkAllowed {
  std::chrono::milliseconds at{0};  // since the run started
  std::string name;                 // the name the sandbox asked for ("" for a CIDR entry's)
  std::string address;              // the upstream address the host side connected to
  std::uint16_t port = 0;
  std::string rule;                           // the allow entry, as written
  std::uint64_t bytes_out = 0, bytes_in = 0;  // sandbox -> upstream, upstream -> sandbox
  std::chrono::milliseconds duration{0};
};
struct NetworkDenied {
  // dns, no_rule, sni_mismatch, host_mismatch, ech, private_address, not_tls, protocol (CONNECT,
  // an upgrade, a malformed or second HTTP request), limit, upstream (no address, or it refused)
  std::string kind;
  std::string name;         // the name asked for or presented ("" when none)
  std::string destination;  // the address the sandbox dialled ("" for DNS)
  std::uint16_t port = 0;
  std::uint64_t count = 1;  // the same denial, counted once
};
struct NetworkAccount {
  std::vector<NetworkAllowed> allowed;
  std::vector<NetworkDenied> denied;
  std::uint64_t dns_answered = 0, dns_refused = 0;
  bool truncated = false;  // entries past the caps were counted, not kept
  nlohmann::json to_json() const;
};

// The account to_json() printed. Throws Error for a document of another shape.
NetworkAccount network_account_from_json(const nlohmann::json& document);

// What happened between two readings of one sandbox's account (a session's cell): the
// connections `now` has beyond `before`, each denial's count since (those with none dropped),
// the DNS answers since; truncated when `now` is.
NetworkAccount network_since(const NetworkAccount& before, const NetworkAccount& now);

struct Result {
  Status status = Status::sandbox_error;
  int exit_code = -1;  // the payload's exit code, -1 when it did not exit normally
  int signal = 0;      // the signal that ended it, 0 when none
  std::string detail;  // why, in words: "wall time limit 1s exceeded", "execve(foo): not found"
  std::string stdout_data, stderr_data;
  bool stdout_truncated = false, stderr_truncated = false;
  std::chrono::microseconds wall{0}, cpu{0};
  std::uint64_t peak_memory_bytes = 0;
  std::string backend;
  std::string policy;
  std::string node;  // the server node that ran it (ServerConfig::node_id); "" when none did
  // Policy limits ("limits.memory_bytes", ...) this run could not enforce as the policy means
  // them, e.g. without a usable cgroup; `detail` says what stood in. Empty when all held.
  std::vector<std::string> unenforced;
  // An allowlist run's network account; nullopt under "none" and "host".
  std::optional<NetworkAccount> network;

  // {"status", "exit_code", "signal", "detail", "wall_ms", "cpu_ms", "peak_memory_bytes",
  //  "stdout", "stderr", "stdout_truncated", "stderr_truncated", "backend", "policy",
  //  "unenforced"}, "node" when a server's node ran it, and "network" ({"allowed", "denied",
  //  "dns", "truncated"}) when there is one.
  // Output that is not valid UTF-8 has the offending bytes replaced with U+FFFD.
  nlohmann::json to_json() const;
};

// The Result a to_json() printed (a server's answer, a --json line). Throws Error for a document
// of another shape; keys it does not know are ignored.
Result result_from_json(const nlohmann::json& document);

}  // namespace rlm
