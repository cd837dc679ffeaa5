// process::start_child in new namespaces: clone3 into the namespaces (and straight into a cgroup v2
// group with CLONE_INTO_CGROUP), and the clone(2) fallback a kernel or an outer seccomp profile
// without clone3 forces (glibc's own fallback answer is ENOSYS, so is ours).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/filter.h>
#include <linux/seccomp.h>
#include <sched.h>
#include <signal.h>
#include <stddef.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>

#include "process/child_start.hpp"

namespace rlm {
namespace {

constexpr std::uint64_t kNamespaces = CLONE_NEWUSER | CLONE_NEWPID | CLONE_NEWNS;

// In the child: 0 when it is PID 1 of a new PID namespace.
[[noreturn]] void child_reports_its_pid() {
  _exit(getpid() == 1 ? 0 : 1);
}

// Clones with `kNamespaces`, waits through the pidfd, returns the child's exit code (or -errno).
int clone_and_wait() {
  const auto child = process::start_child({kNamespaces, -1}, child_reports_its_pid);
  if (child.pid < 0) return -child.error;
  if (child.pidfd < 0) return -1000;  // both paths must give a pidfd on this kernel
  siginfo_t info{};
  const int waited = waitid(P_PIDFD, static_cast<id_t>(child.pidfd), &info, WEXITED);
  close(child.pidfd);
  if (waited != 0) return -2000;
  return info.si_code == CLD_EXITED ? info.si_status : -3000;
}

// Where a cgroup2 file system is mounted here ("" when none): /sys/fs/cgroup on a v2-only host,
// /sys/fs/cgroup/unified on a hybrid one.
std::string cgroup2_mount() {
  std::ifstream mountinfo("/proc/self/mountinfo");
  for (std::string line; std::getline(mountinfo, line);) {
    const auto dash = line.find(" - ");
    if (dash == std::string::npos || line.compare(dash + 3, 8, "cgroup2 ") != 0) continue;
    std::istringstream fields(line);
    std::string id, parent, device, root, mount_point;
    fields >> id >> parent >> device >> root >> mount_point;
    return mount_point;
  }
  return "";
}

// The calling process's cgroup v2 path as /proc/self/cgroup gives it ("0::/path"), or "".
std::string own_cgroup2_path() {
  std::ifstream cgroups("/proc/self/cgroup");
  for (std::string line; std::getline(cgroups, line);)
    if (line.rfind("0::", 0) == 0) return line.substr(3);
  return "";
}

// The same check in a raw clone's child, which must not allocate: whether /proc/self/cgroup has
// the line "0::<expected>".
bool in_cgroup2(const char* expected) {
  char buf[4096];
  const int fd = open("/proc/self/cgroup", O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  const ssize_t n = read(fd, buf, sizeof buf - 1);
  close(fd);
  if (n <= 0) return false;
  buf[n] = 0;
  for (char* line = buf; line && *line;) {
    char* end = strchr(line, '\n');
    if (end) *end = 0;
    if (strncmp(line, "0::", 3) == 0) return strcmp(line + 3, expected) == 0;
    line = end ? end + 1 : nullptr;
  }
  return false;
}

// A group of our own under an rlm-sandbox parent of the cgroup2 mount, removed when done (the
// parent too when this made it and nothing else is in it).
class V2Group {
 public:
  explicit V2Group(const std::string& mount) {
    parent_ = mount + "/rlm-sandbox";
    made_parent_ = mkdir(parent_.c_str(), 0755) == 0;
    relative_ = "/rlm-sandbox/clone-test-" + std::to_string(getpid());
    dir_ = mount + relative_;
    if (mkdir(dir_.c_str(), 0755) != 0) dir_.clear();
  }
  ~V2Group() {
    if (!dir_.empty()) rmdir(dir_.c_str());
    if (made_parent_) rmdir(parent_.c_str());
  }
  const std::string& dir() const { return dir_; }
  const std::string& relative() const { return relative_; }

 private:
  std::string parent_, dir_, relative_;
  bool made_parent_ = false;
};

// The group's cgroup.procs, as text.
std::string members(const std::string& dir) {
  std::ifstream procs(dir + "/cgroup.procs");
  std::stringstream text;
  text << procs.rdbuf();
  return text.str();
}

TEST(CloneProcess, StartsTheChildInNewNamespacesWithAPidfd) {
  EXPECT_EQ(clone_and_wait(), 0);
}

TEST(CloneProcess, FallsBackToCloneWhenClone3IsMissing) {
  // In a throw-away child: a filter answering clone3 with ENOSYS, as an old kernel would.
  const pid_t tester = fork();
  ASSERT_GE(tester, 0);
  if (tester == 0) {
    sock_filter program[] = {
        BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offsetof(seccomp_data, nr)),
        BPF_JUMP(BPF_JMP | BPF_JEQ | BPF_K, SYS_clone3, 0, 1),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ERRNO | ENOSYS),
        BPF_STMT(BPF_RET | BPF_K, SECCOMP_RET_ALLOW),
    };
    sock_fprog filter{static_cast<unsigned short>(std::size(program)), program};
    if (prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0 ||
        syscall(SYS_seccomp, SECCOMP_SET_MODE_FILTER, 0, &filter) != 0)
      _exit(90);
    if (syscall(SYS_clone3, nullptr, 0) >= 0 || errno != ENOSYS) _exit(91);
    const int code = clone_and_wait();
    _exit(code == 0 ? 0 : 92);
  }
  int status = 0;
  ASSERT_EQ(waitpid(tester, &status, 0), tester);
  ASSERT_TRUE(WIFEXITED(status));
  EXPECT_EQ(WEXITSTATUS(status), 0) << "90: no filter, 91: clone3 not ENOSYS, 92: fallback failed";
}

// The namespace backend passes its v2 group here (RunCgroup::clone_into_fd): the child must be
// inside the group from its first instruction, before it can fork or allocate anything, and never
// in ours. This needs a cgroup2 mount, which hybrid v1 hosts have too (/sys/fs/cgroup/unified,
// without controllers), so it runs on every host this project supports.
TEST(CloneProcess, CloneIntoCgroupStartsTheChildInsideTheGroup) {
  if (geteuid() != 0) GTEST_SKIP() << "making a cgroup needs root";
  const std::string mount = cgroup2_mount();
  if (mount.empty()) GTEST_SKIP() << "no cgroup2 file system is mounted here";
  const V2Group group(mount);
  ASSERT_FALSE(group.dir().empty()) << "cannot make a group under " << mount;
  const int fd = open(group.dir().c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  ASSERT_GE(fd, 0);
  int hold[2];
  ASSERT_EQ(pipe2(hold, O_CLOEXEC), 0);

  const char* expected = group.relative().c_str();
  const auto child = process::start_child({kNamespaces, fd}, [&hold, expected] {
    // Still in the host's cgroup namespace: the path is the one the host sees.
    close(hold[1]);
    char c;
    if (read(hold[0], &c, 1) != 0) _exit(3);
    _exit(in_cgroup2(expected) ? 0 : 4);
  });
  close(hold[0]);
  close(fd);
  ASSERT_GT(child.pid, 0) << "start_child: " << strerror(child.error);
  EXPECT_TRUE(child.into_cgroup) << "clone3 did not take CLONE_INTO_CGROUP";
  // Before the child has done anything: it is the group's only member.
  EXPECT_EQ(members(group.dir()), std::to_string(child.pid) + "\n");
  close(hold[1]);  // let it check from the inside
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PIDFD, static_cast<id_t>(child.pidfd), &info, WEXITED), 0);
  close(child.pidfd);
  EXPECT_EQ(info.si_code, CLD_EXITED);
  EXPECT_EQ(info.si_status, 0) << "3: read, 4: /proc/self/cgroup names another group";
}

// Without a group the child stays in its parent's cgroup.
TEST(CloneProcess, WithoutACgroupFdTheChildStaysInOurs) {
  const std::string ours = own_cgroup2_path();
  if (ours.empty()) GTEST_SKIP() << "this process has no cgroup v2 path";
  const char* expected = ours.c_str();
  const auto child =
      process::start_child({kNamespaces, -1}, [expected] { _exit(in_cgroup2(expected) ? 0 : 1); });
  ASSERT_GT(child.pid, 0);
  EXPECT_FALSE(child.into_cgroup);
  siginfo_t info{};
  ASSERT_EQ(waitid(P_PIDFD, static_cast<id_t>(child.pidfd), &info, WEXITED), 0);
  close(child.pidfd);
  EXPECT_EQ(info.si_status, 0);
}

}  // namespace
}  // namespace rlm
