// Sessions end to end: the Python REPL worker in a real sandbox (namespace backend, and the local
// backend where the policy allows it), driven through rlm::Session.
#include <gtest/gtest.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <fstream>
#include <mutex>
#include <thread>

#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/llm.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/session.hpp"
#include "support/host_probes.hpp"
#include "support/subprocess.hpp"

namespace rlm::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string dump(const CellResult& cell) {
  return cell.to_json().dump();
}

// An LM that answers on threads of its own after a delay, counting how many calls overlap.
class SlowHandler final : public LlmHandler {
 public:
  explicit SlowHandler(std::chrono::milliseconds delay) : delay_(delay) {}
  ~SlowHandler() override {
    for (auto& thread : threads_) thread.join();
  }
  void answer(LlmCall call, std::function<void(LlmAnswer)> done) override {
    std::lock_guard lock(mutex_);
    threads_.emplace_back([this, call = std::move(call), done = std::move(done)] {
      const int now = ++running_;
      for (int seen = peak_; now > seen && !peak_.compare_exchange_weak(seen, now);) {
      }
      std::this_thread::sleep_for(delay_);
      --running_;
      if (call.prompt == "fail me")
        done(LlmAnswer::of_error("the model refused"));
      else
        done(LlmAnswer::of_text("answer to " + call.prompt + " from " + call.model.value_or("?")));
    });
  }
  int peak() const { return peak_; }

 private:
  std::chrono::milliseconds delay_;
  std::mutex mutex_;
  std::vector<std::thread> threads_;
  std::atomic<int> running_{0}, peak_{0};
};

Policy repl_policy() {
  Policy policy = load_policy("python-repl");
  policy.limits.wall_time = 10s;
  return policy;
}

class SessionTest : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    policy_ = GetParam() == "local" ? load_policy("trusted-local") : repl_policy();
    policy_.limits.wall_time = 10s;
    backend_ = make_backend(GetParam());
    ASSERT_TRUE(backend_);
  }

  std::unique_ptr<Session> open(SessionOptions options = {}) {
    return backend_->open_session(policy_, std::move(options));
  }

  // A session whose llm_query calls `llm` answers.
  std::unique_ptr<Session> open_with_llm(std::shared_ptr<LlmHandler> llm) {
    SessionOptions options;
    options.llm = std::move(llm);
    return open(std::move(options));
  }

  Policy policy_;
  std::unique_ptr<Backend> backend_;
};

TEST_P(SessionTest, VariablesAndFunctionsPersistFromCellToCell) {
  auto session = open();
  EXPECT_EQ(session->backend(), GetParam());
  auto set = session->execute("x = 41");
  ASSERT_EQ(set.status, CellStatus::ok) << dump(set);
  auto next = session->execute("x + 1");
  EXPECT_EQ(next.status, CellStatus::ok) << dump(next);
  EXPECT_EQ(next.stdout_data, "42\n");
  ASSERT_EQ(session->execute("def twice(n):\n    return 2 * n\nimport math").status,
            CellStatus::ok);
  auto call = session->execute("print(twice(21), math.floor(2.5))");
  EXPECT_EQ(call.stdout_data, "42 2\n") << dump(call);
  EXPECT_FALSE(call.rolled_back);
}

TEST_P(SessionTest, AnExceptionIsAnErrorWithItsTracebackAndTheSessionGoesOn) {
  auto session = open();
  session->execute("y = 1");
  auto failed = session->execute("print('before')\n1 / 0");
  EXPECT_EQ(failed.status, CellStatus::error) << dump(failed);
  EXPECT_NE(failed.error.find("ZeroDivisionError"), std::string::npos) << failed.error;
  EXPECT_EQ(failed.stdout_data, "before\n");
  EXPECT_FALSE(failed.rolled_back);
  EXPECT_EQ(session->execute("y").stdout_data, "1\n");
}

