// The host side of a session against a hostile cell (issue 11, lines 1-4 and 6): code in a cell of
// a real namespace-backend session writes to its own control channel what the worker never would,
// and the host process running the session (this test process) must hold: no crash, no unbounded
// memory or fds, no blocking, and the cell's time limit kept. Each attack runs under the
// `python-repl` and the `strict` policy; a second session runs a cell meanwhile.
#include <gtest/gtest.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <functional>
#include <mutex>
#include <optional>
#include <string>
#include <thread>
#include <vector>

#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/client.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/llm.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/session.hpp"
#include "support/host_probes.hpp"
#include "support/server_process.hpp"

namespace rlm::test {
namespace {

using namespace std::chrono_literals;
using Clock = std::chrono::steady_clock;

std::string dump(const CellResult& cell) {
  auto shown = cell.to_json();
  for (const char* key : {"stdout", "stderr", "error"})
    if (shown[key].is_string() && shown[key].get<std::string>().size() > 2000)
      shown[key] = shown[key].get<std::string>().substr(0, 2000) + "...";
  auto text = shown.dump();
  return text.size() > 6000 ? text.substr(0, 6000) + "..." : text;
}

// Cell code: the channel's socket as the worker holds it, raw frames onto it, and the id of the
// running cell (found in the worker's own frames), so the cell can speak for the worker.
const std::string kPrelude = R"(
import errno, json, os, socket, sys, time
_sock = llm_query.__globals__['SESSION'].channel.sock
def raw(body):
    _sock.sendall(len(body).to_bytes(4, 'big') + body)
def cell_id():
    f = sys._getframe()
    while 'op_id' not in f.f_locals:
        f = f.f_back
    return f.f_locals['op_id']
)";

// An LM that answers after a delay, each call on a thread of its own, with a short text.
class SlowLm final : public LlmHandler {
 public:
  explicit SlowLm(std::chrono::milliseconds delay) : delay_(delay) {}
  ~SlowLm() override {
    std::lock_guard lock(mutex_);
    for (auto& thread : threads_) thread.join();
  }
  void answer(LlmCall call, std::function<void(LlmAnswer)> done) override {
    ++calls_;
    std::lock_guard lock(mutex_);
    threads_.emplace_back([this, call = std::move(call), done = std::move(done)] {
      std::this_thread::sleep_for(delay_);
      done(LlmAnswer::of_text("slow answer"));
    });
  }
  int calls() const { return calls_; }

 private:
  std::chrono::milliseconds delay_;
  std::mutex mutex_;
  std::vector<std::thread> threads_;
  std::atomic<int> calls_{0};
};

std::uint64_t status_kib(const char* field) {
  std::ifstream status("/proc/self/status");
  std::string line;
  const std::string prefix = std::string(field) + ":";
  while (std::getline(status, line))
    if (line.rfind(prefix, 0) == 0) return std::stoull(line.substr(prefix.size()));
  return 0;
}

// This process's memory and fds while an attack runs: the peak RSS (VmHWM, reset at the start)
// and the largest fd count seen (sampled every few milliseconds).
class HostMeter {
 public:
  HostMeter() : fds_at_start_(open_fd_count()) {
    std::ofstream("/proc/self/clear_refs") << "5";  // VmHWM := VmRSS
    rss_at_start_ = status_kib("VmRSS") << 10;
    sampler_ = std::thread([this] {
      while (!stop_) {
        const std::size_t now = open_fd_count();
        if (now > max_fds_) max_fds_ = now;
        std::this_thread::sleep_for(2ms);
      }
    });
  }
  ~HostMeter() { stop(); }
  void stop() {
    stop_ = true;
    if (sampler_.joinable()) sampler_.join();
  }
  std::uint64_t rss_growth() const {
    const std::uint64_t peak = status_kib("VmHWM") << 10;
    return peak > rss_at_start_ ? peak - rss_at_start_ : 0;
  }
  std::size_t fd_growth() const { return max_fds_ > fds_at_start_ ? max_fds_ - fds_at_start_ : 0; }

