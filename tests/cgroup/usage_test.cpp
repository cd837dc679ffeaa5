// The one usage reader: a process's cgroup found from its pid (as the docker backend finds a
// container's) reads the same counters as the run's own group, only when its path names what the
// caller expects, and answers nothing once the group is gone.
#include <sys/mman.h>

#include <array>
#include <cerrno>
#include <cstring>

#include "cgroup/usage.hpp"
#include "cgroup_test_util.hpp"

namespace rlm::test {
namespace {

constexpr std::uint64_t MiB = 1ull << 20;

// A child in `group` that has touched 8 MiB and burnt a little CPU, then is stopped.
class BusyChild {
 public:
  explicit BusyChild(cgroup::RunCgroup& group)
      : ready_(make_pipe()), child_([this] {
          void* p =
              ::mmap(nullptr, 8 * MiB, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
          if (p == MAP_FAILED) return 3;
          std::memset(p, 1, 8 * MiB);
          (void)!::write(ready_[1], "x", 1);
          for (;;) ::pause();
        }) {
    ::close(ready_[1]);  // so a child that dies before it is ready ends the read below
    ready_[1] = -1;
    group.attach(child_.pid());
    child_.release();
    char c = 0;
    if (::read(ready_[0], &c, 1) != 1) return;
    // Stopped, so that its counters stand still between two reads.
    int status = 0;
    ready_ok_ = ::kill(child_.pid(), SIGSTOP) == 0 &&
                ::waitpid(child_.pid(), &status, WUNTRACED) == child_.pid() && WIFSTOPPED(status);
  }
  ~BusyChild() { ::close(ready_[0]); }
  pid_t pid() const { return child_.pid(); }
  bool ready() const { return ready_ok_; }

 private:
  static std::array<int, 2> make_pipe() {
    std::array<int, 2> fds{-1, -1};
    if (::pipe2(fds.data(), O_CLOEXEC) != 0) ADD_FAILURE() << "pipe2: " << std::strerror(errno);
    return fds;
  }
  std::array<int, 2> ready_;
  WaitingChild child_;
  bool ready_ok_ = false;
};

std::string run_id_of(const cgroup::RunCgroup& group) {
  const std::string& dir = dirs_of(group)[0];
  return dir.substr(dir.rfind('/') + 1);
}

TEST(CgroupUsage, AProcessIsFoundByItsCgroupAndReadsWhatItsGroupReads) {
  RLM_REQUIRE_CGROUP_ACCESS();
  RLM_MAKE_GROUP(group, limits(64 * MiB, 16));
  BusyChild child(*group);
  ASSERT_TRUE(child.ready());

  const auto reader = cgroup::UsageReader::of_process(child.pid(), run_id_of(*group));
  ASSERT_TRUE(reader.has_value()) << "the child's cgroup, found from its pid";
  const auto usage = group->usage();
  const auto found = reader->read();
  // The child is stopped: nothing moves between the two reads.
  EXPECT_EQ(found.peak_memory_bytes, usage.peak_memory_bytes);
  EXPECT_EQ(reader->peak_memory_bytes(), usage.peak_memory_bytes);
  if (usage.peak_memory_bytes) {
    EXPECT_GE(*usage.peak_memory_bytes, 8 * MiB);
  }
  EXPECT_EQ(found.cpu, usage.cpu);
  ASSERT_TRUE(reader->cpu_time().has_value()) << "every lane's cgroups count CPU time";
  EXPECT_EQ(reader->cpu_time(), group->cpu_time());
  EXPECT_GT(reader->cpu_time()->count(), 0) << "touching 8 MiB takes some CPU";
  EXPECT_EQ(reader->oom_kills(), std::optional<std::uint64_t>(0));
  EXPECT_EQ(found.oom_kills, 0u);
  const auto live = reader->live();
  EXPECT_EQ(live.oom_kills, reader->oom_kills());
  EXPECT_EQ(live.cpu, reader->cpu_time());
}

// A run's group opens its counter files when it is made (a pool builds it ahead of the run) and
// reads them again at the end: what it reads then is what the group counts then, not what the
// files said when they were opened.
TEST(CgroupUsage, CountersOpenedAheadReadWhatTheGroupCountsNow) {
  RLM_REQUIRE_CGROUP_ACCESS();
  RLM_MAKE_GROUP(group, limits(64 * MiB, 16));
  const auto before = group->usage();
  const auto cpu_before = before.cpu.value_or(std::chrono::microseconds(0));
  BusyChild child(*group);  // touches 8 MiB, then stops
  ASSERT_TRUE(child.ready());
  const auto after = group->usage();
  ASSERT_TRUE(after.cpu.has_value());
  EXPECT_GT(*after.cpu, cpu_before) << "the CPU time read again, not the text read first";
  if (after.peak_memory_bytes) {
    EXPECT_GE(*after.peak_memory_bytes, 8 * MiB);
    EXPECT_GT(*after.peak_memory_bytes, before.peak_memory_bytes.value_or(0));
  }
  // And the same as a reader that opens each file by its path.
  const auto by_path = cgroup::UsageReader::of_process(child.pid(), run_id_of(*group));
  ASSERT_TRUE(by_path.has_value());
  EXPECT_EQ(by_path->read().cpu, after.cpu);
  EXPECT_EQ(by_path->read().peak_memory_bytes, after.peak_memory_bytes);
}

TEST(CgroupUsage, AProcessWhoseCgroupDoesNotNameTheExpectedIsNotRead) {
  RLM_REQUIRE_CGROUP_ACCESS();
  RLM_MAKE_GROUP(group, limits(64 * MiB, 16));
  BusyChild child(*group);
  ASSERT_TRUE(child.ready());
  EXPECT_FALSE(cgroup::UsageReader::of_process(child.pid(), "0123456789abcdef").has_value())
      << "a pid that means another process here (another PID namespace) must not be read";
  EXPECT_FALSE(cgroup::UsageReader::of_process(0, run_id_of(*group)).has_value());
  EXPECT_FALSE(cgroup::UsageReader::of_process(child.pid(), "").has_value());
}

TEST(CgroupUsage, AGroupThatIsGoneAnswersNothing) {
  RLM_REQUIRE_CGROUP_ACCESS();
  RLM_MAKE_GROUP(group, limits(64 * MiB, 16));
  std::optional<cgroup::UsageReader> reader;
  {
    BusyChild child(*group);
    ASSERT_TRUE(child.ready());
    reader = cgroup::UsageReader::of_process(child.pid(), run_id_of(*group));
    ASSERT_TRUE(reader.has_value());
    group.reset();  // kills the child and removes the group
  }
  EXPECT_EQ(reader->cpu_time(), std::nullopt);
  EXPECT_EQ(reader->oom_kills(), std::nullopt);
  EXPECT_EQ(reader->peak_memory_bytes(), std::nullopt);
  const auto live = reader->live();
  EXPECT_FALSE(live.cpu.has_value());
  EXPECT_FALSE(live.oom_kills.has_value());
}

}  // namespace
}  // namespace rlm::test