TEST_P(SessionTest, ContextIsTheGivenTextOrJson) {
  SessionOptions text;
  text.context = std::string(100'000, 'a') + "needle";
  auto session = open(text);
  auto found = session->execute("print(len(context), context.find('needle'))");
  EXPECT_EQ(found.stdout_data, "100006 100000\n") << dump(found);

  SessionOptions structured;
  structured.context = R"({"question": "q", "docs": [1, 2, 3]})";
  structured.context_is_json = true;
  auto json_session = open(structured);
  EXPECT_EQ(json_session->execute("print(context['question'], sum(context['docs']))").stdout_data,
            "q 6\n");
}

TEST_P(SessionTest, ContextFromAFile) {
  TempDir dir;
  const auto path = dir.path() + "/prompt.txt";
  std::ofstream(path) << "line one\nline two\n";
  SessionOptions options;
  options.context_file = path;
  auto session = open(options);
  EXPECT_EQ(session->execute("print(context.splitlines()[1])").stdout_data, "line two\n");
}

TEST_P(SessionTest, LlmQueryRoundTripsThroughTheEchoHandler) {
  auto session = open_with_llm(make_llm_handler("echo"));
  auto cell = session->execute("print(llm_query('ping'))");
  EXPECT_EQ(cell.status, CellStatus::ok) << dump(cell);
  EXPECT_EQ(cell.stdout_data, "echo: ping\n");
  EXPECT_EQ(cell.llm_calls, 1u);
}

TEST_P(SessionTest, LlmWaitingDoesNotCountAgainstTheCellsTime) {
  auto handler = std::make_shared<SlowHandler>(1500ms);
  auto session = open_with_llm(handler);
  auto cell = session->execute("print(llm_query('slow', model='m1'))", 1000ms);
  if (GetParam() == "local") {
    // No cgroup, so no CPU time to hold the cell to while it waits: the wall clock is never
    // paused (docs/sessions.md).
    EXPECT_EQ(cell.status, CellStatus::timeout) << dump(cell);
    return;
  }
  EXPECT_EQ(cell.status, CellStatus::ok) << dump(cell);
  EXPECT_EQ(cell.stdout_data, "answer to slow from m1\n");
  EXPECT_GE(cell.wall, 1500ms);
}

TEST_P(SessionTest, BatchedQueriesRunConcurrentlyAndFailOneByOne) {
  auto handler = std::make_shared<SlowHandler>(200ms);
  auto session = open_with_llm(limit_llm_handler(handler, {.concurrency = 8}));
  auto cell = session->execute(
      R"py(prompts = ['p%d' % i for i in range(19)]
prompts.insert(7, 'fail me')
answers = llm_query_batched(prompts)
texts = [a for a in answers if not a.startswith('Error: ')]
errors = [a for a in answers if a.startswith('Error: ')]
print(len(answers), len(texts), errors, answers[8]))py");
  EXPECT_EQ(cell.status, CellStatus::ok) << dump(cell);
  EXPECT_EQ(cell.stdout_data, "20 19 ['Error: the model refused'] answer to p7 from ?\n");
  EXPECT_EQ(cell.llm_calls, 20u);
  EXPECT_GT(handler->peak(), 1);
  EXPECT_LE(handler->peak(), 8);
  EXPECT_LT(cell.wall, 20 * 200ms) << "the batch ran one call at a time";
}

TEST_P(SessionTest, FinalAndFinalVarSetTheAnswer) {
  auto session = open();
  auto final_var = session->execute("answer = {'n': 42}\nFINAL_VAR('answer')");
  ASSERT_TRUE(final_var.final.has_value()) << dump(final_var);
  EXPECT_EQ(*final_var.final, nlohmann::json({{"n", 42}}));
  auto final = session->execute("FINAL(3)");
  ASSERT_TRUE(final.final.has_value());
  EXPECT_EQ(*final.final, 3);
  EXPECT_FALSE(session->execute("x = 1").final.has_value());
  auto missing = session->execute("FINAL_VAR('nope')");
  EXPECT_EQ(missing.status, CellStatus::error);
  EXPECT_NE(missing.error.find("nope"), std::string::npos);
}

TEST_P(SessionTest, ATimedOutCellIsRolledBackAndTheStateBeforeItSurvives) {
  auto session = open();
  ASSERT_EQ(session->execute("kept = 'before'").status, CellStatus::ok);
  const auto start = Clock::now();
  auto spin = session->execute("kept = 'during'\nwhile True: pass", 1000ms);
  const auto took = Clock::now() - start;
  EXPECT_EQ(spin.status, CellStatus::timeout) << dump(spin);
  EXPECT_TRUE(spin.rolled_back);
  // The loop never ends on its own; the margin is for the kill and the rollback on a loaded
  // machine, more under a sanitizer (where the host's side runs several times slower).
#ifdef RLM_TEST_SANITIZED
  EXPECT_LT(took, 3000ms);
#else
  EXPECT_LT(took, 1500ms);
#endif
  EXPECT_EQ(session->execute("print(kept)").stdout_data, "before\n");
}

TEST_P(SessionTest, AnInterpreterThatDiesIsRolledBack) {
  auto session = open();
  session->execute("kept = 7");
  auto exited = session->execute("import os\nkept = 8\nos._exit(3)");
  EXPECT_EQ(exited.status, CellStatus::crashed) << dump(exited);
  EXPECT_TRUE(exited.rolled_back);
  EXPECT_NE(exited.error.find("code 3"), std::string::npos) << exited.error;
  auto killed = session->execute("import os, signal\nos.kill(os.getpid(), signal.SIGSEGV)");
  EXPECT_EQ(killed.status, CellStatus::crashed) << dump(killed);
  EXPECT_NE(killed.error.find("SIGSEGV"), std::string::npos) << killed.error;
  EXPECT_EQ(session->execute("kept").stdout_data, "7\n");
}

TEST_P(SessionTest, SnapshotsCanBeRestoredMoreThanOnce) {
  auto session = open();
  session->execute("n = 1");
  const auto snapshot = session->snapshot();
  session->execute("n = 2");
  EXPECT_EQ(session->execute("n").stdout_data, "2\n");
  session->restore(snapshot);
  EXPECT_EQ(session->execute("n").stdout_data, "1\n");
  session->execute("n = 3");
  session->restore(snapshot);
  EXPECT_EQ(session->execute("n").stdout_data, "1\n");
  EXPECT_THROW(session->restore(snapshot + 100), Error);
}

TEST_P(SessionTest, OutputIsCapturedPerCellAndCapped) {
  policy_.limits.output_bytes = 1000;
  auto session = open();
  auto flood =
      session->execute("print('x' * 5000)\nimport os\nos.system('echo from a subprocess')");
  EXPECT_EQ(flood.status, CellStatus::ok) << dump(flood);
  EXPECT_EQ(flood.stdout_data.size(), 1000u);
  EXPECT_TRUE(flood.stdout_truncated);
  auto quiet = session->execute("import sys\nprint('to stderr', file=sys.stderr)");
  EXPECT_EQ(quiet.stdout_data, "");
  EXPECT_EQ(quiet.stderr_data, "to stderr\n");
}

// What the sandbox writes on the control channel cannot hurt the host or another session: the
// session that did it ends with a clear error, and later calls say it is over.
TEST_P(SessionTest, GarbageOnTheChannelEndsOnlyThatSession) {
  auto bystander = open();
  bystander->execute("alive = True");
  const std::string channel = "llm_query.__globals__['SESSION'].channel.sock.fileno()";
  const std::vector<std::pair<std::string, std::string>> attacks = {
      {"import os\nos.write(" + channel + ", b'\\x00\\x00\\x00\\x05hello')", "not valid JSON"},
      {"import os\nos.write(" + channel + ", b'\\x7f\\xff\\xff\\xff' + b'x' * 100)",
       "over the limit"},
      {"import os, json\nbody = json.dumps({'type': 'hello', 'token': 'guess'}).encode()\n"
       "os.write(" +
           channel + ", len(body).to_bytes(4, 'big') + body)",
       "unexpected frame"},
  };
  for (const auto& [attack, expected] : attacks) {
    auto session = open();
    auto cell = session->execute(attack + "\nimport time\ntime.sleep(5)");
    EXPECT_EQ(cell.status, CellStatus::session_error) << dump(cell);
    EXPECT_NE(cell.error.find(expected), std::string::npos) << cell.error;
    EXPECT_NE(session->ended(), "");
    EXPECT_THROW(session->execute("1"), Error);
    session->close();
  }
  EXPECT_EQ(bystander->execute("print(alive)").stdout_data, "True\n");
}

TEST_P(SessionTest, CloseLeavesNothingBehind) {
  const auto fds = open_fd_count();
  const auto cgroups = own_cgroup_dirs();
  const std::string mark = "session-test-" + std::to_string(getpid());
  policy_.env.set["RLM_TEST_MARK"] = mark;
  {
    auto session = open();
    session->execute("import subprocess\np = subprocess.Popen(['sleep', '60'])");
    EXPECT_GE(processes_with_environment("RLM_TEST_MARK=" + mark).size(), 3u);
    session->snapshot();
    auto result = session->close();
    EXPECT_EQ(result.backend, GetParam());
  }
  EXPECT_EQ(open_fd_count(), fds);
  EXPECT_TRUE(children_of_this_process().empty());
  EXPECT_EQ(own_cgroup_dirs(), cgroups);
  EXPECT_TRUE(processes_with_environment("RLM_TEST_MARK=" + mark).empty());
}

INSTANTIATE_TEST_SUITE_P(Backends, SessionTest, ::testing::Values("namespace", "local"),
                         [](const auto& info) { return info.param; });

// Session::kill from another thread (a server's `kill`): the sandbox ends now, not when the cell's
// wall time would have; the cell in progress and every later call say why; nothing is left.
TEST(NamespaceSession, KillFromAnotherThreadEndsTheCellAtOnceSayingWhy) {
  Policy policy = repl_policy();
  policy.limits.wall_time = std::chrono::seconds(120);
  auto backend = make_backend("namespace");
  const auto cgroups = own_cgroup_dirs();
  auto session = backend->open_session(policy, {});
  std::atomic<bool> started{false};
  CellResult cell;
  std::thread runner([&] {
    started = true;
    cell = session->execute("import os\nprint(os.getpid(), flush=True)\nwhile True: pass");
  });
  while (!started) std::this_thread::sleep_for(std::chrono::milliseconds(10));
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  const auto killed_at = std::chrono::steady_clock::now();
  session->kill("stopped by the test");
  session->kill("a second kill is ignored");
  runner.join();
  EXPECT_LT(std::chrono::steady_clock::now() - killed_at, std::chrono::seconds(30))
      << "the cell ran on after the kill";
  EXPECT_EQ(cell.status, CellStatus::session_error) << cell.to_json().dump();
  EXPECT_NE(cell.error.find("stopped by the test"), std::string::npos) << cell.error;
  EXPECT_NE(session->ended().find("stopped by the test"), std::string::npos) << session->ended();
  try {
    const auto later = session->execute("1");
    EXPECT_NE(later.status, CellStatus::ok);
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("stopped by the test"), std::string::npos)
        << error.what();
  }
  session->close();
  session.reset();
  EXPECT_EQ(own_cgroup_dirs(), cgroups);
}