 private:
  std::size_t fds_at_start_;
  std::uint64_t rss_at_start_ = 0;
  std::atomic<bool> stop_{false};
  std::atomic<std::size_t> max_fds_{0};
  std::thread sampler_;
};

// The issue's bounds on the host under a flood. A sanitizer build carries shadow memory and
// redzones, so it is allowed more; its quarantine of freed memory (256 MiB by default, which the
// copies a flood of frames makes would fill) is kept small, so the bound still measures the
// session and not the sanitizer.
#ifdef RLM_TEST_SANITIZED
extern "C" const char* __asan_default_options() {
  return "quarantine_size_mb=16";
}
constexpr std::uint64_t kRssBound = 256u << 20;
#else
constexpr std::uint64_t kRssBound = 64u << 20;
#endif
// What a flood of frames relayed twice over TLS may add to a cell's end, on a machine whose two
// cores a CI build also uses (3.7 s once, with a margin of 1.5 s), and more under a sanitizer
// (7.8 s once, with 6 s): far below the cell's 100 s sleep, which a host that blocked on the
// sandbox would wait out.
// Locally the same flood crosses one socket; under a sanitizer on a loaded CI machine that
// still took 2.25 s once against a 1.5 s limit, so its margin too is seconds, not a timing claim.
#ifdef RLM_TEST_SANITIZED
constexpr auto kRemoteTrafficMargin = std::chrono::milliseconds(15000);
constexpr auto kLocalTrafficMargin = std::chrono::milliseconds(6000);
#else
constexpr auto kRemoteTrafficMargin = std::chrono::milliseconds(6000);
constexpr auto kLocalTrafficMargin = std::chrono::milliseconds(2500);
#endif
constexpr std::size_t kFdBound = 16;

// A hung host is this suite's failure, not a hang of the test run: after `limit` the process
// aborts saying what hung.
class Watchdog {
 public:
  Watchdog(std::string what, std::chrono::seconds limit)
      : thread_([this, what = std::move(what), limit] {
          std::unique_lock lock(mutex_);
          if (!done_cv_.wait_for(lock, limit, [this] { return done_; })) {
            std::fprintf(stderr, "watchdog: %s did not return within %llds\n", what.c_str(),
                         static_cast<long long>(limit.count()));
            std::abort();
          }
        }) {}
  ~Watchdog() {
    {
      std::lock_guard lock(mutex_);
      done_ = true;
    }
    done_cv_.notify_all();
    thread_.join();
  }

 private:
  std::mutex mutex_;
  std::condition_variable done_cv_;
  bool done_ = false;
  std::thread thread_;
};

// The same attacks on sessions of a real server reached through its TLS listener (a parameter
// ending "/tls"): the cell's frames cross the server's session host and then TLS, streamed to
// this process, whose bounds (HostMeter) are then the remote client's.
const ServerProcess& tls_server() {
  static const ServerProcess server(
      {"--session-pool", "python-repl=2", "--session-pool", "strict=2"}, std::chrono::seconds(60),
      TlsListenerSetup{::getuid(), 65534});
  return server;
}

class HostileCell : public ::testing::TestWithParam<std::string> {
 protected:
  void SetUp() override {
    std::string name = GetParam();
    const bool via_tls = name.ends_with("/tls");
    if (via_tls) name.resize(name.size() - 4);
    policy_ = load_policy(name);
    // Through a server the policy may only tighten the one offered (strict's is 5 s).
    policy_.limits.wall_time =
        via_tls ? std::min<std::chrono::milliseconds>(10s, policy_.limits.wall_time) : 10s;
    if (via_tls) {
      const ServerProcess& server = tls_server();
      backend_ =
          make_server_client(server.tls_endpoint(), std::nullopt,
                             TlsFiles{server.tls_file("alice.pem"), server.tls_file("alice.key"),
                                      server.tls_file("ca.pem")});
    } else {
      backend_ = make_backend("namespace");
    }
    ASSERT_TRUE(backend_);
  }

  std::unique_ptr<Session> open(std::shared_ptr<LlmHandler> llm = nullptr,
                                std::vector<ToolSpec> tools = {}) {
    SessionOptions options;
    options.llm = std::move(llm);
    options.tools = std::move(tools);
    return backend_->open_session(policy_, std::move(options));
  }

