// A policy file from a repository, and the flags of one run, cannot make the CLI read host files
// for them or bind the kernel's interfaces into a sandbox without saying so.
#include <sys/stat.h>

#include <gtest/gtest.h>

#include <filesystem>
#include <random>

#include "cli_test_util.hpp"

namespace rlm::test {
namespace {

namespace fs = std::filesystem;

std::string random_token() {
  std::random_device device;
  std::mt19937_64 generator(device());
  return "tok" + std::to_string(generator()) + std::to_string(generator());
}

TEST(CliUntrustedPolicy, ShowAndCheckNeverRevealAFileOutsideThePolicyDirectory) {
  TempDir root;
  const std::string token = random_token();
  fs::create_directories(root.file("repo"));
  fs::create_directories(root.file("private"));
  root.write("private/secret.json", R"({"hostname": ")" + token + R"("})");
  ::chmod(root.file("private/secret.json").c_str(), 0600);
  root.write("private/shadow", "root:" + token + ":19000:0:99999:7:::\n");
  root.write("repo/absolute.json", R"({"extends": ")" + root.file("private/secret.json") + R"("})");
  root.write("repo/dotdot.json", R"({"extends": "../private/secret.json"})");
  fs::create_symlink(root.file("private/secret.json"), root.file("repo/link.json"));
  root.write("repo/symlink.json", R"({"extends": "link.json"})");
  for (const char* policy : {"absolute.json", "dotdot.json", "symlink.json"}) {
    for (const char* subcommand : {"show", "check"}) {
      auto out = cli({"policy", subcommand, root.file(std::string("repo/") + policy)});
      EXPECT_NE(out.exit_code, 0) << subcommand << " " << policy << "\n" << out.out;
      EXPECT_EQ(out.out.find(token), std::string::npos) << subcommand << " " << policy;
      EXPECT_EQ(out.err.find(token), std::string::npos) << subcommand << " " << policy;
      EXPECT_NE(out.err.find("outside the policy's directory"), std::string::npos) << out.err;
    }
  }
  // A file that is not JSON at all, named on the command line: its bytes are never quoted.
  auto out = cli({"policy", "show", root.file("private/shadow")});
  EXPECT_NE(out.exit_code, 0);
  EXPECT_TRUE(one_line(out.err)) << out.err;
  EXPECT_NE(out.err.find("malformed JSON at line 1"), std::string::npos) << out.err;
  EXPECT_EQ(out.err.find(token), std::string::npos) << out.err;
}

TEST(CliUntrustedPolicy, BindOfAKernelInterfaceNeedsThePolicyField) {
  TempDir dir;
  fs::create_symlink("/proc/self", dir.file("proc-link"));
  for (const std::string flag : {"--bind", "--bind-ro"}) {
    for (const std::string& value :
         std::vector<std::string>{"/proc/self:/x", "/sys/kernel:/x", "/dev/kmsg:/x", "/dev",
                                  dir.file("proc-link") + ":/x"}) {
      auto out = cli({"run", "--policy", "default", flag, value, "--", "true"});
      EXPECT_EQ(out.exit_code, 125) << flag << " " << value << "\n" << out.err;
      EXPECT_TRUE(one_line(out.err)) << out.err;
      EXPECT_NE(out.err.find(flag + " " + value), std::string::npos) << out.err;
      EXPECT_NE(out.err.find("filesystem.allow_kernel_interface_binds"), std::string::npos)
          << out.err;
    }
  }
  // With the field, the same bind runs.
  dir.write("kernel.json",
            R"({"extends": "default", "filesystem": {"allow_kernel_interface_binds": true}})");
  auto out = cli({"run", "--policy", dir.file("kernel.json"), "--bind-ro",
                  "/proc/sys/kernel:/mnt/kernel", "--", "cat", "/mnt/kernel/ostype"});
  EXPECT_EQ(out.exit_code, 0) << out.err;
  EXPECT_EQ(out.out, "Linux\n") << out.err;
  // policy show prints the field.
  auto shown = cli({"policy", "show", dir.file("kernel.json")});
  ASSERT_EQ(shown.exit_code, 0) << shown.err;
  EXPECT_EQ(nlohmann::json::parse(shown.out)["filesystem"]["allow_kernel_interface_binds"], true);
}

}  // namespace
}  // namespace rlm::test