// The cgroup's OOM kill is told apart from other deaths: memory_limit, rolled back.
TEST(NamespaceSession, AMemoryBalloonIsRolledBackAsMemoryLimit) {
  Policy policy = repl_policy();
  policy.limits.memory_bytes = 128u << 20;
  auto backend = make_backend("namespace");
  auto session = backend->open_session(policy, {});
  session->execute("kept = list(range(10))");
  auto balloon = session->execute("b = bytearray(1 << 30)\nb[::4096] = b'x' * (len(b) // 4096)");
  EXPECT_EQ(balloon.status, CellStatus::memory_limit) << balloon.to_json().dump();
  EXPECT_TRUE(balloon.rolled_back);
  EXPECT_EQ(session->execute("print(sum(kept))").stdout_data, "45\n");
}

// The session's sandbox is one process budget for every cell: a cell that starts more threads
// than it allows (as 200 llm_query threads did) gets the refusal, and the session goes on. Before,
// the runtime stopped the whole sandbox at its process limit and the session ended with "the
// checkpoint interpreter is gone".
TEST(NamespaceSession, ACellAtTheProcessLimitFailsAloneAndTheSessionGoesOn) {
  Policy policy = repl_policy();
  policy.limits.pids = 32;
  auto backend = make_backend("namespace");
  auto session = backend->open_session(policy, {});
  ASSERT_EQ(session->execute("kept = 'before'").status, CellStatus::ok);
  auto flood = session->execute(R"py(import threading
gate = threading.Event()
started = []
try:
    for _ in range(200):
        t = threading.Thread(target=gate.wait)
        t.start()
        started.append(t)
finally:
    gate.set()
    for t in started: t.join())py");
  EXPECT_EQ(flood.status, CellStatus::error) << flood.to_json().dump();
  EXPECT_NE(flood.error.find("can't start new thread"), std::string::npos) << flood.error;
  EXPECT_EQ(session->execute("print(kept)").stdout_data, "before\n");
  auto after = session->execute(
      "t = threading.Thread(target=print, args=('a thread again',))\nt.start()\nt.join()");
  EXPECT_EQ(after.stdout_data, "a thread again\n") << after.to_json().dump();
}

