// PrivilegePlan against the real kernel: what the payload holds after exec.
#include <gtest/gtest.h>
#include <linux/securebits.h>

#include <map>
#include <sstream>

#include "child_setup_harness.hpp"
#include "rlm_sandbox/error.hpp"

namespace rlm::ns::test {
namespace {

// "CapEff:\t0000000000000400" -> {"CapEff": "0000000000000400"}
std::map<std::string, std::string> status_fields(const std::string& text) {
  std::map<std::string, std::string> fields;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    const auto colon = line.find(':');
    if (colon == std::string::npos) continue;
    const auto value = line.find_first_not_of(" \t", colon + 1);
    fields[line.substr(0, colon)] = value == std::string::npos ? "" : line.substr(value);
  }
  return fields;
}

constexpr const char* kCapFields[] = {"CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb"};
constexpr int kLockedSecurebits = SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP |
                                  SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED |
                                  SECBIT_NO_CAP_AMBIENT_RAISE | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;

TEST(Privileges, NothingIsLeftAfterExecByDefault) {
  const auto run = run_script(test_policy(),
                              "grep -E '^(Cap|NoNewPrivs)' /proc/self/status; /probe securebits; "
                              "/probe bind 127.0.0.1 80");
  auto fields = status_fields(run.out);
  for (const char* field : kCapFields)
    EXPECT_EQ(fields.count(field) ? fields[field] : "missing", "0000000000000000") << field << "\n"
                                                                                   << run.out;
  EXPECT_EQ(fields.count("NoNewPrivs") ? fields["NoNewPrivs"] : "missing", "1") << run.out;
  EXPECT_NE(run.out.find("\n" + std::to_string(kLockedSecurebits) + "\n"), std::string::npos)
      << run.out;
  EXPECT_NE(run.out.find("errno 13 (bind"), std::string::npos) << run.out;  // EACCES
}

TEST(Privileges, WithoutThePlanTheSandboxUserKeepsCapabilities) {
  // Control for the test above: what the checker would hold if PrivilegePlan did nothing. The
  // bounding set is full and no_new_privs is off.
  const auto run = run_script(test_policy(), "grep -E '^(CapBnd|NoNewPrivs)' /proc/self/status",
                              {.privileges = false});
  auto fields = status_fields(run.out);
  EXPECT_NE(fields["CapBnd"], "0000000000000000") << run.out;
  EXPECT_EQ(fields["NoNewPrivs"], "0") << run.out;
}

TEST(Privileges, AKeptCapabilityIsExactlyWhatRemains) {
  Policy policy = test_policy();
  policy.capabilities = {"CAP_NET_BIND_SERVICE"};
  const PrivilegePlan plan = PrivilegePlan::prepare(policy);
  EXPECT_EQ(plan.kept(), 1u << 10);
  const auto run =
      run_script(policy, "grep -E '^(Cap|NoNewPrivs)' /proc/self/status; /probe bind 127.0.0.1 80");
  EXPECT_EQ(run.exit_code, 0) << run.out << run.err;
  auto fields = status_fields(run.out);
  for (const char* field : kCapFields)
    EXPECT_EQ(fields.count(field) ? fields[field] : "missing", "0000000000000400") << field << "\n"
                                                                                   << run.out;
  EXPECT_EQ(fields["NoNewPrivs"], "1");
  EXPECT_NE(run.out.find("ok\n"), std::string::npos) << run.out;
}

TEST(Privileges, UnknownCapabilityIsAnErrorWithItsJsonPath) {
  Policy policy;
  policy.capabilities = {"CAP_CHOWN", "CAP_NOT_A_THING"};
  try {
    PrivilegePlan::prepare(policy);
    FAIL() << "prepare() accepted an unknown capability";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("capabilities[1]"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace rlm::ns::test