  // Runs `code` in `session` as the attack, while a second session runs a cell of its own; checks
  // the host's bounds and the bystander's result. Returns the attacked cell's result.
  CellResult attack(Session& session, const std::string& code, std::chrono::milliseconds limit) {
    auto bystander = open(make_llm_handler("echo"));
    EXPECT_EQ(bystander->execute("seen = []").status, CellStatus::ok);
    HostMeter meter;
    std::optional<CellResult> side;
    std::thread beside([&] {
      std::this_thread::sleep_for(limit / 3);
      side = bystander->execute("seen.append(llm_query('still here'))\nprint(seen, sum(range(10)))",
                                5s);
    });
    const auto start = Clock::now();
    CellResult cell;
    {
      Watchdog watchdog("the attacked cell", 60s);
      cell = session.execute(kPrelude + code, limit);
    }
    took_ = Clock::now() - start;
    beside.join();
    meter.stop();
    std::printf(
        "measured: the cell took %lld ms (limit %lld ms); the host grew by %.1f MiB and %zu fds\n",
        static_cast<long long>(
            std::chrono::duration_cast<std::chrono::milliseconds>(took_).count()),
        static_cast<long long>(limit.count()), static_cast<double>(meter.rss_growth()) / (1 << 20),
        meter.fd_growth());
    EXPECT_LT(meter.rss_growth(), kRssBound)
        << "the host grew by " << meter.rss_growth() << " bytes";
    EXPECT_LE(meter.fd_growth(), kFdBound) << "the host held " << meter.fd_growth() << " more fds";
    EXPECT_TRUE(side.has_value());
    if (side) {
      EXPECT_EQ(side->status, CellStatus::ok) << dump(*side);
      EXPECT_EQ(side->stdout_data, "['echo: still here'] 45\n") << dump(*side);
    }
    return cell;
  }

  Policy policy_;
  std::unique_ptr<Backend> backend_;
  Clock::duration took_{};
};

// Line 1: a frame nesting two million arrays, in a field the host copies, echoes or reports, or in
// a `final` value, is refused while it is parsed; the session that sent it ends and says why
// without quoting it.
TEST_P(HostileCell, DeeplyNestedFramesEndOnlyThatSession) {
  const std::string deep = "b'[' * 2_000_000 + b']' * 2_000_000";
  const std::vector<std::string> attacks = {
      "raw(b'{\"type\": \"hello\", \"x\": ' + " + deep + " + b'}')",
      "raw(b'{\"type\": \"llm_query\", \"id\": ' + " + deep +
          " + b', \"prompt\": \"p\", \"model\": null}')",
      "raw(b'{\"type\": \"cell_result\", \"id\": %d, \"status\": \"ok\", \"stdout\": \"\", "
      "\"stderr\": \"\", \"final\": {\"value\": ' % cell_id() + " +
          deep + " + b'}}')",
  };
  auto bystander = open();
  ASSERT_EQ(bystander->execute("alive = True").status, CellStatus::ok);
  for (const auto& attack : attacks) {
    auto session = open();
    auto cell = session->execute(kPrelude + attack + "\ntime.sleep(5)", 5000ms);
    EXPECT_EQ(cell.status, CellStatus::session_error) << dump(cell);
    EXPECT_NE(cell.error.find("nested deeper than 64 levels"), std::string::npos) << cell.error;
    EXPECT_LT(cell.error.size(), 300u) << cell.error.substr(0, 300);
    EXPECT_THROW(session->execute("1"), Error);
    session->close();
  }
  EXPECT_EQ(bystander->execute("print(alive)").stdout_data, "True\n");
  // What the worker sends itself stays within the bound: a deep FINAL value arrives as its repr.
  auto final = bystander->execute("v = 0\nfor _ in range(100): v = [v]\nFINAL(v)");
  EXPECT_EQ(final.status, CellStatus::ok) << dump(final);
  ASSERT_TRUE(final.final.has_value());
  EXPECT_EQ(*final.final, std::string(100, '[') + "0" + std::string(100, ']'));
}

// Line 1, every field that crosses: a field of another type than the protocol's, or a number out
// of range, is read as absent or clamped; nothing throws out of the host.
TEST_P(HostileCell, FieldsOfTheWrongTypeNeverThrowOnTheHost) {
  {
    auto session = open();
    auto cell = session->execute(kPrelude + "raw(b'{\"type\": 5}')\ntime.sleep(5)", 5000ms);
    EXPECT_EQ(cell.status, CellStatus::session_error) << dump(cell);
    EXPECT_NE(cell.error.find("unexpected frame"), std::string::npos) << cell.error;
  }
  {
    auto session = open();
    auto cell = session->execute(
        kPrelude +
            "raw(b'{\"type\": \"cell_result\", \"id\": %d, \"status\": [1], \"stdout\": 5, "
            "\"stderr\": {\"a\": 1}, \"stdout_truncated\": \"yes\", \"error\": 7, "
            "\"cpu_ms\": 1e308}' % cell_id())\ntime.sleep(5)",
        5000ms);
    EXPECT_EQ(cell.status, CellStatus::error) << dump(cell);
    EXPECT_EQ(cell.stdout_data, "");
    EXPECT_EQ(cell.stderr_data, "");
    EXPECT_FALSE(cell.stdout_truncated);
    EXPECT_LE(cell.cpu, std::chrono::microseconds(std::chrono::hours(24)));
  }
  {
    auto session = open();
    auto cell = session->execute(
        kPrelude +
            "raw(json.dumps({'type': 'llm_query', 'id': 'x' * 100, 'prompt': 'p'}).encode())\n"
            "time.sleep(5)",
        5000ms);
    EXPECT_EQ(cell.status, CellStatus::session_error) << dump(cell);
    EXPECT_NE(cell.error.find("without an integer id"), std::string::npos) << cell.error;
  }
}

// Line 2: forty 8 MiB llm_query frames while the LM takes its time. The host reads no more than
// the session's buffer (limits.session_buffer_bytes) holds, the cell is held back, and its clock
// runs while it is.
TEST_P(HostileCell, LargeQueriesFloodingASlowLmStayWithinTheSessionBuffer) {
  auto lm = std::make_shared<SlowLm>(3000ms);
  auto session = open(lm);
  auto cell = attack(*session,
                     R"py(filler = b'x' * (8 << 20)
for i in range(40):
    raw(b'{"type": "llm_query", "id": %d, "prompt": "' % (10**6 + i) + filler + b'", "model": null}')
while True: pass)py",
                     1500ms);
  EXPECT_EQ(cell.status, CellStatus::timeout) << dump(cell);
  // Over TLS the buffered prompts cross two relays first (2.004 s once under a sanitizer).
  EXPECT_LT(took_,
            1500ms + (GetParam().ends_with("/tls") ? kRemoteTrafficMargin : kLocalTrafficMargin));
  EXPECT_LE(lm->calls(), 4) << "more prompts reached the LM than the buffer holds";
  EXPECT_EQ(session->execute("print('after')").stdout_data, "after\n");
}

