// A run may tighten its policy's limits, never loosen them.
#include "limit_flags.hpp"

#include <gmock/gmock.h>
#include <gtest/gtest.h>

#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm {
namespace {

using cli::LimitOverrides;
using cli::tighten;
using std::chrono::milliseconds;

LimitOverrides with_memory(std::uint64_t bytes) {
  LimitOverrides overrides;
  overrides.memory_bytes = bytes;
  return overrides;
}
LimitOverrides with_wall_time(milliseconds duration) {
  LimitOverrides overrides;
  overrides.wall_time = duration;
  return overrides;
}
LimitOverrides with_cpu_time(milliseconds duration) {
  LimitOverrides overrides;
  overrides.cpu_time = duration;
  return overrides;
}
LimitOverrides with_pids(std::uint32_t pids) {
  LimitOverrides overrides;
  overrides.pids = pids;
  return overrides;
}

TEST(Tighten, AppliesTighterAndEqualLimits) {
  Policy policy = load_policy("default");
  LimitOverrides overrides;
  overrides.wall_time = milliseconds(2'000);
  overrides.cpu_time = milliseconds(10'000);  // equal is allowed
  overrides.memory_bytes = 64u << 20;
  overrides.pids = 8;
  tighten(policy, overrides);
  EXPECT_EQ(policy.limits.wall_time, milliseconds(2'000));
  EXPECT_EQ(policy.limits.cpu_time, milliseconds(10'000));
  EXPECT_EQ(policy.limits.memory_bytes, 64u << 20);
  EXPECT_EQ(policy.limits.pids, 8u);
}

TEST(Tighten, NoOverridesChangesNothing) {
  Policy policy = load_policy("strict");
  const auto before = policy.to_json();
  tighten(policy, {});
  EXPECT_EQ(policy.to_json(), before);
}

TEST(Tighten, RejectsLooserLimitsNamingTheField) {
  const auto message_for = [](const LimitOverrides& overrides) {
    Policy policy = load_policy("default");
    const auto before = policy.to_json();
    try {
      tighten(policy, overrides);
    } catch (const Error& error) {
      EXPECT_EQ(policy.to_json(), before) << "a rejected call changes nothing";
      return std::string(error.what());
    }
    ADD_FAILURE() << "expected an Error";
    return std::string();
  };
  EXPECT_EQ(message_for(with_memory(1ull << 30)),
            "--memory 1G exceeds the policy's limits.memory_bytes (256M); a run may only tighten "
            "its policy");
  EXPECT_EQ(message_for(with_wall_time(milliseconds(20'000))),
            "--timeout 20s exceeds the policy's limits.wall_time_ms (10s); a run may only tighten "
            "its policy");
  EXPECT_EQ(message_for(with_cpu_time(milliseconds(10'001))),
            "--cpu-time 10.001s exceeds the policy's limits.cpu_time_ms (10s); a run may only "
            "tighten its policy");
  EXPECT_EQ(message_for(with_pids(65)),
            "--pids 65 exceeds the policy's limits.pids (64); a run may only tighten its policy");
  // One loose override rejects the whole call, even with tighter ones beside it.
  LimitOverrides mixed = with_pids(1000);
  mixed.wall_time = milliseconds(1);
  EXPECT_THAT(message_for(mixed), ::testing::HasSubstr("--pids 1000"));
}

// limits.cpus (issue 11 line 15): --cpus narrows the bandwidth; a policy without one takes any.
TEST(Tighten, CpusMayOnlyNarrowTheBandwidth) {
  LimitOverrides half;
  half.cpus = 0.5;
  Policy unlimited = load_policy("default");
  ASSERT_FALSE(unlimited.limits.cpus.has_value());
  tighten(unlimited, half);
  EXPECT_EQ(unlimited.limits.cpus, 0.5);

  Policy one = load_policy_text(R"({"limits": {"cpus": 1}})", "one.json");
  tighten(one, half);
  EXPECT_EQ(one.limits.cpus, 0.5);

  Policy quarter = load_policy_text(R"({"limits": {"cpus": 0.25}})", "quarter.json");
  const auto before = quarter.to_json();
  try {
    tighten(quarter, half);
    ADD_FAILURE() << "--cpus 0.5 loosened limits.cpus 0.25";
  } catch (const Error& error) {
    EXPECT_STREQ(error.what(),
                 "--cpus 0.5 exceeds the policy's limits.cpus (0.25); a run may only tighten its "
                 "policy");
  }
  EXPECT_EQ(quarter.to_json(), before);
  LimitOverrides tiny;
  tiny.cpus = 0.001;
  EXPECT_THROW(tighten(unlimited, tiny), Error);
  tiny.cpus = 0;
  EXPECT_THROW(tighten(unlimited, tiny), Error);
}

TEST(Tighten, RejectsZero) {
  Policy policy = load_policy("default");
  EXPECT_THROW(tighten(policy, with_memory(0)), Error);
  EXPECT_THROW(tighten(policy, with_wall_time(milliseconds(0))), Error);
  EXPECT_THROW(tighten(policy, with_pids(0)), Error);
}

}  // namespace
}  // namespace rlm
