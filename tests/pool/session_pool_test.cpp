// Warm REPL sessions (runtime/pool/session_pool.cpp): started ahead in real sandboxes on the
// namespace backend, handed over to one caller each -- its context, its LM handler, its lifetime --
// and never reused; a session that died while waiting is never handed over; nothing is left once
// the pool is gone.
#include <gtest/gtest.h>
#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <string>
#include <thread>
#include <vector>

#include "pool/session_pool.hpp"
#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/llm.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/pool.hpp"
#include "rlm_sandbox/session.hpp"
#include "support/host_probes.hpp"
#include "support/subprocess.hpp"

namespace rlm::test {
namespace {

using namespace std::chrono_literals;

// A cell's whole result, for a failed assertion's message.
std::string shown(const CellResult& cell) {
  return cell.to_json().dump();
}

template <typename Predicate>
bool wait_until(Predicate predicate, std::chrono::milliseconds timeout = 60s) {
  const auto deadline = std::chrono::steady_clock::now() + timeout;
  while (std::chrono::steady_clock::now() < deadline) {
    if (predicate()) return true;
    std::this_thread::sleep_for(20ms);
  }
  return predicate();
}

// An LM that answers "<name>: <prompt>", so a cell shows whose handler answered it.
class NamedHandler final : public LlmHandler {
 public:
  explicit NamedHandler(std::string name) : name_(std::move(name)) {}
  void answer(LlmCall call, std::function<void(LlmAnswer)> done) override {
    done(LlmAnswer::of_text(name_ + ": " + call.prompt));
  }

 private:
  std::string name_;
};

// Live processes below this one (the warm sandboxes' inits and everything in them), with their
// command lines.
std::map<pid_t, std::string> descendants() {
  std::map<pid_t, pid_t> parent;
  std::map<pid_t, std::string> command;
  for (const auto& entry : std::filesystem::directory_iterator("/proc")) {
    const std::string name = entry.path().filename();
    if (name.find_first_not_of("0123456789") != std::string::npos) continue;
    try {  // a process that ends while it is read (ESRCH from the read) is gone: skipped
      std::ifstream stat(entry.path() / "stat");
      std::string line;
      if (!std::getline(stat, line) || line.rfind(')') == std::string::npos) continue;
      char state = 0;
      pid_t ppid = 0;
      if (std::sscanf(line.c_str() + line.rfind(')') + 2, "%c %d", &state, &ppid) != 2 ||
          state == 'Z' || state == 'X')
        continue;
      const pid_t pid = std::stoi(name);
      parent[pid] = ppid;
      std::ifstream cmdline(entry.path() / "cmdline");
      std::string text((std::istreambuf_iterator<char>(cmdline)), {});
      for (char& c : text)
        if (c == '\0') c = ' ';
      command[pid] = text;
    } catch (const std::exception&) {
    }
  }
  std::map<pid_t, std::string> found;
  for (const auto& [pid, ppid] : parent) {
    for (pid_t up = ppid, steps = 0; up > 1 && steps < 64; ++steps) {
      if (up == getpid()) {
        found[pid] = command[pid];
        break;
      }
      const auto next = parent.find(up);
      if (next == parent.end()) break;
      up = next->second;
    }
  }
  return found;
}

Policy pool_policy() {
  Policy policy = load_policy("python-repl");
  policy.limits.wall_time = 20s;
  return policy;
}

class SessionPoolTest : public ::testing::Test {
 protected:
  SessionPoolTest() : policy_(pool_policy()), backend_(make_backend("namespace")) {}
  void SetUp() override { ASSERT_TRUE(backend_); }

  std::unique_ptr<pool::SessionPool> make_pool(std::size_t size) {
    auto made = std::make_unique<pool::SessionPool>(*backend_, policy_, size);
    EXPECT_TRUE(wait_until([&] { return made->ready() == size; }))
        << "the pool did not fill: " << made->ready() << " of " << size;
    return made;
  }

