// The shared test helpers that other tests' verdicts rest on: the environment guard, the directory
// walk the cleanup checks use, and the mount table of a process's own. The mount tests build a
// stand-in for "the machine" in a throwaway mount namespace, so the host's table is never touched.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>

#include "support/host_probes.hpp"
#include "support/scoped_env.hpp"
#include "support/subprocess.hpp"

namespace rlm::test {
namespace {

TEST(ScopedEnv, RestoresTheValueOrTheAbsenceItFound) {
  ::setenv("RLM_TEST_SCOPED", "before", 1);
  {
    ScopedEnv changed("RLM_TEST_SCOPED", "during");
    EXPECT_STREQ(std::getenv("RLM_TEST_SCOPED"), "during");
    ScopedEnv removed("RLM_TEST_SCOPED", std::nullopt);
    EXPECT_EQ(std::getenv("RLM_TEST_SCOPED"), nullptr);
  }
  EXPECT_STREQ(std::getenv("RLM_TEST_SCOPED"), "before");
  ::unsetenv("RLM_TEST_SCOPED");
  {
    ScopedEnv set("RLM_TEST_SCOPED", "");
    EXPECT_STREQ(std::getenv("RLM_TEST_SCOPED"), "");
  }
  EXPECT_EQ(std::getenv("RLM_TEST_SCOPED"), nullptr) << "an empty value is not an absence";
}

TEST(HostProbes, DirectoriesBelowGoesToItsDepthAndFollowsNoLink) {
  TempDir dir;
  std::filesystem::create_directories(dir.file("a/b/c"));
  std::filesystem::create_directory(dir.file("d"));
  dir.write("a/file", "not a directory");
  std::filesystem::create_directory_symlink(dir.file("a"), dir.file("link"));
  auto found = directories_below(dir.path(), 2);
  std::sort(found.begin(), found.end());
  EXPECT_EQ(found, (std::vector<std::string>{dir.file("a"), dir.file("a/b"), dir.file("d")}));
  EXPECT_EQ(directories_below(dir.path(), 3).size(), 4u);
  EXPECT_TRUE(directories_below(dir.file("gone"), 3).empty());
}

// Runs `body` in a forked child and returns its exit code (128 + signal when a signal ended it).
template <typename Body>
int in_child(Body body) {
  const pid_t pid = fork();
  if (pid == 0) _exit(body());
  int status = 0;
  waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// A process that stays in the mount namespace it was started in and, when asked, mounts a tmpfs on
// `target` or unmounts it and removes the directory; it stays until told to go, so that what it
// mounted lives as long as the test needs it.
class MountElsewhere {
 public:
  explicit MountElsewhere(std::string target) : target_(std::move(target)) {
    if (pipe(ask_) != 0 || pipe(done_) != 0) _exit(90);
    pid_ = fork();
    if (pid_ == 0) {
      close(ask_[1]);
      close(done_[0]);
      char what;
      while (read(ask_[0], &what, 1) == 1) {  // until told to go, or the test process is gone
        const bool done = what == 'm' ? mount("tmpfs", target_.c_str(), "tmpfs", 0, "size=64k") == 0
                                      : umount(target_.c_str()) == 0 && rmdir(target_.c_str()) == 0;
        if (write(done_[1], done ? "y" : "n", 1) != 1) _exit(91);
      }
      _exit(0);
    }
    close(ask_[0]);
    close(done_[1]);
  }
  ~MountElsewhere() {
    close(ask_[1]);
    close(done_[0]);
    waitpid(pid_, nullptr, 0);
  }
  // Whether the tmpfs was mounted.
  bool mount_now() { return ask('m'); }
  // Whether the tmpfs was unmounted and its mount point removed.
  bool remove_now() { return ask('r'); }

 private:
  bool ask(char what) {
    char byte = 0;
    return write(ask_[1], &what, 1) == 1 && read(done_[0], &byte, 1) == 1 && byte == 'y';
  }

  std::string target_;
  int ask_[2] = {-1, -1};
  int done_[2] = {-1, -1};
  pid_t pid_ = -1;
};

// Runs `body` in a forked child that is in a stand-in for the machine: a mount namespace of its own
// whose mounts are shared, as a systemd host's are. Its exit code (80-82: no stand-in).
template <typename Body>
int on_a_machine(Body body) {
  return in_child([&] {
    if (unshare(CLONE_NEWNS) != 0) return 80;
    if (mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) != 0) return 81;
    if (mount(nullptr, "/", nullptr, MS_REC | MS_SHARED, nullptr) != 0) return 82;
    return body();
  });
}

// The mount-table tests make mount namespaces, which takes root, and scratch directories to mount
// on.
class IsolatedMountTable : public ::testing::Test {
 protected:
  void SetUp() override {
    if (geteuid() != 0) GTEST_SKIP() << "needs root to make mount namespaces";
  }
  // A new directory `name` in the test's scratch directory.
  std::string directory(const std::string& name) const {
    std::filesystem::create_directories(dir_.file(name));
    return dir_.file(name);
  }

