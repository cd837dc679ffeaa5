// Host-independent parsing: mountinfo (co-mounted and separate v1 controllers, escapes, cgroup2),
// /proc/self/cgroup, mount-relative paths, run ids.
#include <sys/wait.h>
#include <unistd.h>

#include <gtest/gtest.h>

#include "cgroup/host.hpp"
#include "cgroup/run_id.hpp"

namespace rlm::cgroup {
namespace {

TEST(CgroupParse, MountinfoSeparateAndCoMountedControllers) {
  const char* text =
      "31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755\n"
      "32 31 0:29 / /sys/fs/cgroup/cpu rw,relatime - cgroup cgroup rw,cpu\n"
      "33 31 0:30 / /sys/fs/cgroup/cpuacct rw,relatime - cgroup cgroup rw,cpuacct\n"
      "34 31 0:31 / /sys/fs/cgroup/cpu,cpuacct rw,nosuid shared:9 - cgroup cgroup rw,cpu,cpuacct\n"
      "35 31 0:32 /docker/abc /sys/fs/cgroup/memory rw master:3 - cgroup cgroup rw,memory\n"
      "40 31 0:37 / /sys/fs/cgroup/systemd rw - cgroup cgroup rw,xattr,name=systemd\n"
      "41 31 0:38 / /sys/fs/cgroup/my\\040unified rw,relatime - cgroup2 cgroup2 rw,nsdelegate\n";
  const auto mounts = cgroup_mounts(text);
  ASSERT_EQ(mounts.size(), 6u);
  EXPECT_EQ(mounts[0].mount_point, "/sys/fs/cgroup/cpu");
  EXPECT_EQ(mounts[0].controllers, (std::vector<std::string>{"cpu"}));
  EXPECT_EQ(mounts[2].mount_point, "/sys/fs/cgroup/cpu,cpuacct");
  EXPECT_EQ(mounts[2].controllers, (std::vector<std::string>{"cpu", "cpuacct"}));
  EXPECT_EQ(mounts[3].root, "/docker/abc");
  EXPECT_EQ(mounts[4].controllers, (std::vector<std::string>{"xattr", "name=systemd"}));
  EXPECT_TRUE(mounts[5].v2);
  EXPECT_EQ(mounts[5].mount_point, "/sys/fs/cgroup/my unified");
  EXPECT_TRUE(mounts[5].controllers.empty());
}

TEST(CgroupParse, ProcSelfCgroup) {
  const auto own = parse_proc_cgroup(
      "9:name=systemd:/\n4:memory:/process_api/c3685e\n2:cpu,cpuacct:/a:b\n0::/user.slice/"
      "x.scope\n");
  ASSERT_TRUE(own.unified.has_value());
  EXPECT_EQ(*own.unified, "/user.slice/x.scope");
  EXPECT_EQ(own.v1.at("memory"), "/process_api/c3685e");
  EXPECT_EQ(own.v1.at("cpu"), "/a:b");
  EXPECT_EQ(own.v1.at("cpuacct"), "/a:b");
  EXPECT_EQ(own.v1.at("name=systemd"), "/");
  EXPECT_FALSE(parse_proc_cgroup("4:memory:/x\n").unified.has_value());
}

TEST(CgroupParse, CgroupDirRelativeToTheMountRoot) {
  CgroupMount top{"/sys/fs/cgroup", "/", true, {}};
  EXPECT_EQ(cgroup_dir(top, "/"), "/sys/fs/cgroup");
  EXPECT_EQ(cgroup_dir(top, "/a/b.scope"), "/sys/fs/cgroup/a/b.scope");
  EXPECT_EQ(cgroup_dir(top, "/../elsewhere"), "") << "outside our cgroup namespace";
  CgroupMount sub{"/sys/fs/cgroup", "/docker/abc", true, {}};
  EXPECT_EQ(cgroup_dir(sub, "/docker/abc"), "/sys/fs/cgroup");
  EXPECT_EQ(cgroup_dir(sub, "/docker/abc/x"), "/sys/fs/cgroup/x");
  EXPECT_EQ(cgroup_dir(sub, "/docker/abcdef"), "");
  EXPECT_EQ(cgroup_dir(sub, "/other"), "");
}

TEST(CgroupParse, RunIdsRoundTripAndRejectForeignNames) {
  RunId id{1234, 5678, 4026531836, 7};
  EXPECT_EQ(id.to_string(), "1234-5678-4026531836-7");
  auto back = parse_run_id(id.to_string());
  ASSERT_TRUE(back.has_value());
  EXPECT_EQ(back->pid, 1234);
  EXPECT_EQ(back->start_time, 5678u);
  EXPECT_EQ(back->pid_ns, 4026531836u);
  EXPECT_EQ(back->counter, 7u);
  for (const char* bad : {"", "rlm-sandbox", "1234-5678-1-", "1234-5678-1", "1234-5678-1-7-9",
                          "01234-5678-1-7", "-1234-5678-1-7", "1234-+5678-1-7", "0-5678-1-7",
                          "1234-5678-1-7 ", "99999999999-1-1-1", "a-b-c-d", "1234-5678-1-7/x"}) {
    EXPECT_FALSE(parse_run_id(bad).has_value()) << '"' << bad << '"';
  }
}

TEST(CgroupParse, RunIdsAreUniqueAndOwnedByThisProcess) {
  const RunId a = next_run_id(), b = next_run_id();
  EXPECT_NE(a.to_string(), b.to_string());
  EXPECT_EQ(a.pid, ::getpid());
  EXPECT_EQ(a.start_time, process_start_time(::getpid()));
  EXPECT_EQ(owner_state(a), Owner::alive);
  RunId other = a;
  other.start_time += 1;
  EXPECT_EQ(owner_state(other), Owner::dead) << "a recycled pid is not the owner";
  other = a;
  other.pid_ns += 1;
  EXPECT_EQ(owner_state(other), Owner::unknown) << "another PID namespace is never judged";
}

TEST(CgroupParse, AForkedChildNamesItselfNotItsParent) {
  const RunId parent = next_run_id();  // primes any per-process cache
  pid_t pid = ::fork();
  if (pid == 0) {
    const RunId id = next_run_id();
    const bool ok = id.pid == ::getpid() && id.start_time == process_start_time(::getpid()) &&
                    owner_state(id) == Owner::alive;
    ::_exit(ok ? 0 : 1);
  }
  ASSERT_GT(pid, 0);
  int status = 0;
  ASSERT_EQ(::waitpid(pid, &status, 0), pid);
  EXPECT_TRUE(WIFEXITED(status) && WEXITSTATUS(status) == 0)
      << "the child's run ids must name the child (parent: " << parent.to_string() << ")";
}

}  // namespace
}  // namespace rlm::cgroup