// Bulk frames (raw bytes the next JSON frame takes as strings): a flood of them that never
// announces its frame is held only up to the frame cap, then ends that session; so does a bulk
// string that is not UTF-8. Large prompts the worker sends as bulk frames arrive whole.
TEST_P(HostileCell, BulkFramesAreBoundedByTheFrameCapAndChecked) {
  {
    auto session = open(make_llm_handler("echo"));
    auto cell = attack(*session,
                       R"py(chunk = b'z' * (1 << 20)
def bulk(body):
    _sock.sendall((len(body) | 0x80000000).to_bytes(4, 'big') + body)
for i in range(64):
    bulk(chunk)
time.sleep(100))py",
                       3000ms);
    EXPECT_EQ(cell.status, CellStatus::session_error) << dump(cell);
    EXPECT_NE(cell.error.find("over the limit of"), std::string::npos) << cell.error;
  }
  {
    auto session = open(make_llm_handler("echo"));
    auto cell = session->execute(kPrelude + R"py(
body = b'ok \xed\xa0\x80'
_sock.sendall((len(body) | 0x80000000).to_bytes(4, 'big') + body)
raw(b'{"type": "llm_query", "id": 99, "bulk": 1, "prompt": {"$bulk": 0}, "model": null}')
time.sleep(5))py",
                                 5000ms);
    EXPECT_EQ(cell.status, CellStatus::session_error) << dump(cell);
    EXPECT_NE(cell.error.find("not UTF-8"), std::string::npos) << cell.error;
  }
  auto session = open(make_llm_handler("echo"));
  auto cell = session->execute(R"py(p = 'caf\u00e9 ' * 100000 + '\udc80'
a = llm_query(p)
print(len(p), len(a), a == 'echo: ' + p[:-1] + '?')
q = ''.join(chr(32 + i % 95) for i in range(300000))  # ASCII: sent from the str's own bytes
print(llm_query_batched([q, 'short', q[::-1]]) == ['echo: ' + q, 'echo: short', 'echo: ' + q[::-1]]))py");
  EXPECT_EQ(cell.status, CellStatus::ok) << dump(cell);
  EXPECT_EQ(cell.stdout_data, "500001 500007 True\nTrue\n") << dump(cell);
}

