// Nothing is left behind: many runs, consecutive and concurrent, ending well or badly, leave no
// cgroup, no mount, no child process and no file descriptor behind in the process that ran them.
// What is compared is the set of things present before and after, limited to what these runs could
// have made: mounts in this process's own mount table, cgroups made by this process (or the CLI
// processes it ran), this process's children and fds. These run serially (see
// security_tests.cmake), as they load the machine.
#include <dirent.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <filesystem>
#include <thread>

#include "security_test_util.hpp"
#include "support/host_probes.hpp"

namespace rlm::sectest {
namespace {

// Every directory under an rlm-sandbox parent in any cgroup hierarchy (v1 controllers, the v2
// unified mount, or a v2-only root), the parents themselves excluded.
std::set<std::string> cgroup_dirs() {
  std::set<std::string> dirs;
  std::vector<std::string> parents{"/sys/fs/cgroup/rlm-sandbox"};
  for (const auto& hierarchy : test::directories_below("/sys/fs/cgroup", 1))
    parents.push_back(hierarchy + "/rlm-sandbox");
  for (const auto& parent : parents)
    for (auto& dir : test::directories_below(parent, 64)) dirs.insert(std::move(dir));
  return dirs;
}

std::set<pid_t> child_processes() {
  std::set<pid_t> children;
  const std::string self = std::to_string(::getpid());
  for (pid_t pid : host_pids()) {
    auto status = read_file("/proc/" + std::to_string(pid) + "/status");
    if (status_field(status, "PPid") == self) children.insert(pid);
  }
  return children;
}

// fd number -> what it refers to.
std::map<int, std::string> open_fds() {
  std::map<int, std::string> fds;
  DIR* dir = ::opendir("/proc/self/fd");
  if (!dir) return fds;
  const int own = ::dirfd(dir);
  while (dirent* entry = ::readdir(dir)) {
    if (entry->d_name[0] == '.') continue;
    int fd = std::atoi(entry->d_name);
    if (fd == own) continue;
    char target[512] = {};
    ssize_t n = ::readlinkat(own, entry->d_name, target, sizeof target - 1);
    fds[fd] = n > 0 ? std::string(target, static_cast<size_t>(n)) : "?";
  }
  ::closedir(dir);
  return fds;
}

struct Footprint {
  std::set<std::string> cgroups;
  std::set<std::string> mounts;
  std::set<pid_t> children;
  std::map<int, std::string> fds;

  static Footprint take() {
    return {cgroup_dirs(), test::mount_table(), child_processes(), open_fds()};
  }
};

// Whether a run group was made by one of `runtimes`: group names start with the pid of the runtime
// process that made them ("<pid>-<starttime>-<pidns>-<counter>", see the cgroup code). Other
// runtimes on this machine (another build's tests) make groups while we count, and one that dies
// (killed on purpose by its test) leaves its group until a later runtime collects it.
bool made_by(const std::string& dir, const std::set<pid_t>& runtimes) {
  std::filesystem::path path(dir);
  while (path.has_parent_path() && path.parent_path().filename() != "rlm-sandbox")
    path = path.parent_path();
  const std::string name = path.filename().string();
  const auto dash = name.find('-');
  if (dash == 0 || dash == std::string::npos || name.find_first_not_of("0123456789") != dash)
    return true;  // not a run id: counted
  return runtimes.count(static_cast<pid_t>(std::stol(name.substr(0, dash)))) > 0;
}

// Cgroup directories that are new since `before` and made by one of `runtimes`. A group that is
// being removed as the run returns gets a moment to go; a leaked group stays forever.
std::vector<std::string> new_cgroups(const Footprint& before, const std::set<pid_t>& runtimes) {
  std::vector<std::string> leaked;
  for (int attempt = 0; attempt < 30; ++attempt) {
    leaked.clear();
    for (const auto& dir : cgroup_dirs())
      if (!before.cgroups.count(dir) && made_by(dir, runtimes)) leaked.push_back(dir);
    if (leaked.empty()) return leaked;
    std::this_thread::sleep_for(100ms);
  }
  return leaked;
}

// `runtimes`: the processes whose runs are counted, this one unless the test started others.
void expect_nothing_left(const Footprint& before, const std::string& what,
                         const std::set<pid_t>& runtimes = {::getpid()}) {
  auto after = Footprint::take();
  for (const auto& dir : new_cgroups(before, runtimes))
    ADD_FAILURE() << what << " left a cgroup behind: " << dir;
  const auto mounts = test::mount_table_since(before.mounts);
  for (const auto& line : mounts)
    if (!before.mounts.count(line)) ADD_FAILURE() << what << " left a mount behind: " << line;
  for (const auto& line : before.mounts)
    if (!mounts.count(line)) ADD_FAILURE() << what << " removed a mount: " << line;
  for (pid_t pid : after.children)
    if (!before.children.count(pid))
      ADD_FAILURE() << what << " left a child process behind: pid " << pid << " "
                    << read_file("/proc/" + std::to_string(pid) + "/cmdline");
  for (const auto& [fd, target] : after.fds)
    if (!before.fds.count(fd) || before.fds.at(fd) != target)
      ADD_FAILURE() << what << " left fd " << fd << " open: " << target;
  EXPECT_EQ(after.fds.size(), before.fds.size()) << what << ": open fd count";
}

class CleanupTest : public NamespaceTest {
 protected:
  void SetUp() override {
    // Mounts are compared in a mount table only this process and its runs change (where this
    // process may make one), so that a mount or unmount elsewhere on the machine is not counted.
    test::isolate_mount_table();
    NamespaceTest::SetUp();
    if (HasFatalFailure()) return;
    // One run first, so whatever a backend sets up once per process (stale-group collection,
    // caches) is in place before counting starts.
    auto warm = run({"true"});
    ASSERT_EQ(warm.status, Status::ok) << describe(warm);
  }
};

TEST_F(CleanupTest, ThousandConsecutiveRunsLeaveNothingBehind) {
  const int runs = test::scaled(1000);  // fewer only under emulation (tests/vm)
  auto before = Footprint::take();
  auto start = std::chrono::steady_clock::now();
  int failures = 0;
  std::string first_failure;
  for (int i = 0; i < runs; ++i) {
    auto result = run({"/bin/true"});
    if (result.status != Status::ok && failures++ == 0) first_failure = describe(result);
  }
  auto elapsed = std::chrono::duration_cast<std::chrono::milliseconds>(
      std::chrono::steady_clock::now() - start);
  EXPECT_EQ(failures, 0) << "first: " << first_failure;
  std::cout << "[          ] " << runs << " runs of /bin/true in " << elapsed.count() << " ms ("
            << elapsed.count() / static_cast<double>(runs) << " ms each)\n";
  expect_nothing_left(before, std::to_string(runs) + " consecutive runs");
}

TEST_F(CleanupTest, EightThreadsTimesTwoHundredConcurrentRunsLeaveNothingBehind) {
  const int runs_per_thread = test::scaled(200);
  auto before = Footprint::take();
  std::atomic<int> failures{0}, crossed{0};
  std::vector<std::string> first_failure(8);
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      auto backend = make_backend("namespace");  // one per thread; the registry is shared
      for (int i = 0; i < runs_per_thread; ++i) {
        // Each run echoes its own tag, so output crossing between concurrent runs shows.
        const std::string tag = "run-" + std::to_string(t) + "-" + std::to_string(i);
        Request request;
        request.argv = {"/bin/echo", tag};
        auto result = backend->run(request, policy_);
        if (result.status != Status::ok) {
          if (failures++ == 0) first_failure[t] = describe(result);
        } else if (result.stdout_data != tag + "\n") {
          crossed++;
        }
      }
    });
  for (auto& thread : threads) thread.join();
  std::string failure;
  for (const auto& text : first_failure) failure += text;
  EXPECT_EQ(failures.load(), 0) << failure;
  EXPECT_EQ(crossed.load(), 0) << "runs received another run's output";
  expect_nothing_left(before,
                      "8 threads x " + std::to_string(runs_per_thread) + " concurrent runs");
}

