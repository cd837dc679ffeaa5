// Creating, attaching, killing and removing groups: nothing is left behind, also with members
// still running, after many cycles, and from many threads at once.
#include <dirent.h>

#include <atomic>
#include <set>
#include <thread>

#include "cgroup/files.hpp"
#include "cgroup/run_id.hpp"
#include "cgroup_test_util.hpp"
#include "rlm_sandbox/error.hpp"

namespace rlm::test {
namespace {

constexpr std::uint64_t MiB = 1ull << 20;

// Entries under the groups' parents that this process created (names start "<pid>-<start>-").
std::vector<std::string> own_leftovers(const std::vector<std::string>& parents) {
  const std::string prefix = std::to_string(::getpid()) + "-" +
                             std::to_string(cgroup::process_start_time(::getpid()).value_or(0)) +
                             "-";
  std::vector<std::string> out;
  for (const auto& parent : parents) {
    DIR* d = ::opendir(parent.c_str());
    if (d == nullptr) continue;
    while (dirent* e = ::readdir(d)) {
      if (std::string(e->d_name).rfind(prefix, 0) == 0) out.push_back(parent + "/" + e->d_name);
    }
    ::closedir(d);
  }
  return out;
}

std::vector<std::string> parents_of(const std::vector<std::string>& dirs) {
  std::vector<std::string> out;
  for (const auto& d : dirs) out.push_back(d.substr(0, d.rfind('/')));
  return out;
}

TEST(CgroupLifecycle, ProbeMatchesTheHost) {
  RLM_REQUIRE_CGROUP_ACCESS();
  const auto support = cgroup::probe_cgroups();
  const auto expected =
      is_cgroup2_host() ? cgroup::CgroupSupport::Mode::v2 : cgroup::CgroupSupport::Mode::v1;
  EXPECT_EQ(support.mode, expected) << support.detail << " / fix: " << support.fix;
  EXPECT_FALSE(support.detail.empty());
  // Every lane's cgroups count CPU time and give CPU bandwidth (v1: cpuacct and cpu hierarchies;
  // v2: cpu.stat, and the cpu controller passed down).
  EXPECT_EQ(support.enforced, (std::vector<std::string>{"limits.memory_bytes", "limits.pids",
                                                        "limits.cpu_time_ms", "limits.cpus"}))
      << support.detail;
  EXPECT_TRUE(support.missing.empty());
  EXPECT_TRUE(support.fix.empty()) << support.fix;
  EXPECT_NE(support.detail.find("rlm-sandbox"), std::string::npos) << support.detail;
}

TEST(CgroupLifecycle, GroupsAreNamedAndLimited) {
  RLM_REQUIRE_CGROUP_ACCESS();
  RLM_MAKE_GROUP(group, limits(64 * MiB, 16));
  const auto& dirs = dirs_of(*group);
  ASSERT_FALSE(dirs.empty());
  for (const auto& dir : dirs) {
    EXPECT_TRUE(dir_exists(dir)) << dir;
    const auto parent = dir.substr(0, dir.rfind('/'));
    EXPECT_EQ(parent.substr(parent.rfind('/') + 1), "rlm-sandbox") << dir;
    const auto id = cgroup::parse_run_id(dir.substr(dir.rfind('/') + 1));
    ASSERT_TRUE(id.has_value()) << dir;
    EXPECT_EQ(id->pid, ::getpid());
    EXPECT_EQ(cgroup::owner_state(*id), cgroup::Owner::alive);
  }
  if (is_cgroup2_host()) {
    ASSERT_EQ(dirs.size(), 1u);
    EXPECT_EQ(cgroup::cgfs::read_number(dirs[0] + "/memory.max"), 64 * MiB);
    EXPECT_EQ(cgroup::cgfs::read_number(dirs[0] + "/pids.max"), 16u);
    if (dir_exists(dirs[0] + "/memory.swap.max")) {
      EXPECT_EQ(cgroup::cgfs::read_number(dirs[0] + "/memory.swap.max"), 0u);
    }
    EXPECT_GE(group->clone_into_fd(), 0);
  } else {
    EXPECT_GE(dirs.size(), 2u) << "memory and pids hierarchies";
    EXPECT_EQ(group->clone_into_fd(), -1);
    bool memory = false, pids = false;
    for (const auto& dir : dirs) {
      if (auto v = cgroup::cgfs::read_number(dir + "/memory.limit_in_bytes")) {
        memory = true;
        EXPECT_EQ(*v, 64 * MiB);
        if (dir_exists(dir + "/memory.memsw.limit_in_bytes")) {
          EXPECT_EQ(cgroup::cgfs::read_number(dir + "/memory.memsw.limit_in_bytes"), 64 * MiB);
        }
      }
      if (auto v = cgroup::cgfs::read_number(dir + "/pids.max")) {
        pids = true;
        EXPECT_EQ(*v, 16u);
      }
    }
    EXPECT_TRUE(memory && pids) << group->describe();
  }
  EXPECT_NE(group->describe().find(dirs[0]), std::string::npos) << group->describe();
}

TEST(CgroupLifecycle, DestructorKillsMembersAndRemovesTheGroups) {
  RLM_REQUIRE_CGROUP_ACCESS();
  RLM_MAKE_GROUP(group, limits(64 * MiB, 16));
  const auto dirs = dirs_of(*group);
  WaitingChild child([] {
    // A few sleeping grandchildren too, and the child itself ignores nothing it could.
    for (int i = 0; i < 3; ++i)
      if (::fork() == 0) sleep_forever();
    return sleep_forever();
  });
  group->attach(child.pid());
  child.release();
  // Wait until the grandchildren are in.
  for (int i = 0; i < 1000 && cgroup::cgfs::members(dirs[0]).size() < 4; ++i) ::usleep(1000);
  ASSERT_EQ(cgroup::cgfs::members(dirs[0]).size(), 4u);
  group.reset();
  for (const auto& dir : dirs) EXPECT_FALSE(dir_exists(dir)) << dir;
  const int status = child.wait();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
}

TEST(CgroupLifecycle, AChildJoinsItsV1GroupsItself) {
  RLM_REQUIRE_CGROUP_ACCESS();
  RLM_MAKE_GROUP(group, limits(64 * MiB, 16));
  const auto fds = group->self_join_fds();
  if (is_cgroup2_host()) {
    // v2 has clone3(CLONE_INTO_CGROUP) instead.
    EXPECT_TRUE(fds.empty());
    EXPECT_GE(group->clone_into_fd(), 0);
    return;
  }
  // One fd per hierarchy, as the namespace backend's child uses them: "0" to each `tasks`.
  ASSERT_EQ(fds.size(), dirs_of(*group).size());
  EXPECT_EQ(group->self_join_fds(), fds) << "opened once";
  WaitingChild child([fds] {
    for (int fd : fds)
      if (::write(fd, "0", 1) != 1) return 3;
    return sleep_forever();
  });
  child.release();
  for (const auto& dir : dirs_of(*group)) {
    std::vector<pid_t> members;
    for (int i = 0; i < 1000 && members.empty(); ++i, ::usleep(1000))
      members = cgroup::cgfs::members(dir);
    EXPECT_EQ(members, std::vector<pid_t>{child.pid()}) << dir;
  }
}

TEST(CgroupLifecycle, KillAllEmptiesTheGroupAndKeepsIt) {
  RLM_REQUIRE_CGROUP_ACCESS();
  RLM_MAKE_GROUP(group, limits(64 * MiB, 64));
  const auto dirs = dirs_of(*group);
  WaitingChild child([] {
    // A fork flood that keeps trying: kill_all must still converge.
    for (;;)
      if (::fork() < 0) ::usleep(100);
    return 0;
  });
  group->attach(child.pid());
  child.release();
  // Let the flood reach the limit (slow under emulation), then stop it.
  for (int i = 0; i < 2000 && !group->usage().pids_limit_hit; ++i) ::usleep(5000);
  ASSERT_TRUE(group->usage().pids_limit_hit);
  group->kill_all();
  for (const auto& dir : dirs) {
    EXPECT_TRUE(dir_exists(dir)) << "kill_all keeps the group for usage()";
    EXPECT_TRUE(cgroup::cgfs::members(dir).empty()) << dir;
  }
  const int status = child.wait();
  EXPECT_TRUE(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL) << status;
}

TEST(CgroupLifecycle, AttachingAMissingProcessThrows) {
  RLM_REQUIRE_CGROUP_ACCESS();
  RLM_MAKE_GROUP(group, limits(64 * MiB, 16));
  WaitingChild gone([] { return 0; });
  gone.release();
  gone.wait();  // reaped: the pid names nothing now
  EXPECT_THROW(group->attach(gone.pid()), Error);
}

TEST(CgroupLifecycle, HundredCyclesLeaveNothingBehind) {
  RLM_REQUIRE_CGROUP_ACCESS();
  std::vector<std::string> parents;
  for (int i = 0; i < 100; ++i) {
    RLM_MAKE_GROUP(group, limits(32 * MiB, 8));
    if (parents.empty()) parents = parents_of(dirs_of(*group));
    if (i % 10 == 0) {  // some with a live member
      WaitingChild child(sleep_forever);
      group->attach(child.pid());
      group.reset();
      child.wait();
    }
  }
  EXPECT_EQ(own_leftovers(parents), std::vector<std::string>{});
}

TEST(CgroupLifecycle, ConcurrentCreateAndDestroyFromEightThreads) {
  RLM_REQUIRE_CGROUP_ACCESS();
  std::atomic<int> failures{0};
  std::mutex mu;
  std::set<std::string> seen;
  std::vector<std::string> parents;
  std::string first_failure;
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t) {
    threads.emplace_back([&, t] {
      for (int i = 0; i < 15; ++i) {
        auto [group, why] = cgroup::RunCgroup::create(limits(32 * MiB, 8));
        if (!group) {
          ++failures;
          std::lock_guard lock(mu);
          if (first_failure.empty()) first_failure = why;
          continue;
        }
        {
          std::lock_guard lock(mu);
          for (const auto& d : dirs_of(*group))
            if (!seen.insert(d).second) ++failures;  // two runs shared a directory
          if (parents.empty()) parents = parents_of(dirs_of(*group));
        }
        if ((i + t) % 3 == 0) {
          WaitingChild child(sleep_forever);
          group->attach(child.pid());
          group.reset();
          child.wait();
        }
      }
    });
  }
  for (auto& th : threads) th.join();
  EXPECT_EQ(failures.load(), 0) << first_failure;
  EXPECT_EQ(seen.size(), 8u * 15u * (is_cgroup2_host() ? 1 : parents.size()));
  EXPECT_EQ(own_leftovers(parents), std::vector<std::string>{});
}

}  // namespace
}  // namespace rlm::test