// Line 3: 700 llm_query frames whose replies the cell never reads. The host queues the replies
// (within the buffer), never blocks on the sandbox, and ends the cell at its limit.
TEST_P(HostileCell, ACellThatNeverReadsItsRepliesStillTimesOut) {
  auto session = open(make_llm_handler("echo"));
  auto cell = attack(*session,
                     R"py(filler = b'y' * 32768
for i in range(700):
    raw(b'{"type": "llm_query", "id": %d, "prompt": "' % (10**6 + i) + filler + b'", "model": null}')
time.sleep(100))py",
                     1500ms);
  EXPECT_EQ(cell.status, CellStatus::timeout) << dump(cell);
  // Through a server over TLS the 700 queries (22 MiB) cross to this process and their answers
  // back, each frame relayed twice; the cell's result comes after that traffic, in order (and a
  // sanitizer build parses each frame several times slower).
  EXPECT_LT(took_,
            1500ms + (GetParam().ends_with("/tls") ? kRemoteTrafficMargin : kLocalTrafficMargin));
  EXPECT_EQ(session->execute("print('after')").stdout_data, "after\n");
}

// Line 4: a frame sent one byte at a time with four SCM_RIGHTS fds on each byte. The host closes
// them as they come, and the next fork frame's own fd (not an injected one) becomes the standby.
TEST_P(HostileCell, FdsOnAnyFrameButForkAreClosedAtOnce) {
  auto session = open(make_llm_handler("echo"));
  auto cell = attack(*session,
                     R"py(import array
mine, theirs = socket.socketpair()
fds = array.array('i', [theirs.fileno()] * 4)
body = b'{"type": "llm_query", "id": 999999, "prompt": "' + b'z' * 3000 + b'", "model": null}'
data = len(body).to_bytes(4, 'big') + body
for i in range(len(data)):
    while True:
        try:
            _sock.sendmsg([data[i:i + 1]], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            break
        except OSError as e:
            if e.errno != errno.ETOOMANYREFS: raise
            time.sleep(0.001)
marker = 'kept')py",
                     5000ms);
  EXPECT_EQ(cell.status, CellStatus::ok) << dump(cell);
  auto next = session->execute("print(marker)", 3000ms);
  EXPECT_EQ(next.status, CellStatus::ok) << dump(next);
  EXPECT_EQ(next.stdout_data, "kept\n");
}

// Line 4: one fd, alone, on the first byte of each of 2,000 frames. The host reads many frames
// before it takes them; it must not hold an fd for each (it held 128 at once).
TEST_P(HostileCell, OneFdOnTheFirstByteOfEveryFrameIsNotHeld) {
  auto session = open(make_llm_handler("echo"));
  auto cell = attack(*session,
                     R"py(import array
mine, theirs = socket.socketpair()
fds = array.array('i', [theirs.fileno()])
for i in range(2000):
    body = json.dumps({'type': 'llm_query', 'id': 10**6 + i, 'prompt': 'p', 'model': None}).encode()
    while True:
        try:
            _sock.sendmsg([len(body).to_bytes(4, 'big')], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, fds)])
            break
        except OSError as e:
            if e.errno != errno.ETOOMANYREFS: raise
            time.sleep(0.001)
    _sock.sendall(body)
time.sleep(100))py",
                     3000ms);
  EXPECT_EQ(cell.status, CellStatus::timeout) << dump(cell);
  EXPECT_EQ(session->execute("print('after')").stdout_data, "after\n");
}

