// One execution: a command (argv) or a piece of code in a language.
#pragma once

#include <sys/types.h>

#include <array>
#include <chrono>
#include <cstdint>
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/result.hpp"

namespace rlm {

// What a running sandbox has counted so far, where the backend can tell (a cgroup).
struct LiveCounters {
  std::optional<std::uint64_t> oom_kills;        // processes the kernel killed at the memory limit
  std::optional<std::chrono::microseconds> cpu;  // CPU time of every process in the sandbox
  std::optional<NetworkAccount> network;         // under an egress allowlist: its account so far
};

// What the caller of a run may do with its sandbox while it runs (Request::on_started): each
// stays callable from any thread, and does nothing once run() returned.
struct RunningSandbox {
  // The run's counters so far (empty once run() returned).
  std::function<LiveCounters()> counters;
  // Under an egress allowlist the backend enforces: from now on `narrower` is the list (the
  // caller has checked it lets through nothing the current one does not: narrow_network() in
  // tightening.hpp). The sandbox's DNS answers and new connections follow it, and its open
  // connections the narrower list does not let through end at once. Null where there is no
  // allowlist to narrow.
  std::function<void(const Egress&)> narrow_network;
};

// A host uid and gid.
struct HostIds {
  uid_t uid = 0;
  gid_t gid = 0;
  friend bool operator==(const HostIds&, const HostIds&) = default;
};

// The calling process's real uid and gid: whose a run's written files are by default.
HostIds caller_ids();

struct Request {
  std::vector<std::string> argv;  // either this,
  std::string code;               // or code in a language:
  std::string language;           // "python" (python3 -c), "bash" (bash -c), "sh" (sh -c)

  std::string stdin_data;  // fed to the payload's stdin, then EOF
  int stdin_fd = -1;       // when >= 0, read until EOF and forwarded instead (never closed)
  std::map<std::string, std::string> env;  // set on top of the policy's environment

  std::optional<std::chrono::milliseconds> timeout;  // may only tighten the policy's wall time
  // The CPU time of the whole sandbox, every process together, when it must differ from the
  // policy's limits.cpu_time_ms (which then still bounds each process through RLIMIT_CPU). Set by
  // sessions: their sandbox hosts many cells, each held to the policy's limits on its own.
  std::optional<std::chrono::milliseconds> sandbox_cpu_time;

  // When set, output is delivered here as it arrives instead of being kept in the Result (the
  // policy's output cap still applies). Called on the thread that called run().
  std::function<void(std::string_view)> on_stdout;
  std::function<void(std::string_view)> on_stderr;

  // For callers that drive the payload while run() blocks on another thread (sessions):
  // fds the payload inherits under the same numbers (each >= 4, at most 2; the caller keeps
  // ownership), an fd that stops the run (init and everything under it) once it is readable, and
  // a callback on run()'s thread once the payload is running, handing over what the caller may
  // do with the sandbox while it runs (RunningSandbox).
  std::vector<int> inherit_fds;
  int stop_fd = -1;
  std::function<void(RunningSandbox)> on_started;

  // When all three are >= 0, the payload's stdin, stdout and stderr are these fds themselves (the
  // caller keeps ownership): output goes where they lead without passing through this process, so
  // the Result has no stdout/stderr and limits.output_bytes is for the reader to enforce (a
  // server's client does). stdin_data, stdin_fd, on_stdout and on_stderr must then be unset.
  std::array<int, 3> payload_stdio{-1, -1, -1};

  // The payload may signal (and prlimit) only itself and processes started after it, so what it
  // starts can never touch what was there before it (a session's checkpoints). Enforced by the
  // namespace backend (rlm-sandbox-init's --guard-signals); a run it cannot guard does not start.
  // The local and docker backends ignore it.
  bool guard_signals = false;

  // A run that reaches its process limit (limits.pids) is stopped there (a fork bomb would retry
  // until the wall limit). Sessions turn this off: their sandbox hosts many cells, and a cell that
  // cannot start another thread or process gets the kernel's refusal as an error of its own and is
  // rolled back, while the session goes on.
  bool stop_at_process_limit = true;

  // Whose the files are that the payload writes through read-write binds, on the host: where the
  // runtime is root, the namespace backend idmaps each such bind to these ids (the sandbox user
  // reads and writes there as they would, and what it makes belongs to them, never to the
  // sandbox's own host uid, which a later sandbox may be given). Unset: caller_ids(). A server
  // sets its client's. Rootless runtimes write as themselves and ignore it.
  std::optional<HostIds> bind_owner;
};

// The argv a request runs: `argv` itself, or the interpreter for `language` with `code`.
// Throws Error for a request with neither, both, or an unknown language.
std::vector<std::string> resolve_argv(const Request& request);

struct Policy;
// The wall time this request runs under: the policy's, or the request's tighter one. Throws Error
// when the request asks for more than the policy allows.
std::chrono::milliseconds effective_wall_time(const Request& request, const Policy& policy);

}  // namespace rlm
