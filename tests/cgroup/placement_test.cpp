// Where groups go and what a user without a usable cgroup is told: clone3(CLONE_INTO_CGROUP) on
// v2, a delegated subtree used by a non-root user (the DelegateSubgroup= layout), the
// no-internal-processes rule explained, and non-root users on either version.
#include <grp.h>
#include <linux/sched.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/syscall.h>

#include <cstring>
#include <iostream>

#include "cgroup/files.hpp"
#include "cgroup_test_util.hpp"

namespace rlm::test {
namespace {

constexpr std::uint64_t MiB = 1ull << 20;
constexpr uid_t kNobody = 65534;

std::string parent_of(const std::string& dir) {
  return dir.substr(0, dir.rfind('/'));
}

#define RLM_REQUIRE_V2()                                                                 \
  if (!is_cgroup2_host())                                                                \
  GTEST_SKIP() << "this host mounts cgroup v1 at /sys/fs/cgroup; the cgroup v2 path is " \
                  "tested on a v2-only kernel by the VM lanes (tests/vm/lanes, ctest -L vm)"

// Runs `body` in a forked child and returns the text it wrote to the given fd. The child may
// allocate: these tests run single-threaded.
std::string in_child(const std::function<std::string()>& body) {
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return "pipe failed";
  pid_t pid = ::fork();
  if (pid == 0) {
    ::close(out[0]);
    std::string text = body();
    (void)!::write(out[1], text.data(), text.size());
    ::_exit(0);
  }
  ::close(out[1]);
  std::string text;
  char buf[4096];
  for (ssize_t n; (n = ::read(out[0], buf, sizeof buf)) > 0;) text.append(buf, n);
  ::close(out[0]);
  ::waitpid(pid, nullptr, 0);
  return text;
}

bool become_nobody() {
  return ::setgroups(0, nullptr) == 0 && ::setgid(kNobody) == 0 && ::setuid(kNobody) == 0;
}

std::string try_create() {
  auto [group, why] = cgroup::RunCgroup::create(limits(32 * MiB, 8));
  return group ? "OK " + dirs_of(*group)[0] : "FAIL " + why;
}

void give_to_nobody(const std::string& dir) {
  for (const char* f : {"", "/cgroup.procs", "/cgroup.subtree_control", "/cgroup.threads"}) {
    ASSERT_EQ(::chown((dir + f).c_str(), kNobody, kNobody), 0) << dir << f;
  }
}

TEST(CgroupPlacement, CloneIntoCgroupStartsTheChildInside) {
  RLM_REQUIRE_ROOT();
  RLM_REQUIRE_V2();
  RLM_MAKE_GROUP(group, limits(64 * MiB, 16));
  ASSERT_GE(group->clone_into_fd(), 0);
  int go[2];
  ASSERT_EQ(::pipe2(go, O_CLOEXEC), 0);
  clone_args args{};
  args.flags = CLONE_INTO_CGROUP;
  args.exit_signal = SIGCHLD;
  args.cgroup = static_cast<std::uint64_t>(group->clone_into_fd());
  long pid = ::syscall(SYS_clone3, &args, sizeof args);
  if (pid == 0) {
    ::close(go[1]);
    char c;
    (void)!::read(go[0], &c, 1);
    ::_exit(0);
  }
  ASSERT_GT(pid, 0) << "clone3: " << std::strerror(errno);
  ::close(go[0]);
  const auto members = cgroup::cgfs::members(dirs_of(*group)[0]);
  EXPECT_EQ(members, std::vector<pid_t>{static_cast<pid_t>(pid)});
  ::close(go[1]);
  ::waitpid(static_cast<pid_t>(pid), nullptr, 0);

  // With a new cgroup namespace too: which cgroup is the namespace's root? (For the backend: the
  // sandbox should see itself at "/".) Reported, not asserted: it is the kernel's choice.
  int out[2];
  ASSERT_EQ(::pipe2(out, O_CLOEXEC), 0);
  args.flags = CLONE_INTO_CGROUP | CLONE_NEWCGROUP;
  pid = ::syscall(SYS_clone3, &args, sizeof args);
  if (pid == 0) {
    ::close(out[0]);
    char buf[512];
    int fd = ::open("/proc/self/cgroup", O_RDONLY);
    ssize_t n = fd < 0 ? 0 : ::read(fd, buf, sizeof buf);
    (void)!::write(out[1], buf, n > 0 ? n : 0);
    ::_exit(0);
  }
  ASSERT_GT(pid, 0) << "clone3: " << std::strerror(errno);
  ::close(out[1]);
  char buf[512];
  ssize_t n = ::read(out[0], buf, sizeof buf);
  ::close(out[0]);
  ::waitpid(static_cast<pid_t>(pid), nullptr, 0);
  const std::string seen(buf, n > 0 ? n : 0);
  std::cout << "[ INFO     ] CLONE_INTO_CGROUP|CLONE_NEWCGROUP: the child sees " << seen;
  RecordProperty("cgroupns_view", seen);
}

TEST(CgroupPlacement, DelegatedSubtreeServesANonRootUser) {
  RLM_REQUIRE_ROOT();
  RLM_REQUIRE_V2();
  // Build, inside our own rlm-sandbox parent, what systemd makes for a unit with Delegate=yes and
  // DelegateSubgroup=leaf owned by a user: <unit> (controllers passed down, owned by the user)
  // holding only <unit>/leaf, where the user's process runs.
  RLM_MAKE_GROUP(anchor, limits(64 * MiB, 16));
  const std::string unit =
      parent_of(dirs_of(*anchor)[0]) + "/test-delegated-" + std::to_string(::getpid());
  const std::string leaf = unit + "/leaf";
  ASSERT_EQ(::mkdir(unit.c_str(), 0755), 0) << unit;
  ASSERT_EQ(cgroup::cgfs::write_file(unit + "/cgroup.subtree_control", "+memory +pids"), 0);
  ASSERT_EQ(::mkdir(leaf.c_str(), 0755), 0);
  give_to_nobody(unit);
  give_to_nobody(leaf);

  const std::string result = in_child([&] {
    if (cgroup::cgfs::write_file(leaf + "/cgroup.procs", "0") != 0)
      return std::string("move failed");
    if (!become_nobody()) return std::string("setuid failed");
    return try_create();
  });
  EXPECT_EQ(result, "OK " + unit + "/rlm-sandbox/" + result.substr(result.rfind('/') + 1))
      << "the group goes beside the leaf, in the delegated unit";
  EXPECT_FALSE(dir_exists(leaf + "/rlm-sandbox")) << "nothing is made inside the busy leaf";

  EXPECT_FALSE(dir_exists(unit + "/rlm-sandbox")) << "the last run removes the parent it made";
  for (const auto& dir : {leaf, unit}) {
    EXPECT_EQ(::rmdir(dir.c_str()), 0) << dir << ": " << std::strerror(errno);
  }
}

std::string own_cgroup_line() {
  auto text = cgroup::cgfs::read_file("/proc/self/cgroup").value_or("?");
  while (!text.empty() && text.back() == '\n') text.pop_back();
  return text;
}

TEST(CgroupPlacement, ABusyDelegatedCgroupIsSplitIntoALeaf) {
  RLM_REQUIRE_ROOT();
  RLM_REQUIRE_V2();
  // What `systemd-run --user --scope -p Delegate=yes` hands a user: a cgroup of their own that
  // holds their processes. The no-internal-processes rule forbids controllers below it until
  // its processes move into a leaf, which the runtime does itself.
  RLM_MAKE_GROUP(anchor, limits(64 * MiB, 16));
  const std::string scope =
      parent_of(dirs_of(*anchor)[0]) + "/test-scope-" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(scope.c_str(), 0755), 0) << scope;
  give_to_nobody(scope);
  // A second process of the user in the scope: it must move too, or the rule still applies.
  WaitingChild sibling(sleep_forever);
  ASSERT_EQ(cgroup::cgfs::write_file(scope + "/cgroup.procs", std::to_string(sibling.pid())), 0);

