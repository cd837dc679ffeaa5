// Stale-group collection removes groups whose owner is gone (killing what is left in them) and
// touches nothing else: not live owners' groups, not other PID namespaces', not names it did
// not write, not anything below a directory that is not an "rlm-sandbox" parent.
#include <sys/stat.h>

#include "cgroup/files.hpp"
#include "cgroup/run_id.hpp"
#include "cgroup_test_util.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::test {
namespace {

constexpr std::uint64_t MiB = 1ull << 20;

std::string parent_of(const std::string& dir) {
  return dir.substr(0, dir.rfind('/'));
}

// Makes <parent>/<name> in every parent; returns the paths.
std::vector<std::string> make_in_all(const std::vector<std::string>& parents,
                                     const std::string& name) {
  std::vector<std::string> out;
  for (const auto& p : parents) {
    const std::string dir = p + "/" + name;
    EXPECT_EQ(::mkdir(dir.c_str(), 0755), 0) << dir << ": " << sys::errno_text(errno);
    out.push_back(dir);
  }
  return out;
}

TEST(CgroupStale, CollectsDeadOwnersOnly) {
  RLM_REQUIRE_ROOT();
  // Owned by this live process: must stay. With a CPU bandwidth, so that on v1 the cpu hierarchy's
  // parent is among those a collector must cover.
  RLM_MAKE_GROUP(live, limits(64 * MiB, 16, 1.0));
  std::vector<std::string> parents;
  for (const auto& d : dirs_of(*live)) parents.push_back(parent_of(d));

  const cgroup::RunId self = cgroup::next_run_id();
  // Dead owner, variant 1: our pid with another start time (the pid was recycled).
  cgroup::RunId recycled = self;
  recycled.start_time += 1;
  // Dead owner, variant 2: a pid that is gone.
  WaitingChild gone([] { return 0; });
  gone.release();
  gone.wait();
  cgroup::RunId dead = self;
  dead.pid = gone.pid();
  // Unknown: an owner in another PID namespace (we cannot tell whether it lives).
  cgroup::RunId foreign = dead;
  foreign.pid_ns += 1;

  auto stale1 = make_in_all(parents, recycled.to_string());
  auto stale2 = make_in_all(parents, dead.to_string());
  auto other_ns = make_in_all(parents, foreign.to_string());
  auto decoy = make_in_all(parents, "decoy-not-a-run-id");
  auto zero = make_in_all(parents, "0" + dead.to_string());  // not canonical: not ours
  std::vector<std::string> nested;  // a stale-looking name under a parent not named rlm-sandbox
  for (const auto& d : decoy) {
    nested.push_back(d + "/" + dead.to_string());
    EXPECT_EQ(::mkdir(nested.back().c_str(), 0755), 0) << nested.back();
  }

  // A process left running in a stale group (its runtime was SIGKILLed mid-run).
  WaitingChild orphan([] {
    for (;;) ::pause();
    return 0;
  });
  for (const auto& dir : stale1)
    ASSERT_EQ(cgroup::cgfs::write_file(dir + "/cgroup.procs", std::to_string(orphan.pid())), 0)
        << dir;

  cgroup::collect_stale_groups();

  for (const auto& dir : stale1) EXPECT_FALSE(dir_exists(dir)) << dir;
  for (const auto& dir : stale2) EXPECT_FALSE(dir_exists(dir)) << dir;
  const int status = orphan.wait();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  for (const auto& dir : dirs_of(*live)) EXPECT_TRUE(dir_exists(dir)) << dir;
  for (const auto* keep : {&other_ns, &decoy, &zero, &nested})
    for (const auto& dir : *keep) EXPECT_TRUE(dir_exists(dir)) << dir;

  // Clean up what this test made (children first).
  for (const auto* made : {&nested, &decoy, &zero, &other_ns})
    for (const auto& dir : *made) ::rmdir(dir.c_str());
  for (const auto* made : {&nested, &decoy, &zero, &other_ns})
    for (const auto& dir : *made) EXPECT_FALSE(dir_exists(dir)) << dir;
}

TEST(CgroupStale, ConcurrentCollectorsDoNotTrip) {
  RLM_REQUIRE_ROOT();
  RLM_MAKE_GROUP(live, limits(64 * MiB, 16));
  std::vector<std::string> parents;
  for (const auto& d : dirs_of(*live)) parents.push_back(parent_of(d));
  cgroup::RunId recycled = cgroup::next_run_id();
  recycled.start_time += 1;
  std::vector<std::vector<std::string>> stale;
  for (int i = 0; i < 20; ++i) {
    recycled.counter += 1000;
    stale.push_back(make_in_all(parents, recycled.to_string()));
  }
  std::vector<std::thread> threads;
  for (int t = 0; t < 4; ++t) threads.emplace_back([] { cgroup::collect_stale_groups(); });
  for (auto& th : threads) th.join();
  for (const auto& set : stale)
    for (const auto& dir : set) EXPECT_FALSE(dir_exists(dir)) << dir;
  for (const auto& dir : dirs_of(*live)) EXPECT_TRUE(dir_exists(dir)) << dir;
}

}  // namespace
}  // namespace rlm::test