TEST(NamespaceSession, TheSandboxHasNoNetworkAndNoHostFiles) {
  auto backend = make_backend("namespace");
  auto session = backend->open_session(repl_policy(), {});
  auto probe = session->execute(
      R"py(import socket, os
try:
    socket.create_connection(('1.1.1.1', 53), timeout=1)
    print('connected')
except OSError as e:
    print('no network')
print(os.path.exists('/root'), os.listdir('/proc').count('1')))py");
  EXPECT_EQ(probe.stdout_data, "no network\nFalse 1\n") << probe.to_json().dump();
}

TEST(SessionOptionsTest, ATimeoutAboveThePolicyIsRefused) {
  auto backend = make_backend("namespace");
  Policy policy = repl_policy();
  auto session = backend->open_session(policy, {});
  EXPECT_THROW(session->execute("1", policy.limits.wall_time + 1s), Error);
}

TEST(SessionOptionsTest, AMissingContextFileIsAClearError) {
  auto backend = make_backend("namespace");
  SessionOptions options;
  options.context_file = "/nonexistent/prompt.txt";
  try {
    backend->open_session(repl_policy(), options);
    FAIL() << "opened";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("/nonexistent/prompt.txt"), std::string::npos);
  }
}

}  // namespace
}  // namespace rlm::test