// Line 4: a fork frame (here forged by the cell, after a forged result) must carry a unix stream
// socket; a pipe ends the session instead of becoming a channel.
TEST_P(HostileCell, AForkFrameFdMustBeAUnixStreamSocket) {
  auto session = open();
  auto cell = session->execute(kPrelude +
                                   R"py(r, w = os.pipe()
raw(json.dumps({'type': 'cell_result', 'id': cell_id(), 'status': 'ok', 'stdout': '', 'stderr': ''}).encode())
body = json.dumps({'type': 'fork', 'id': 0, 'pid': 1}).encode()
_sock.sendmsg([len(body).to_bytes(4, 'big')], [(socket.SOL_SOCKET, socket.SCM_RIGHTS, bytes(memoryview(__import__('array').array('i', [r]))))])
_sock.sendall(body)
time.sleep(5))py",
                               5000ms);
  EXPECT_EQ(cell.status, CellStatus::ok) << dump(cell);
  try {
    session->execute("1", 3000ms);
    ADD_FAILURE() << "a pipe became the standby's channel";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("not a unix stream socket"), std::string::npos)
        << error.what();
  }
}

// Line 6: while llm_query calls are open the wall clock is paused, but CPU time used by the cell's
// other processes counts: two burners and four 2 s calls under a 1 s limit end `timeout` long
// before the calls could all be answered.
TEST_P(HostileCell, CpuUsedWhileWaitingForTheLmCounts) {
  auto session = open(std::make_shared<SlowLm>(2000ms));
  const auto start = Clock::now();
  auto cell = session->execute(
      R"py(import subprocess, sys
burners = [subprocess.Popen([sys.executable, '-c', 'while True: pass']) for _ in range(2)]
for _ in range(4):
    llm_query('slow')
print('finished'))py",
      1000ms);
  const auto took = Clock::now() - start;
  EXPECT_EQ(cell.status, CellStatus::timeout) << dump(cell);
  EXPECT_LT(took, 6000ms);
  // And a cell that only waits is not charged for the wait.
  auto waits = session->execute("print(llm_query('slow'))", 1000ms);
  EXPECT_EQ(waits.status, CellStatus::ok) << dump(waits);
  EXPECT_EQ(waits.stdout_data, "slow answer\n");
}

// Line 2, the parsed frame (last: the 15 MiB frames leave the heap of this process larger, and
// the flood tests above measure its growth): a frame within the size cap whose JSON holds millions
// of tiny values
// (`{}`, `[]`, `""`, `0`) costs the host far more as a parsed value than as bytes (a 15 MiB frame
// of empty objects parsed to over 1 GiB). The host refuses a frame with more values than it takes,
// in a `final` value or any other field, and stays within its bound; the worker sends a legitimate
// FINAL with that many values as its repr().
TEST_P(HostileCell, AFrameOfManyTinyValuesCannotBloatTheHost) {
  const std::vector<std::string> attacks = {
      "raw(b'{\"type\": \"cell_result\", \"id\": %d, \"status\": \"ok\", \"stdout\": \"\", "
      "\"stderr\": \"\", \"final\": {\"value\": [' % cell_id() + b'{},' * 4_999_999 + b'{}' + "
      "b']}}')\ntime.sleep(100)",
      "raw(b'{\"type\": \"llm_query\", \"id\": 5, \"prompt\": \"p\", \"model\": null, \"x\": [' + "
      "b'[],' * 4_999_999 + b'[]]}')\ntime.sleep(100)",
  };
  for (const auto& code : attacks) {
    auto session = open(make_llm_handler("echo"));
    auto cell = attack(*session, code, 5000ms);
    EXPECT_EQ(cell.status, CellStatus::session_error) << dump(cell);
    EXPECT_NE(cell.error.find("values"), std::string::npos) << cell.error;
    EXPECT_LT(cell.error.size(), 300u) << cell.error.substr(0, 300);
    EXPECT_FALSE(cell.final.has_value());
  }
  auto session = open();
  auto many = session->execute("FINAL(list(range(300_000)))", 5000ms);
  EXPECT_EQ(many.status, CellStatus::ok) << dump(many);
  ASSERT_TRUE(many.final.has_value());
  ASSERT_TRUE(many.final->is_string()) << "a FINAL with more values than the host takes";
  EXPECT_EQ(many.final->get<std::string>().substr(0, 10), "[0, 1, 2, ");
  auto few = session->execute("FINAL(list(range(1000)))", 5000ms);
  ASSERT_TRUE(few.final.has_value());
  EXPECT_TRUE(few.final->is_array());
}