  const std::string result = in_child([&] {
    if (cgroup::cgfs::write_file(scope + "/cgroup.procs", "0") != 0)
      return std::string("move failed");
    if (!become_nobody()) return std::string("setuid failed");
    std::string created = try_create();  // before reading where we are now
    return created + "\n" + own_cgroup_line();
  });
  const std::string base = scope.substr(std::string("/sys/fs/cgroup").size());
  EXPECT_EQ(result.rfind("OK " + scope + "/rlm-sandbox/", 0), 0u) << result;
  EXPECT_NE(result.find("\n0::" + base + "/leaf"), std::string::npos)
      << "the runtime moved itself into the leaf: " << result;
  EXPECT_EQ(cgroup::cgfs::members(scope), std::vector<pid_t>{}) << "the scope holds no process now";
  EXPECT_EQ(cgroup::cgfs::members(scope + "/leaf"), std::vector<pid_t>{sibling.pid()});
  EXPECT_EQ(cgroup::cgfs::read_words(scope + "/cgroup.subtree_control"),
            (std::vector<std::string>{"memory", "pids"}));
  ::kill(sibling.pid(), SIGKILL);
  sibling.wait();
  EXPECT_FALSE(dir_exists(scope + "/rlm-sandbox"));
  for (const auto& dir : {scope + "/leaf", scope}) {
    EXPECT_EQ(::rmdir(dir.c_str()), 0) << dir << ": " << std::strerror(errno);
  }
}

TEST(CgroupPlacement, ABusyCgroupThatIsNotOursIsNotRearranged) {
  RLM_REQUIRE_ROOT();
  RLM_REQUIRE_V2();
  // Root in a busy cgroup no one delegated (a systemd service without Delegate=): its processes
  // stay where they are; the group goes elsewhere (the top, which passes controllers down).
  RLM_MAKE_GROUP(anchor, limits(64 * MiB, 16));
  const std::string service =
      parent_of(dirs_of(*anchor)[0]) + "/test-service-" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(service.c_str(), 0755), 0) << service;
  const std::string before =
      cgroup::cgfs::read_file(service + "/cgroup.subtree_control").value_or("?");

