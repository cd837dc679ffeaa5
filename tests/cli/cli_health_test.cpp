// `rlm-sandbox health` end to end.
#include <gtest/gtest.h>

#include "cli_test_util.hpp"

namespace rlm::test {
namespace {

using nlohmann::json;

TEST(CliHealth, JsonListsEveryBackendWithWhatItEnforces) {
  auto out = cli({"health", "--json"});
  ASSERT_EQ(out.exit_code, 0) << out.err;
  auto report = json::parse(out.out);
  ASSERT_EQ(report["backends"].size(), 3u);
  std::vector<std::string> names;
  for (const auto& backend : report["backends"]) {
    names.push_back(backend["backend"]);
    for (const char* key : {"available", "isolated", "detail", "fix", "enforced", "unenforced"})
      EXPECT_TRUE(backend.contains(key)) << key;
    if (backend["backend"] == "local") {
      EXPECT_EQ(backend["available"], true);
      EXPECT_EQ(backend["isolated"], false);
      auto enforced = backend["enforced"].dump();
      EXPECT_NE(enforced.find("limits.wall_time_ms"), std::string::npos) << enforced;
      auto unenforced = backend["unenforced"].dump();
      EXPECT_NE(unenforced.find("limits.pids"), std::string::npos) << unenforced;
      EXPECT_NE(unenforced.find("namespaces"), std::string::npos) << unenforced;
    }
  }
  EXPECT_EQ(names, (std::vector<std::string>{"namespace", "docker", "local"}));
}

TEST(CliHealth, PolicySelectionIsReported) {
  auto local = cli({"health", "--json", "--policy", "trusted-local"});
  EXPECT_EQ(local.exit_code, 0) << local.err;
  EXPECT_EQ(json::parse(local.out)["selection"]["backend"], "local");
}

TEST(CliHealth, TextFormIsReadable) {
  auto out = cli({"doctor"});
  EXPECT_EQ(out.exit_code, 0);
  EXPECT_NE(out.out.find("local: available (no isolation)"), std::string::npos) << out.out;
  EXPECT_NE(out.out.find("does not enforce"), std::string::npos) << out.out;
}

}  // namespace
}  // namespace rlm::test
