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

  // Whatever this test makes goes again however it ends (an assertion returns early), deepest
  // first, so that a failed run leaves nothing for the next to trip on.
  std::vector<std::string> made;
  struct RemoveMade {
    std::vector<std::string>& dirs;
    ~RemoveMade() {
      for (auto it = dirs.rbegin(); it != dirs.rend(); ++it) ::rmdir(it->c_str());
    }
  } remove_made{made};
  auto make = [&](const std::vector<std::string>& in, const std::string& name) {
    auto dirs = make_in_all(in, name);
    made.insert(made.end(), dirs.begin(), dirs.end());
    return dirs;
  };

  auto stale1 = make(parents, recycled.to_string());
  auto stale2 = make(parents, dead.to_string());
  auto other_ns = make(parents, foreign.to_string());
  auto decoy = make(parents, "decoy-not-a-run-id-" + std::to_string(::getpid()));
  auto zero = make(parents, "0" + dead.to_string());  // not canonical: not ours
  std::vector<std::string> nested;  // a stale-looking name under a parent not named rlm-sandbox
  for (const auto& d : decoy) {
    nested.push_back(d + "/" + dead.to_string());
    EXPECT_EQ(::mkdir(nested.back().c_str(), 0755), 0) << nested.back();
    made.push_back(nested.back());
  }

  // A process left running in a stale group (its runtime was SIGKILLed mid-run). The group is made
  // while its owner still lives, so that no collector running beside this test (any sandbox on
  // the machine collects) can take it before the orphan is inside; then the owner dies.
  WaitingChild owner([] {
    for (;;) ::pause();
    return 0;
  });
  owner.release();
  const auto owner_start = cgroup::process_start_time(owner.pid());
  ASSERT_TRUE(owner_start.has_value());
  cgroup::RunId owned = self;
  owned.pid = owner.pid();
  owned.start_time = *owner_start;
  auto stale3 = make(parents, owned.to_string());
  WaitingChild orphan([] {
    for (;;) ::pause();
    return 0;
  });
  for (const auto& dir : stale3)
    ASSERT_EQ(cgroup::cgfs::write_file(dir + "/cgroup.procs", std::to_string(orphan.pid())), 0)
        << dir;
  ::kill(owner.pid(), SIGKILL);
  owner.wait();  // reaped: its pid no longer names a live process with that start time

  cgroup::collect_stale_groups();

  // Another collector may have taken these first; either way they are gone.
  for (const auto& dir : stale1) EXPECT_FALSE(dir_exists(dir)) << dir;
  for (const auto& dir : stale2) EXPECT_FALSE(dir_exists(dir)) << dir;
  for (const auto& dir : stale3) EXPECT_FALSE(dir_exists(dir)) << dir;
  const int status = orphan.wait();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
  for (const auto& dir : dirs_of(*live)) EXPECT_TRUE(dir_exists(dir)) << dir;
  for (const auto* keep : {&other_ns, &decoy, &zero, &nested})
    for (const auto& dir : *keep) EXPECT_TRUE(dir_exists(dir)) << dir;
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
