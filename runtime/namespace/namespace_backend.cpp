// The namespace backend: health, and run() as a sandbox built (built_sandbox.cpp) and launched at
// once. A Pool has the same sandboxes built ahead of time (build_ahead).
#include "namespace/namespace_backend.hpp"

#include <chrono>

#include "namespace/built_sandbox.hpp"
#include "namespace/health.hpp"
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
    return BuiltSandbox::run_cold(request, policy, init_.path, run);
  }

  bool builds_ahead() const override { return true; }

  std::unique_ptr<PreparedSandbox> build_ahead(const Policy& policy) const override {
    if (init_.path.empty())
      throw Error(init_.problem() + "; to fix: " + supervisor::InitLocation::fix());
    // Built ahead of any request: the policy's wall time bounds how long setting up may take.
    return BuiltSandbox::build(policy, init_.path,
                               std::chrono::steady_clock::now() + policy.limits.wall_time);
  }

 private:
  const supervisor::InitLocation init_;
};

}  // namespace

std::unique_ptr<Backend> make_namespace_backend() {
  return std::make_unique<NamespaceBackend>();
}

}  // namespace rlm::ns