// The cell's own reading of the host's reply to a frame it sent raw (the worker reads the channel
// only while one of its own queries waits).
const std::string kReply = R"(
import select
def _exactly(n):
    data = b''
    while len(data) < n:
        select.select([_sock], [], [], 5)
        chunk = _sock.recv(n - len(data))
        if not chunk:
            raise EOFError
        data += chunk
    return data
def reply():
    return json.loads(_exactly(int.from_bytes(_exactly(4), 'big')))
def ask(**frame):
    raw(json.dumps(dict(type='llm_query', model=None, **frame)).encode())
    return reply()
def show(r):
    print(r['op'], r['id'], r.get('text', r.get('items')), r.get('error'))
)";

// Records every call it is given and answers with `answer(call)`.
class RecordingLm final : public LlmHandler {
 public:
  explicit RecordingLm(std::function<LlmAnswer(const LlmCall&)> answer)
      : answer_(std::move(answer)) {}
  void answer(LlmCall call, std::function<void(LlmAnswer)> done) override {
    auto answer = answer_(call);
    {
      std::lock_guard lock(mutex_);
      calls_.push_back(std::move(call));
    }
    done(std::move(answer));
  }
  std::vector<LlmCall> calls() {
    std::lock_guard lock(mutex_);
    return calls_;
  }

 private:
  std::function<LlmAnswer(const LlmCall&)> answer_;
  std::mutex mutex_;
  std::vector<LlmCall> calls_;
};

// Issue 13: a call of a tool the session does not have (or has as a value) is answered with an
// error and never reaches the handler; a registered tool's call reaches it with its kind, name and
// arguments as JSON, and an answer that is not JSON comes back as an error; the session goes on.
TEST_P(HostileCell, ToolCallsTheSessionDoesNotOfferAreAnsweredWithAnError) {
  auto lm = std::make_shared<RecordingLm>([](const LlmCall& call) {
    return LlmAnswer::of_text(call.prompt.find("bad") != std::string::npos ? "not json" : "[7]");
  });
  auto session = open(
      lm, {{"lookup", "finds things", std::nullopt}, {"limits", "", nlohmann::json{{"max", 3}}}});
  auto cell = attack(*session, kReply + R"py(
tool = lambda name, *args, **kwargs: ask(id=900 + len(name), kind='tool', tool=name,
                                          prompt={'args': list(args), 'kwargs': kwargs})
show(tool('nope'))
show(tool('limits'))
show(tool('x' * 100000))
show(tool('lookup', 1, 'two', a={'b': None}))
show(tool('lookup', 'bad'))
)py",
                     5000ms);
  EXPECT_EQ(cell.status, CellStatus::ok) << dump(cell);
  EXPECT_EQ(cell.stdout_data,
            "llm_result 904 None this session has no tool named 'nope'\n"
            "llm_result 906 None tool 'limits' is a value, not a function\n"
            "llm_result 100900 None this session has no tool named '" +
                std::string(64, 'x') +
                "...'\n"
                "llm_result 906 [7] None\n"
                "llm_result 906 None the tool's answer is not JSON text\n");
  const auto calls = lm->calls();
  ASSERT_EQ(calls.size(), 2u) << "an unoffered tool reached the handler";
  EXPECT_EQ(calls[0].kind, CallKind::tool);
  EXPECT_EQ(calls[0].tool, "lookup");
  EXPECT_TRUE(calls[0].prompt_is_json);
  EXPECT_EQ(nlohmann::json::parse(calls[0].prompt),
            nlohmann::json::parse(R"({"args": [1, "two"], "kwargs": {"a": {"b": null}}})"));
  EXPECT_FALSE(calls[0].model.has_value());
  EXPECT_EQ(session->execute("print('still on')").stdout_data, "still on\n");
}