  TempDir dir_;
};

TEST_F(IsolatedMountTable, SeesItsOwnRunsMountsAndNobodyElses) {
  const std::string elsewhere = directory("elsewhere"), ours = directory("ours");
  const int code = on_a_machine([&] {
    // Control: before isolating, a mount elsewhere on "the machine" shows in this table.
    {
      MountElsewhere other(elsewhere);
      const auto before = mount_table();
      if (!other.mount_now()) return 1;
      if (mount_table() == before) return 2;
    }
    MountElsewhere other(elsewhere);  // started on "the machine", before isolating
    if (!isolate_mount_table()) return 3;
    const auto isolated = mount_table();
    // Now it does not...
    if (!other.mount_now()) return 4;
    if (mount_table() != isolated) return 5;
    // ...while a mount one of our runs makes in a namespace cloned from ours, and which propagates
    // back, does.
    const int run = in_child([&] {
      if (unshare(CLONE_NEWNS) != 0) return 1;
      return mount("tmpfs", ours.c_str(), "tmpfs", 0, "size=64k") == 0 ? 0 : 2;
    });
    if (run != 0) return 10 + run;
    const auto after = mount_table();
    const bool ours_shows = std::any_of(after.begin(), after.end(), [&](const std::string& line) {
      return !isolated.count(line) && line.find(" " + ours + " ") != std::string::npos;
    });
    return ours_shows ? 0 : 6;
  });
  // 1-2: the control failed; 3: not isolated; 4-5: a mount elsewhere showed; 6: ours did not.
  EXPECT_EQ(code, 0);
}

TEST_F(IsolatedMountTable, DoesNotCountAMountWhosePointAnotherProcessRemoved) {
  const std::string removed = directory("removed elsewhere"), here = directory("unmounted here");
  const int code = on_a_machine([&] {
    MountElsewhere other(removed);
    if (!other.mount_now()) return 1;
    if (mount("tmpfs", here.c_str(), "tmpfs", 0, "size=64k") != 0) return 2;
    if (!isolate_mount_table()) return 3;
    const auto before = mount_table();
    // The kernel detaches the isolated copy of a mount whose point another process removes...
    if (!other.remove_now()) return 4;
    if (mount_table().size() != before.size() - 1) return 5;
    // ...which is not counted; a mount unmounted here, its point still there, is.
    if (umount(here.c_str()) != 0) return 6;
    const auto since = mount_table_since(before);
    if (since.size() != before.size() - 1) return 7;
    for (const auto& line : before)
      if (!since.count(line) && line.find("unmounted\\040here") == std::string::npos) return 8;
    return 0;
  });
  // 1-4: setting up failed; 5: the kernel did not detach it; 6: unmounting failed; 7-8: the wrong
  // mount was counted as removed.
  EXPECT_EQ(code, 0);
}

TEST_F(IsolatedMountTable, IsRefusedBesideAnotherThread) {
  const int code = on_a_machine([] {
    int wake[2];
    if (pipe(wake) != 0) return 1;
    std::thread other([&] {
      char byte;
      read(wake[0], &byte, 1);
    });
    const bool isolated = isolate_mount_table();
    close(wake[1]);
    other.join();
    return isolated ? 2 : 0;
  });
  EXPECT_EQ(code, 0) << "isolated although another thread would have stayed behind";
}

}  // namespace
}  // namespace rlm::test