  Policy policy_;
  std::unique_ptr<Backend> backend_;
};

TEST_F(SessionPoolTest, AWarmSessionHasTheCallersTextContextAndLmHandler) {
  auto pool = make_pool(1);
  SessionOptions options;
  options.context = std::string(100'000, 'a') + "needle";
  options.llm = std::make_shared<NamedHandler>("caller");
  auto session = pool->open(options);
  EXPECT_EQ(pool->warm_opened(), 1u);
  EXPECT_EQ(pool->cold_opened(), 0u);
  auto first = session->execute("x = len(context)\nprint(x, context.find('needle'))");
  ASSERT_EQ(first.status, CellStatus::ok) << shown(first);
  EXPECT_EQ(first.stdout_data, "100006 100000\n");
  auto asked = session->execute("print(llm_query('ping'))");
  ASSERT_EQ(asked.status, CellStatus::ok) << shown(asked);
  EXPECT_EQ(asked.stdout_data, "caller: ping\n");
  EXPECT_EQ(asked.llm_calls, 1u);
}

TEST_F(SessionPoolTest, AWarmSessionHasTheCallersJsonContext) {
  auto pool = make_pool(1);
  SessionOptions options;
  options.context = R"({"question": "q", "docs": [1, 2, 3]})";
  options.context_is_json = true;
  auto session = pool->open(options);
  EXPECT_EQ(pool->warm_opened(), 1u);
  auto cell = session->execute("print(context['question'], sum(context['docs']))");
  EXPECT_EQ(cell.stdout_data, "q 6\n") << shown(cell);
}

TEST_F(SessionPoolTest, ALargeContextFileCrossesAsAnFdOverTheFrameLimit) {
  TempDir dir;
  const std::size_t size = 24u << 20;  // over the 16 MiB frame maximum
  {
    std::ofstream file(dir.file("context.txt"), std::ios::binary);
    file << std::string(size - 6, 'z') << "needle";
  }
  auto pool = make_pool(1);
  SessionOptions options;
  options.context_file = dir.file("context.txt");
  auto session = pool->open(options);
  EXPECT_EQ(pool->warm_opened(), 1u);
  auto cell = session->execute("print(len(context), context.find('needle'))");
  EXPECT_EQ(cell.stdout_data, std::to_string(size) + " " + std::to_string(size - 6) + "\n")
      << shown(cell);
}

TEST_F(SessionPoolTest, AFirstCellRolledBackKeepsTheCallersContext) {
  // The first checkpoint was taken before the caller came: it takes the context when it forks
  // the standby that replaces a failed first cell.
  auto pool = make_pool(1);
  SessionOptions options;
  options.context = "kept";
  auto session = pool->open(options);
  auto stuck = session->execute("while True: pass", 300ms);
  ASSERT_EQ(stuck.status, CellStatus::timeout) << shown(stuck);
  EXPECT_TRUE(stuck.rolled_back);
  auto after = session->execute("print(context)");
  EXPECT_EQ(after.stdout_data, "kept\n") << shown(after);
}

TEST_F(SessionPoolTest, AnInvalidJsonContextFailsTheHandOverWithItsReason) {
  auto pool = make_pool(1);
  SessionOptions options;
  options.context = "{not json";
  options.context_is_json = true;
  try {
    pool->open(options);
    FAIL() << "opened";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("the context is not valid JSON"), std::string::npos)
        << error.what();
  }
  EXPECT_EQ(pool->warm_opened(), 1u);
}

TEST_F(SessionPoolTest, WithoutALlmHandlerAWarmSessionsQueriesFail) {
  // The pool starts its sessions with no handler; the caller's (none here) is the one in force.
  auto pool = make_pool(1);
  auto session = pool->open({});
  auto cell = session->execute("print(llm_query('ping'))");  // "Error: ...", as the RLM library
  EXPECT_EQ(cell.status, CellStatus::ok) << shown(cell);
  EXPECT_EQ(cell.stdout_data, "Error: no LM handler is configured for this session\n");
}

TEST_F(SessionPoolTest, NothingOfOnePooledSessionReachesTheNext) {
  auto pool = make_pool(2);
  {
    auto first = pool->open({});
    auto dirty = first->execute(R"(
import os, subprocess
left_behind = 'global'
open('/tmp/left-behind', 'w').write('file')
os.environ['LEFT_BEHIND'] = 'env'
subprocess.Popen(['sleep', '1000'], start_new_session=True)
print(os.path.exists('/tmp/left-behind'), 'LEFT_BEHIND' in os.environ)
)");
    ASSERT_EQ(dirty.status, CellStatus::ok) << shown(dirty);
    ASSERT_EQ(dirty.stdout_data, "True True\n");
    first->close();
  }
  auto second = pool->open({});
  EXPECT_EQ(pool->warm_opened(), 2u);
  auto clean = second->execute(R"(
import os
sleeping = []
for pid in filter(str.isdigit, os.listdir('/proc')):
    try:
        if open('/proc/%s/cmdline' % pid, 'rb').read().startswith(b'sleep'):
            sleeping.append(pid)
    except OSError:
        pass
print('left_behind' in globals(), os.path.exists('/tmp/left-behind'),
      'LEFT_BEHIND' in os.environ, sleeping)
)");
  ASSERT_EQ(clean.status, CellStatus::ok) << shown(clean);
  EXPECT_EQ(clean.stdout_data, "False False False []\n");
}

TEST_F(SessionPoolTest, ASessionThatDiedWhileWaitingIsNeverHandedOver) {
  auto pool = make_pool(1);
  std::vector<pid_t> workers;
  for (const auto& [pid, command] : descendants())
    if (command.rfind("python3 -I -S -c", 0) == 0) workers.push_back(pid);
  ASSERT_FALSE(workers.empty()) << "no worker of the warm session below this process";
  for (const pid_t pid : workers) kill(pid, SIGKILL);
  ASSERT_TRUE(wait_until([&] {
    const auto alive = descendants();
    for (const pid_t pid : workers)
      if (alive.count(pid)) return false;
    return true;
  }));
  // The refill takes far longer than this to start another: what open() finds is the dead one.
  auto session = pool->open({});
  EXPECT_EQ(pool->warm_opened(), 0u);
  EXPECT_EQ(pool->cold_opened(), 1u);
  auto cell = session->execute("1 + 1");
  ASSERT_EQ(cell.status, CellStatus::ok) << shown(cell);
  EXPECT_EQ(cell.stdout_data, "2\n");
  // And the pool refills.
  EXPECT_TRUE(wait_until([&] { return pool->ready() == 1; }));
}

TEST_F(SessionPoolTest, CallersInParallelEachGetASessionOfTheirOwn) {
  auto pool = make_pool(2);
  constexpr int kCallers = 4;
  std::vector<std::string> outputs(kCallers);
  std::vector<std::thread> callers;
  for (int i = 0; i < kCallers; ++i) {
    callers.emplace_back([&, i] {
      SessionOptions options;
      options.context = "caller " + std::to_string(i);
      auto session = pool->open(options);
      outputs[i] = session->execute("print(context)").stdout_data;
    });
  }
  for (auto& caller : callers) caller.join();
  for (int i = 0; i < kCallers; ++i) EXPECT_EQ(outputs[i], "caller " + std::to_string(i) + "\n");
  EXPECT_EQ(pool->warm_opened() + pool->cold_opened(), static_cast<std::uint64_t>(kCallers));
  EXPECT_GE(pool->warm_opened(), 2u);
}

TEST_F(SessionPoolTest, WithNoneReadyTheSessionIsOpenedCold) {
  pool::SessionPool pool(*backend_, policy_, 0);
  auto session = pool.open({});
  EXPECT_EQ(pool.cold_opened(), 1u);
  EXPECT_EQ(session->execute("1 + 1").stdout_data, "2\n");
}

TEST_F(SessionPoolTest, ALifetimeBeyondTheWarmRunIsServedColdAndTheWarmOneKept) {
  auto pool = make_pool(1);
  SessionOptions options;
  options.lifetime = 24h * 3;  // warm runs last 48 h
  auto session = pool->open(options);
  EXPECT_EQ(pool->cold_opened(), 1u);
  EXPECT_EQ(pool->warm_opened(), 0u);
  EXPECT_EQ(pool->ready(), 1u);
  EXPECT_EQ(session->execute("1 + 1").stdout_data, "2\n");
}

TEST_F(SessionPoolTest, TheLifetimeCountsFromTheHandOver) {
  auto pool = make_pool(1);
  std::this_thread::sleep_for(2s);  // waited longer than the caller's lifetime below
  SessionOptions options;
  options.lifetime = 1500ms;
  auto session = pool->open(options);
  ASSERT_EQ(pool->warm_opened(), 1u);
  auto alive = session->execute("1 + 1");
  ASSERT_EQ(alive.status, CellStatus::ok) << shown(alive);
  std::this_thread::sleep_for(2500ms);
  std::string why;
  try {
    auto late = session->execute("1 + 1");
    EXPECT_EQ(late.status, CellStatus::session_error) << shown(late);
    why = late.error;
  } catch (const Error& error) {
    why = error.what();
  }
  EXPECT_NE(why.find("lifetime of 1.5s ran out"), std::string::npos) << why;
}

TEST_F(SessionPoolTest, AnUnreadableContextFileIsTheCallersErrorAndCostsNoWarmSession) {
  auto pool = make_pool(1);
  SessionOptions options;
  options.context_file = "/nonexistent/prompt.txt";
  try {
    pool->open(options);
    FAIL() << "opened";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("/nonexistent/prompt.txt"), std::string::npos);
  }
  EXPECT_EQ(pool->ready(), 1u);
  EXPECT_EQ(pool->warm_opened() + pool->cold_opened(), 0u);
}

TEST_F(SessionPoolTest, DestroyingThePoolLeavesNoProcessesOrCgroups) {
  {
    auto pool = make_pool(2);
    auto session = pool->open({});
    ASSERT_EQ(session
                  ->execute("import subprocess\n"
                            "subprocess.Popen(['sleep', '1000'], start_new_session=True)")
                  .status,
              CellStatus::ok);
    EXPECT_FALSE(descendants().empty());
    session.reset();
  }
  EXPECT_TRUE(descendants().empty());
  EXPECT_TRUE(children_of_this_process().empty());
  const auto cgroups = own_cgroup_dirs();
  EXPECT_TRUE(cgroups.empty()) << cgroups.front();
}

TEST(PoolSessions, PoolOpenSessionHandsOverAWarmSession) {
  Policy policy = load_policy("python-repl");
  PoolOptions options;
  options.sandboxes = 0;
  options.sessions = 1;
  Pool pool(policy, options);
  ASSERT_TRUE(wait_until([&] { return pool.stats().ready_sessions == 1; }));
  SessionOptions caller;
  caller.context = "warm";
  auto session = pool.open_session(caller);
  EXPECT_EQ(pool.stats().warm_sessions, 1u);
  EXPECT_EQ(session->execute("x = len(context)\nprint(context, x)").stdout_data, "warm 4\n");
}

}  // namespace
}  // namespace rlm::test
