// The namespace backend: health, and run() as a sandbox built (warm_sandbox.cpp) and launched at
// once. A Pool builds the same sandboxes ahead of time (build_warm_sandbox).
#include "namespace/namespace_backend.hpp"

#include <chrono>

#include "namespace/health.hpp"
#include "namespace/warm_sandbox.hpp"
#include "rlm_sandbox/error.hpp"
#include "supervisor/init.hpp"
#include "supervisor/run_start.hpp"

namespace rlm::ns {
namespace {

class NamespaceBackend final : public Backend {
 public:
  // Init is looked for once, when the backend is made: selection's availability check, health
  // and every run use what was found then.
  NamespaceBackend() : init_(supervisor::locate_init()) {}

  std::string_view name() const override { return "namespace"; }
  bool isolated() const override { return true; }
  Health health() const override { return namespace_health(init_); }
  std::string unavailable_reason() const override { return namespace_unavailable_reason(init_); }

  Result run(const Request& request, const Policy& policy) override {
    // An invalid request throws here, before anything starts.
    supervisor::RunStart run("namespace", request, policy);
    if (init_.path.empty())
      return run.setup_failed(init_.problem() + "; to fix: " + supervisor::InitLocation::fix());
    // The cold path is the warm one without the waits: build the sandbox now, then launch.
    return WarmSandbox::run_cold(request, policy, init_.path, run);
  }

  std::unique_ptr<WarmSandbox> build_warm(const Policy& policy) const {
    if (init_.path.empty())
      throw Error(init_.problem() + "; to fix: " + supervisor::InitLocation::fix());
    // Built ahead of any request: the policy's wall time bounds how long setting up may take.
    return WarmSandbox::build(policy, init_.path,
                              std::chrono::steady_clock::now() + policy.limits.wall_time);
  }

 private:
  const supervisor::InitLocation init_;
};

}  // namespace

std::unique_ptr<Backend> make_namespace_backend() {
  return std::make_unique<NamespaceBackend>();
}

bool has_warm_sandboxes(const Backend& backend) {
  return dynamic_cast<const NamespaceBackend*>(&backend) != nullptr;
}

std::unique_ptr<WarmSandbox> build_warm_sandbox(const Backend& backend, const Policy& policy) {
  const auto* ns = dynamic_cast<const NamespaceBackend*>(&backend);
  if (!ns)
    throw Error(std::string("the ") + std::string(backend.name()) +
                " backend has no warm sandboxes");
  return ns->build_warm(policy);
}

}  // namespace rlm::ns