TEST_F(CleanupTest, RunsThatEndBadlyLeaveNothingBehind) {
  auto before = Footprint::take();
  auto with = [this](auto change) {
    Policy policy = policy_;
    change(policy.limits);
    return policy;
  };
  struct Case {
    const char* name;
    Policy policy;
    std::vector<std::string> argv;
    std::optional<std::chrono::milliseconds> timeout;
    Status expected;
  };
  // Without a cgroup (lane user-no-cgroup) rlimits stand in: the allocation fails in the payload,
  // and the fork loop spins under RLIMIT_NPROC until its time is up.
  const bool cgroups = test::lane_has_cgroups();
  const std::vector<Case> cases{
      {"timeout", policy_, {"sleep", "60"}, 300ms, Status::timeout},
      {"memory",
       with([](Limits& l) { l.memory_bytes = 32ull << 20; }),
       {"python3", "-c", "b = bytearray(1 << 30)"},
       std::nullopt,
       cgroups ? Status::memory_limit : Status::exit_nonzero},
      {"pids",
       with([](Limits& l) { l.pids = 16; }),
       {"python3", "-c", "import os\nwhile True:\n    try: os.fork()\n    except OSError: pass"},
       2000ms,
       cgroups ? Status::pids_limit : Status::timeout},
      {"output",
       with([](Limits& l) { l.output_bytes = 4096; }),
       {"sh", "-c", "yes rlm-output-flood"},
       std::nullopt,
       Status::output_limit},
      {"signal", policy_, {"sh", "-c", "kill -SEGV $$"}, std::nullopt, Status::signaled},
      {"exit", policy_, {"sh", "-c", "sleep 60 & exit 3"}, std::nullopt, Status::exit_nonzero},
      {"not found", policy_, {"rlm-no-such-command"}, std::nullopt, Status::exit_nonzero},
  };
  for (const auto& c : cases)
    for (int i = 0; i < 5; ++i) {
      auto result = run(c.argv, c.policy, c.timeout);
      EXPECT_EQ(result.status, c.expected) << c.name << ": " << describe(result);
    }
  expect_nothing_left(before, "runs ending in limits, signals and failures");
}

TEST_F(CleanupTest, CliRunsLeaveNothingBehindOnTheHost) {
  auto before = Footprint::take();
  std::set<pid_t> runtimes{::getpid()};  // each CLI process is the runtime of its run
  for (int i = 0; i < 50; ++i) {
    auto out = cli({"run", "--", "true"});
    runtimes.insert(out.pid);
    ASSERT_EQ(out.exit_code, 0) << out.err;
  }
  auto timed_out = cli({"run", "--timeout", "300ms", "--", "sh", "-c", "sleep 60 & sleep 60"});
  runtimes.insert(timed_out.pid);
  EXPECT_EQ(timed_out.exit_code, 124) << timed_out.err;
  expect_nothing_left(before, "51 CLI runs", runtimes);
}

}  // namespace
}  // namespace rlm::sectest
