// sys::current_mountinfo keeps one /proc/self/mountinfo open and reads it again only when the
// kernel says the mount table changed. It must never answer with a stale table: not after a mount
// or an unmount, not in a forked child (which shares the fd's offset with its parent), not after
// the process moved to another mount namespace. Each case runs in a forked child that unshares
// its mount namespace first, so the host's table is never touched.
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/wait.h>
#include <unistd.h>

#include <functional>
#include <optional>
#include <string>

#include "rlm_sys/sys.hpp"
#include "support/subprocess.hpp"

namespace rlm::test {
namespace {

bool lists(const std::optional<std::string>& table, const std::string& mount_point) {
  return table && table->find(" " + mount_point + " ") != std::string::npos;
}

// Runs `body` in a forked child; its return value is the child's exit status (0 = passed).
int in_child(const std::function<int()>& body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 100 + WTERMSIG(status);
}

TEST(CurrentMountinfo, IsTheKernelsTableAndFollowsEveryChange) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting in a private mount namespace needs root here";
  TempDir dir;
  const std::string point = dir.path();
  // Cached in the parent's namespace first: the child inherits that fd and must not trust it.
  ASSERT_TRUE(sys::current_mountinfo());
  const int status = in_child([&] {
    if (!lists(sys::current_mountinfo(), "/proc")) return 1;
    if (unshare(CLONE_NEWNS) != 0 || mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr))
      return 2;
    const auto before = sys::current_mountinfo();  // the new namespace, cached
    if (lists(before, point)) return 3;
    if (mount("tmpfs", point.c_str(), "tmpfs", 0, "size=64k") != 0) return 4;
    if (!lists(sys::current_mountinfo(), point)) return 5;  // the mount is seen
    if (sys::current_mountinfo() != sys::current_mountinfo()) return 6;
    if (umount(point.c_str()) != 0) return 7;
    if (lists(sys::current_mountinfo(), point)) return 8;  // and so is the unmount
    return 0;
  });
  EXPECT_EQ(status, 0) << "1: /proc missing after the fork; 3: a mount from nowhere; 5: a new "
                          "mount unseen; 6: two reads differ; 8: an unmount unseen; else setup";
  // The parent's own cache still answers for the parent's namespace.
  EXPECT_FALSE(lists(sys::current_mountinfo(), point));
  EXPECT_EQ(sys::current_mountinfo(), sys::read_text_file("/proc/self/mountinfo"));
}

TEST(CurrentMountinfo, AnotherNamespaceOfTheSameProcessIsReadAfresh) {
  if (geteuid() != 0) GTEST_SKIP() << "mounting in a private mount namespace needs root here";
  TempDir dir;
  const std::string point = dir.path();
  const int status = in_child([&] {
    // Cached in the namespace inherited from the parent, then the process moves.
    if (!sys::current_mountinfo()) return 1;
    if (unshare(CLONE_NEWNS) != 0 || mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr))
      return 2;
    if (mount("tmpfs", point.c_str(), "tmpfs", 0, "size=64k") != 0) return 3;
    if (!lists(sys::current_mountinfo(), point)) return 4;
    umount(point.c_str());
    return 0;
  });
  EXPECT_EQ(status, 0) << "4: the table of the namespace the process left";
}

}  // namespace
}  // namespace rlm::test
