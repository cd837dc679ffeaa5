// The last docker test (a ctest fixture cleanup after all of them): no container labelled
// rlm-sandbox=1 remains on the daemon, whichever test process made it.
#include "docker_test_util.hpp"

namespace rlm::test {
namespace {

TEST(DockerCleanup, NoLabelledContainerIsLeftAfterTheSuite) {
  REQUIRE_DOCKER();
  const auto left = labelled_containers();
  EXPECT_TRUE(left.empty()) << left.size() << " container(s) labelled rlm-sandbox=1 remain, e.g. "
                            << left.front();
  // Leave the daemon clean for the next run either way.
  for (const auto& id : left) test_api().call("DELETE", "/containers/" + id + "?force=1");
}

}  // namespace
}  // namespace rlm::test
