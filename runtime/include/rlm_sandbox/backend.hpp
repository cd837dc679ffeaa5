// Backends behind one interface, and the registry that picks one for a policy (fail closed).
#pragma once

#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include <nlohmann/json.hpp>

#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/request.hpp"
#include "rlm_sandbox/result.hpp"
#include "rlm_sandbox/session.hpp"

namespace rlm {

struct Health {
  std::string backend;
  bool available = false;
  bool isolated = false;                // does it isolate the payload from the host at all
  std::string detail;                   // what works or what is missing, in words
  std::string fix;                      // the command or step that fixes it; "" when nothing to fix
  std::vector<std::string> enforced;    // policy limits this backend enforces here
  std::vector<std::string> unenforced;  // and those it cannot, so a caller is never misled
  // The policy's "network" modes it enforces ("none", "host", "allowlist"); a policy asking for
  // another is refused before it runs.
  std::vector<std::string> network;
  // Fields enforced here by a stand-in for the backend's usual means (or not at all), and how:
  // e.g. without a cgroup, "limits.pids" -> "RLIMIT_NPROC of the sandbox user ...".
  std::map<std::string, std::string> fallbacks;
  // What this host is, for this backend; for namespace: {"setup": "root-cgroup-v1" |
  // "root-cgroup-v2" | "user-delegated-cgroup-v2" | "user-no-cgroup" | ..., "cgroup": "v1" |
  // "v2" | "none", "cgroup_parents": [...], "runtime_uid": N}. Null when there is nothing to say.
  nlohmann::json host;

  nlohmann::json to_json() const;
};

// A sandbox a backend built before its request was known (Backend::build_ahead): the policy's
// isolation in place and waiting for one payload, nothing of any request in it. A Pool keeps a few
// and hands each to one run; it is used once and destroyed (which tears everything in it down).
class PreparedSandbox {
 public:
  virtual ~PreparedSandbox() = default;
  // Whether it still waits for its payload (it may have been killed from outside meanwhile).
  virtual bool waiting() const = 0;
  // Whether run() can give a policy with these limits what it asks for, with files written
  // through its read-write binds becoming `bind_owner`'s. The caller has checked that the policy
  // is the built one but for limits that are no looser (a looser limit is never served here).
  virtual bool can_serve(const Limits& limits, const HostIds& bind_owner) const = 0;
  // As Backend::run, once: `policy` is the built one or one that can_serve() accepted, and its
  // limits are applied before the payload starts. Throws Error for an invalid request.
  virtual Result run(const Request& request, const Policy& policy) = 0;
  // After run(): makes it ready for another run with nothing of the last one left that the next
  // could observe (docs/pools-and-server.md#recycled-sandboxes), on the thread that built it.
  // False when it cannot be, or cannot be shown to be: destroy it then. The default never can.
  virtual bool recycle() { return false; }
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string_view name() const = 0;
  virtual bool isolated() const = 0;
  virtual Health health() const = 0;
  // Why this backend cannot run here, or "" when it can. Selection asks it before every run, so it
  // must be cheap; health() may probe at length (the default calls it).
  virtual std::string unavailable_reason() const;
  // A failing payload is a Result; so is a sandbox that could not be set up at run time
  // (Status::sandbox_error). Throws Error only for a request that is invalid for the policy.
  virtual Result run(const Request& request, const Policy& policy) = 0;
  // A persistent REPL session in one sandbox (session.hpp). The default runs the Python worker as
  // a payload of run() on a thread of its own, with the control channel as an inherited fd; this
  // backend object must outlive the session. Throws Error when the session cannot start.
  virtual std::unique_ptr<Session> open_session(const Policy& policy, SessionOptions options);
  // Whether a payload can inherit fds (Request::inherit_fds); sessions on a backend that cannot
  // (docker) reach the worker through a socket in a bind-mounted directory instead.
  virtual bool can_inherit_fds() const { return true; }
  // Whether this backend builds sandboxes ahead of their requests (build_ahead); a Pool on one
  // that does not runs everything cold.
  virtual bool builds_ahead() const { return false; }
  // A sandbox of `policy` built now, waiting for its request; nullptr unless builds_ahead(). Throws
  // Error saying why it could not be built. Its first process may die with the calling thread
  // (PR_SET_PDEATHSIG): call it on a thread that outlives the sandbox.
  virtual std::unique_ptr<PreparedSandbox> build_ahead(const Policy& policy) const;
};

// The backend with this name, or nullptr when this build has none by that name.
std::unique_ptr<Backend> make_backend(std::string_view name);

// `requested` is "auto" or a backend name. "auto" walks policy.backend.prefer and takes the first
// available backend that meets the policy. Never falls back to an unisolated backend unless the
// policy sets backend.allow_unisolated. Throws BackendUnavailable naming what is missing and how to
// fix it, or Error for an unknown name.
std::unique_ptr<Backend> select_backend(const Policy& policy, std::string_view requested = "auto");

}  // namespace rlm
