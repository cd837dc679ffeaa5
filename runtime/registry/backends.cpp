// The registry of backends and "auto" selection. Selection fails closed: a policy that demands
// isolation never lands on the unisolated local backend, and the error says what is missing.
#include <algorithm>

#include "docker/docker_backend.hpp"
#include "landlock_backend/landlock_backend.hpp"
#include "local/local_backend.hpp"
#include "namespace/namespace_backend.hpp"
#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"
#include "session/worker_session.hpp"

namespace rlm {
namespace {

bool is_known(std::string_view name) {
  const auto names = known_backend_names();
  return std::find(names.begin(), names.end(), name) != names.end();
}

std::string policy_label(const Policy& policy) {
  return policy.name.empty() ? std::string("this policy") : "policy '" + policy.name + "'";
}

// Why `backend` cannot run `policy`, or "" when it can.
std::string refusal(const Backend& backend, const Policy& policy) {
  if (!backend.isolated() && !policy.backend.allow_unisolated)
    return "the " + std::string(backend.name()) + " backend gives no isolation and " +
           policy_label(policy) +
           " requires it (backend.allow_unisolated is false); use an isolating backend, or a "
           "policy that allows unisolated runs such as --policy trusted-local";
  return backend.unavailable_reason();
}

}  // namespace

std::unique_ptr<Session> Backend::open_session(const Policy& policy, SessionOptions options) {
  return session::open_worker_session(*this, policy, std::move(options));
}

std::unique_ptr<PreparedSandbox> Backend::build_ahead(const Policy&) const {
  return nullptr;
}

std::string Backend::unavailable_reason() const {
  Health health = this->health();
  if (health.available) return "";
  return health.detail + (health.fix.empty() ? "" : "; to fix: " + health.fix);
}

nlohmann::json Health::to_json() const {
  return {{"backend", backend},
          {"available", available},
          {"isolated", isolated},
          {"detail", detail},
          {"fix", fix},
          {"enforced", enforced},
          {"unenforced", unenforced},
          {"network", network},
          {"fallbacks", fallbacks},
          {"host", host}};
}

std::unique_ptr<Backend> make_backend(std::string_view name) {
  if (name == "namespace") return ns::make_namespace_backend();
  if (name == "docker") return docker::make_docker_backend();
  if (name == "landlock") return landlock_backend::make_landlock_backend();
  if (name == "local") return local::make_local_backend();
  return nullptr;
}

std::unique_ptr<Backend> select_backend(const Policy& policy, std::string_view requested) {
  if (requested != "auto") {
    if (!is_known(requested))
      throw Error("unknown backend '" + std::string(requested) + "'; choose auto or one of " +
                  sys::join(known_backend_names(), ", "));
    auto backend = make_backend(requested);
    if (!backend)
      throw BackendUnavailable("the " + std::string(requested) +
                               " backend is not part of this build of rlm-sandbox yet");
    if (auto why = refusal(*backend, policy); !why.empty()) throw BackendUnavailable(why);
    return backend;
  }

  std::vector<std::string> reasons;
  for (const auto& name : policy.backend.prefer) {
    auto backend = make_backend(name);
    if (!backend) {
      reasons.push_back(name + ": not part of this build of rlm-sandbox yet");
      continue;
    }
    auto why = refusal(*backend, policy);
    if (why.empty()) return backend;
    reasons.push_back(name + ": " + why);
  }
  throw BackendUnavailable("no backend can run " + policy_label(policy) +
                           " here (backend.prefer: " + sys::join(policy.backend.prefer, ", ") +
                           ")\n  " + sys::join(reasons, "\n  "));
}

}  // namespace rlm
