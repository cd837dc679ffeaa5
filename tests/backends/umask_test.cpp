// The payload's file-creation mask is the sandbox's (022), never the host process's: an embedding
// program may run with any umask, and a thread of it may change the mask for a moment while
// another builds a sandbox. The namespace backend's root filesystem gets the modes its plan names
// whatever the mask at the clone.
#include <gtest/gtest.h>
#include <sys/stat.h>

#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm::test {
namespace {

// The test process's umask for the lifetime of the object.
class HostUmask {
 public:
  explicit HostUmask(mode_t mask) : previous_(::umask(mask)) {}
  ~HostUmask() { ::umask(previous_); }
  HostUmask(const HostUmask&) = delete;
  HostUmask& operator=(const HostUmask&) = delete;

 private:
  mode_t previous_;
};

// Each backend with the shipped policy that selects it.
std::string policy_for(const std::string& backend) {
  if (backend == "local") return "trusted-local";
  if (backend == "landlock") return "landlock";
  return "default";
}

class PayloadUmask : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    backend_ = make_backend(GetParam());
    ASSERT_NE(backend_, nullptr) << GetParam() << " is not part of this build";
    const Health health = backend_->health();
    // Landlock is the one a kernel may lack (before 5.13, or left out of lsm=); the others run as
    // root here.
    if (!health.available && GetParam() == "landlock")
      GTEST_SKIP() << "the landlock backend is unavailable here: " << health.detail;
    ASSERT_TRUE(health.available) << health.detail;
    policy_ = load_policy(policy_for(GetParam()));
  }

  Result run(const std::string& script) {
    Request request;
    request.argv = {"/bin/sh", "-c", script};
    return backend_->run(request, policy_);
  }

  std::unique_ptr<Backend> backend_;
  Policy policy_;
};

TEST_P(PayloadUmask, IsTheSandboxsWhateverTheHostProcesssIs) {
  for (const mode_t host_mask : {0777u, 077u, 0u}) {
    const HostUmask mask(host_mask);
    const auto result = run("umask");
    ASSERT_EQ(result.status, Status::ok) << result.to_json().dump();
    EXPECT_EQ(result.stdout_data, "0022\n") << "host umask " << std::oct << host_mask;
  }
}

TEST(NamespaceRootFilesystemModes, AreThePlansWhateverTheHostProcesssUmask) {
  auto backend = make_backend("namespace");
  ASSERT_NE(backend, nullptr);
  ASSERT_TRUE(backend->health().available) << backend->health().detail;
  const Policy policy = load_policy("default");
  const HostUmask mask(0777);
  Request request;
  request.argv = {"/bin/sh", "-c",
                  "stat -c %a / /etc /dev /tmp; cd /tmp && mkdir d && echo x > f && "
                  "stat -c %a d f && cat f"};
  const auto result = backend->run(request, policy);
  ASSERT_EQ(result.status, Status::ok) << result.to_json().dump();
  EXPECT_EQ(result.stdout_data, "755\n755\n755\n1777\n755\n644\nx\n");
}

INSTANTIATE_TEST_SUITE_P(Backends, PayloadUmask,
                         ::testing::Values("namespace", "local", "landlock"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace rlm::test