  const std::string result = in_child([&] {
    if (cgroup::cgfs::write_file(service + "/cgroup.procs", "0") != 0)
      return std::string("move failed");
    std::string created = try_create();  // before reading where we are now
    return created + "\n" + own_cgroup_line();
  });
  const std::string base = service.substr(std::string("/sys/fs/cgroup").size());
  EXPECT_EQ(result.rfind("OK /sys/fs/cgroup/rlm-sandbox/", 0), 0u) << result;
  EXPECT_NE(result.find("\n0::" + base), std::string::npos) << result;
  EXPECT_EQ(result.find("/leaf"), std::string::npos) << result;
  EXPECT_EQ(cgroup::cgfs::read_file(service + "/cgroup.subtree_control").value_or("?"), before);
  EXPECT_FALSE(dir_exists(service + "/leaf"));
  EXPECT_EQ(::rmdir(service.c_str()), 0) << service << ": " << std::strerror(errno);
}

TEST(CgroupPlacement, InsideAContainersCgroupNamespaceItsRootIsSplitIntoALeaf) {
  RLM_REQUIRE_ROOT();
  RLM_REQUIRE_V2();
  // A container with a private cgroup namespace and a writable cgroupfs (docker run
  // --cgroupns=private, given a writable /sys/fs/cgroup): its cgroup is the root of its view and
  // holds the container's processes, so the no-internal-processes rule applies to it.
  RLM_MAKE_GROUP(anchor, limits(64 * MiB, 16));
  const std::string container =
      parent_of(dirs_of(*anchor)[0]) + "/test-container-" + std::to_string(::getpid());
  ASSERT_EQ(::mkdir(container.c_str(), 0755), 0) << container;

  const std::string result = in_child([&] {
    if (cgroup::cgfs::write_file(container + "/cgroup.procs", "0") != 0)
      return std::string("move failed");
    if (::unshare(CLONE_NEWCGROUP | CLONE_NEWNS) != 0) return std::string("unshare failed");
    if (::mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0)
      return std::string("making / private failed");
    // The container's own cgroupfs: the inherited mount shows the host's root ("/.."), a fresh
    // one the namespace's root.
    if (::umount2("/sys/fs/cgroup", MNT_DETACH) != 0) return std::string("umount failed");
    if (::mount("cgroup2", "/sys/fs/cgroup", "cgroup2", 0, nullptr) != 0)
      return "mounting cgroup2 failed: " + std::string(std::strerror(errno));
    std::string created = try_create();  // before reading where we are now
    return created + "\n" + own_cgroup_line();
  });
  // In the container's view: the group under its root, the container's processes in /leaf.
  EXPECT_EQ(result.rfind("OK /sys/fs/cgroup/rlm-sandbox/", 0), 0u) << result;
  EXPECT_NE(result.find("\n0::/leaf"), std::string::npos) << result;
  // In the host's: the container's cgroup passes the controllers down and holds no process.
  EXPECT_EQ(cgroup::cgfs::read_words(container + "/cgroup.subtree_control"),
            (std::vector<std::string>{"memory", "pids"}));
  EXPECT_EQ(cgroup::cgfs::members(container), std::vector<pid_t>{});
  EXPECT_FALSE(dir_exists(container + "/rlm-sandbox")) << "the run removed what it made";
  for (const auto& dir : {container + "/leaf", container}) {
    EXPECT_EQ(::rmdir(dir.c_str()), 0) << dir << ": " << std::strerror(errno);
  }
}

TEST(CgroupPlacement, NonRootWithoutDelegationIsToldHowToFixIt) {
  RLM_REQUIRE_ROOT();  // to become another user; the check itself runs as nobody
  RLM_MAKE_GROUP(anchor, limits(64 * MiB, 16));  // the parents exist: only the group is denied
  const std::string result = in_child([] {
    if (!become_nobody()) return std::string("setuid failed");
    auto [group, why] = cgroup::RunCgroup::create(limits(32 * MiB, 8));
    if (group) return "OK " + group->describe();
    const auto support = cgroup::probe_cgroups();
    return "FAIL " + why + "\nprobe: " + std::to_string(static_cast<int>(support.mode)) + " " +
           support.fix;
  });
  ASSERT_EQ(result.rfind("FAIL ", 0), 0u) << result;
  EXPECT_NE(result.find("Permission denied"), std::string::npos) << result;
  EXPECT_NE(result.find("probe: 2 "), std::string::npos) << "mode none: " << result;
  if (is_cgroup2_host()) {
    EXPECT_NE(result.find("systemd-run --user"), std::string::npos) << result;
  } else {
    EXPECT_NE(result.find("run rlm-sandbox as root"), std::string::npos) << result;
  }
}

}  // namespace
}  // namespace rlm::test