// Issue 13: a message-list prompt reaches the handler as its JSON text with only role and content
// kept, and the kind (llm or rlm) as the frame says.
TEST_P(HostileCell, MessageListPromptsReachTheHandlerAsCheckedJson) {
  auto lm = std::make_shared<RecordingLm>([](const LlmCall&) { return LlmAnswer::of_text("ok"); });
  auto session = open(lm);
  auto cell = session->execute(kPrelude + kReply + R"py(
show(ask(id=1, kind='rlm', prompt=[{'role': 'user', 'content': 'hi', 'extra': [1, 2]}]))
raw(json.dumps({'type': 'llm_query_batched', 'id': 2, 'model': 'm', 'kind': 'llm',
                'prompts': ['plain', [{'role': 'system', 'content': 's'}]]}).encode())
show(reply())
)py",
                               5000ms);
  EXPECT_EQ(cell.status, CellStatus::ok) << dump(cell);
  EXPECT_EQ(cell.stdout_data,
            "llm_result 1 ok None\nllm_results 2 [{'text': 'ok'}, {'text': 'ok'}] None\n");
  auto calls = lm->calls();
  ASSERT_EQ(calls.size(), 3u);
  EXPECT_EQ(calls[0].kind, CallKind::rlm);
  EXPECT_TRUE(calls[0].prompt_is_json);
  EXPECT_EQ(calls[0].prompt, R"([{"content":"hi","role":"user"}])");
  std::sort(calls.begin() + 1, calls.end(),
            [](const auto& a, const auto& b) { return a.prompt < b.prompt; });
  EXPECT_EQ(calls[1].prompt, R"([{"content":"s","role":"system"}])");
  EXPECT_TRUE(calls[1].prompt_is_json);
  EXPECT_EQ(calls[2].prompt, "plain");
  EXPECT_FALSE(calls[2].prompt_is_json);
  EXPECT_EQ(calls[2].kind, CallKind::llm);
  EXPECT_EQ(calls[2].model, "m");
}

// Issue 13: a call frame of the wrong shape -- a kind that is no string or unknown, a message
// that is not {role, content} strings, a message list nested past the frame bound or longer than
// 10,000 messages, a tool call without a name or with arguments of another shape, a batch of tool
// calls -- ends only that session, saying what was wrong without quoting it.
TEST_P(HostileCell, MalformedCallFramesEndOnlyThatSession) {
  const std::vector<std::pair<std::string, std::string>> attacks = {
      {"ask(id=1, kind=5, prompt='p')", "kind is not a string"},
      {"ask(id=1, kind='bogus' * 1000, prompt='p')", "of an unknown kind"},
      {"ask(id=1, prompt=[{'role': 'user', 'content': 5}])", "a message that is not"},
      {"ask(id=1, prompt=[{'role': 'user', 'content': 'c'}] * 10001)", "over the limit of 10000"},
      {"raw(b'{\"type\": \"llm_query\", \"id\": 1, \"prompt\": ' + b'[' * 2_000_000 + "
       "b']' * 2_000_000 + b'}')",
       "nested deeper than 64 levels"},
      {"ask(id=1, prompt=5)", "no string or list"},
      {"ask(id=1, kind='tool', prompt={'args': [], 'kwargs': {}})", "without a tool name"},
      {"ask(id=1, kind='tool', tool='lookup', prompt={'args': {}, 'kwargs': {}})",
       "prompt is not {\"args\""},
      {"raw(json.dumps({'type': 'llm_query_batched', 'id': 1, 'kind': 'tool', 'prompts': []})"
       ".encode())",
       "of an unknown kind"},
  };
  auto bystander = open();
  ASSERT_EQ(bystander->execute("alive = True").status, CellStatus::ok);
  for (const auto& [code, says] : attacks) {
    auto session = open(make_llm_handler("echo"), {{"lookup", "", std::nullopt}});
    auto cell = session->execute(kPrelude + kReply + code + "\ntime.sleep(5)", 5000ms);
    EXPECT_EQ(cell.status, CellStatus::session_error) << code << ": " << dump(cell);
    EXPECT_NE(cell.error.find(says), std::string::npos) << code << ": " << cell.error;
    EXPECT_LT(cell.error.size(), 300u) << cell.error.substr(0, 300);
    EXPECT_THROW(session->execute("1"), Error);
  }
  EXPECT_EQ(bystander->execute("print(alive)").stdout_data, "True\n");
}

INSTANTIATE_TEST_SUITE_P(Policies, HostileCell,
                         ::testing::Values("python-repl", "strict", "python-repl/tls",
                                           "strict/tls"),
                         [](const auto& info) {
                           std::string name = info.param;
                           for (char& c : name)
                             if (c == '-' || c == '/') c = '_';
                           return name;
                         });

}  // namespace
}  // namespace rlm::test
