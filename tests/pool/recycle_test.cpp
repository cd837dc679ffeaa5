// Recycled sandboxes (PoolOptions::recycle, docs/pools-and-server.md#recycled-sandboxes) against
// the real kernel: the leak suite. For every item of the per-sandbox state list a test leaves it
// behind in one run and looks for it in the next run of the same recycled sandbox -- a pool of
// one, so the next run is that sandbox, and the pool's `recycled` count says it was -- through
// rlm::Pool and through `rlm-sandbox serve --pool default=1,recycle=N` (the /Pool and /Server
// instantiations).
#include <gtest/gtest.h>
#include <unistd.h>

#include <thread>

#include "../namespace/namespace_backend_test_util.hpp"
#include "rlm_sandbox/client.hpp"
#include "rlm_sandbox/pool.hpp"
#include "support/server_process.hpp"

namespace rlm::test {
namespace {

using Clock = std::chrono::steady_clock;

bool recycling_here() {
  if (geteuid() != 0) return false;
  const auto health = ns::make_namespace_backend()->health();
  const auto& enforced = health.enforced;
  return std::find(enforced.begin(), enforced.end(), "limits.pids") != enforced.end();
}

struct Counts {
  std::uint64_t recycled = 0, cold = 0;
  std::size_t ready = 0;
};

class RecycledBase : public ::testing::Test {
 protected:
  void start(const std::string& through) {
    if (!recycling_here())
      GTEST_SKIP() << "recycling needs a root runtime with cgroups (recycle_problem); this "
                      "process is not root or the host gives no cgroup";
    if (through == "pool")
      pool_ = std::make_unique<Pool>(ns_policy(), PoolOptions{.sandboxes = 1, .recycle = 1000});
    else
      server_ = std::make_unique<ServerProcess>(
          std::vector<std::string>{"--pool", "default=1,recycle=1000"});
  }

  Counts counts() {
    Counts counts;
    if (pool_) {
      const auto stats = pool_->stats();
      counts = {stats.recycled, stats.cold_runs, stats.ready_sandboxes};
    } else {
      const auto pool = ServerConnection(server_->socket()).hello()["pools"]["default"];
      counts = {pool.value("recycled", 0ul), pool.value("cold_runs", 0ul),
                pool.value("ready_sandboxes", 0ul)};
    }
    return counts;
  }

  // Waits (up to 30 s, a loaded machine) until the one sandbox is ready again after `runs_` runs,
  // recycled runs_ - 1 times.
  void wait_ready() {
    const auto until = Clock::now() + 30s;
    for (;;) {
      const auto now = counts();
      if (now.ready >= 1 && now.recycled + 1 >= runs_) return;
      ASSERT_LT(Clock::now(), until) << "the sandbox was not recycled after run " << runs_;
      std::this_thread::sleep_for(2ms);
    }
  }

  Result run(Request request) {
    wait_ready();
    ++runs_;
    if (pool_) return pool_->run(request);
    return ServerConnection(server_->socket()).run(request, "default");
  }
  Result sh(const std::string& script) {
    Request request;
    request.argv = {"sh", "-c", script};
    return run(std::move(request));
  }
  Result python(const std::string& code) {
    Request request;
    request.argv = {"python3", "-c", code};
    return run(std::move(request));
  }
  // The runs so far were all served by the one sandbox, recycled between them.
  void expect_one_sandbox() {
    const auto now = counts();
    EXPECT_EQ(now.cold, 0u);
    // Each run's sandbox was recycled for the next (the last may have been recycled already).
    EXPECT_GE(now.recycled + 1, runs_) << "a run was not served by the recycled sandbox";
  }

  std::unique_ptr<Pool> pool_;
  std::unique_ptr<ServerProcess> server_;
  std::uint64_t runs_ = 0;
};

// Each item through Pool and through the server.
class Recycled : public RecycledBase, public ::testing::WithParamInterface<std::string> {
 protected:
  void SetUp() override { start(GetParam()); }
};

// What only Pool's interface reaches: a request's own policy, another owner.
class RecycledPool : public RecycledBase {
 protected:
  void SetUp() override { start("pool"); }
};

#define EXPECT_OK(result) EXPECT_EQ((result).status, Status::ok) << describe(result)

TEST_P(Recycled, ServesManyRunsFromOneSandbox) {
  for (int i = 0; i < 20; ++i) {
    const auto result = sh("echo run " + std::to_string(i));
    ASSERT_EQ(result.status, Status::ok) << describe(result);
    EXPECT_EQ(result.stdout_data, "run " + std::to_string(i) + "\n");
  }
  expect_one_sandbox();
}

// Processes: a stopped one, a setsid'ed daemon, a zombie (its parent, a daemon too, never waits):
// none is there in the next run, whose PID namespace is new (the same pids again: the last run's
// count of processes does not show either).
TEST_P(Recycled, ProcessesOfTheLastRunAreGoneAndPidsStartAgain) {
  // ls alone, not in a pipe: whether wc had started when ls read /proc would vary with the load.
  const char* processes = "echo $$; ls -d /proc/[0-9]* > /tmp/pids; wc -l < /tmp/pids";
  const auto first = sh(processes);
  EXPECT_OK(first);
  const auto leave =
      sh("sleep 1000 & kill -STOP $!; setsid sleep 1001 </dev/null >/dev/null 2>&1 & "
         "setsid sh -c 'sh -c \"exit 0\" & exec sleep 1002' </dev/null >/dev/null 2>&1 & "
         "for i in $(seq 40); do true & done; sleep 0.2; echo left");
  EXPECT_OK(leave);
  EXPECT_EQ(leave.stdout_data, "left\n");
  const auto next = sh(processes);
  EXPECT_OK(next);
  EXPECT_EQ(next.stdout_data, first.stdout_data);
  expect_one_sandbox();
}

// Every writable mount is a fresh tmpfs: /tmp, /dev/shm (POSIX shared memory is files there);
// what the last run wrote there is freed, not kept charged beneath (the next run's peak memory).
TEST_P(Recycled, TmpAndDevShmAreFreshTmpfs) {
  // 48 MiB in files under the policy's 16 MiB file size limit.
  EXPECT_OK(
      sh("for i in 1 2 3 4; do head -c 12M /dev/zero > /tmp/big$i; done; "
         "head -c 12M /dev/zero > /dev/shm/big"));
  const auto after_big = sh("ls -A /tmp /dev/shm");
  EXPECT_OK(after_big);
  EXPECT_EQ(after_big.stdout_data, "/dev/shm:\n\n/tmp:\n");
  EXPECT_LT(after_big.peak_memory_bytes, 40ull << 20) << "the last run's files are still charged";
  EXPECT_OK(
      sh("echo x > /tmp/left; mkdir /tmp/dir; echo y > /dev/shm/left; "
         "python3 -c 'from multiprocessing import shared_memory as s; "
         "m = s.SharedMemory(name=\"leak\", create=True, size=4096); m.close()'"));
  const auto next = sh("ls -A /tmp /dev/shm; df -k /tmp | tail -1 | awk '{print $3}'");
  EXPECT_OK(next);
  EXPECT_EQ(next.stdout_data, "/dev/shm:\n\n/tmp:\n0\n");
  expect_one_sandbox();
}

// SysV IPC (shared memory, message queues, semaphores) and POSIX message queues: the next run has
// a new IPC namespace.
TEST_P(Recycled, SysVIpcAndMessageQueuesAreGone) {
  const char* make = R"(
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print(libc.shmget(0x1eaf, 4096, 0o1666) >= 0, libc.msgget(0x1eaf, 0o1666) >= 0,
      libc.semget(0x1eaf, 1, 0o1666) >= 0)
rt = ctypes.CDLL("librt.so.1", use_errno=True)
print("mq", rt.mq_open(b"/leak", os.O_CREAT | os.O_RDWR, 0o666, None) >= 0)
)";
  const auto made = python(make);
  EXPECT_OK(made);
  EXPECT_EQ(made.stdout_data.substr(0, 15), "True True True\n") << made.stdout_data;
  const char* look = R"(
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
print(libc.shmget(0x1eaf, 0, 0), libc.msgget(0x1eaf, 0), libc.semget(0x1eaf, 0, 0))
for table in ("shm", "msg", "sem"):
    print(table, len(open("/proc/sysvipc/" + table).read().splitlines()) - 1)
rt = ctypes.CDLL("librt.so.1", use_errno=True)
print("mq", rt.mq_open(b"/leak", os.O_RDONLY, 0, None))
)";
  const auto next = python(look);
  EXPECT_OK(next);
  EXPECT_EQ(next.stdout_data, "-1 -1 -1\nshm 0\nmsg 0\nsem 0\nmq -1\n");
  expect_one_sandbox();
}

// Abstract unix sockets live in the network namespace, which is kept: a daemon holding one dies
// with its run, and the name is free again in the next.
TEST_P(Recycled, AbstractUnixSocketsAreGone) {
  const char* bind = R"(
import os, socket, sys, time
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind("\0rlm-leak"); s.listen(1)
if os.fork() == 0:
    os.setsid(); time.sleep(1000)
print("bound")
)";
  const auto made = python(bind);
  EXPECT_OK(made);
  EXPECT_EQ(made.stdout_data, "bound\n");
  const char* look = R"(
import socket
c = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
try:
    c.connect("\0rlm-leak"); print("connected")
except OSError as error:
    print("refused", error.errno)
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.bind("\0rlm-leak"); print("free")
print(len(open("/proc/net/unix").read().splitlines()) - 1)
)";
  const auto next = python(look);
  EXPECT_OK(next);
  EXPECT_EQ(next.stdout_data, "refused 111\nfree\n2\n");
  expect_one_sandbox();
}

// A run that leaves a TCP socket in the namespace (here in TIME_WAIT on lo) is not followed by
// another in that sandbox: it is destroyed, and the next run finds a network namespace with no
// socket of the last run.
TEST_P(Recycled, ASandboxWhoseRunLeftATcpSocketIsNotReused) {
  EXPECT_OK(sh("true"));
  const char* connect = R"(
import socket
l = socket.socket(); l.bind(("127.0.0.1", 4242)); l.listen(1)
c = socket.create_connection(("127.0.0.1", 4242)); a, _ = l.accept()
a.close(); c.close(); l.close()
print("closed")
)";
  const auto left = python(connect);
  EXPECT_OK(left);
  EXPECT_EQ(left.stdout_data, "closed\n");
  // Not recycled after this one: the pool builds a new sandbox, which the next run gets.
  const auto until = Clock::now() + 30s;
  while (counts().ready < 1) {
    ASSERT_LT(Clock::now(), until);
    std::this_thread::sleep_for(2ms);
  }
  EXPECT_EQ(counts().recycled, 1u);
  Request request;
  request.argv = {"sh", "-c", "cat /proc/net/tcp | wc -l"};
  const auto next =
      pool_ ? pool_->run(request) : ServerConnection(server_->socket()).run(request, "default");
  EXPECT_OK(next);
  EXPECT_EQ(next.stdout_data, "1\n");
  EXPECT_EQ(counts().cold, 0u);
}

// The cgroup: the next run's account is its own (peak memory, CPU time, OOM kills, the pids
// limit), and a limit the last run tightened is the policy's again.
TEST_P(Recycled, TheCgroupsCountersAndLimitsAreTheRunsOwn) {
  const auto heavy = python(
      "import time\nb = bytearray(96 << 20)\nfor i in range(0, len(b), 4096): b[i] = 1\n"
      "t = time.process_time()\nwhile time.process_time() - t < 0.4: pass\nprint('done')");
  EXPECT_OK(heavy);
  EXPECT_GT(heavy.peak_memory_bytes, 96ull << 20);
  const auto light = sh("true");
  EXPECT_OK(light);
  EXPECT_LT(light.peak_memory_bytes, 48ull << 20);
  EXPECT_LT(light.cpu, std::chrono::milliseconds(300));

  // The OOM killer and the pids limit end a run each; the next one, failing on its own, is
  // classified by its own account, which has neither.
  const auto oom = python("b = bytearray(4 << 30)");
  EXPECT_EQ(oom.status, Status::memory_limit) << describe(oom);
  const auto after_oom = sh("exit 3");
  EXPECT_EQ(after_oom.status, Status::exit_nonzero) << describe(after_oom);
  const auto bomb = sh("for i in $(seq 2000); do sleep 5 & done 2>/dev/null; exit 1");
  EXPECT_EQ(bomb.status, Status::pids_limit) << describe(bomb);
  const auto calm = sh("exit 3");
  EXPECT_EQ(calm.status, Status::exit_nonzero) << describe(calm);
  expect_one_sandbox();
}

// A run that used a tighter memory limit (Pool::run(request, policy), which the server calls with
// a client's tightened policy) leaves the next with the policy's.
TEST_F(RecycledPool, ATightenedLimitIsUndoneForTheNextRun) {
  wait_ready();
  Policy tight = pool_->policy();
  tight.limits.memory_bytes = 48ull << 20;
  Request request;
  request.argv = {"sh", "-c", "head -c 64M /dev/zero | tail > /dev/null && echo fits"};
  ++runs_;
  const auto squeezed = pool_->run(request, tight);
  EXPECT_NE(squeezed.stdout_data, "fits\n") << describe(squeezed);
  const auto roomy = sh("head -c 64M /dev/zero | tail > /dev/null && echo fits");
  EXPECT_OK(roomy);
  EXPECT_EQ(roomy.stdout_data, "fits\n");
  expect_one_sandbox();
}

// Environment, working directory, rlimits: the next run's are its request's and policy's.
TEST_P(Recycled, EnvironmentCwdAndRlimitsAreTheRequestsOwn) {
  Request first;
  first.argv = {"sh", "-c", "cd /; ulimit -n 64; export LEFT=1; echo $RLM_RECYCLE_TEST"};
  first.env = {{"RLM_RECYCLE_TEST", "first"}};
  const auto one = run(first);
  EXPECT_OK(one);
  EXPECT_EQ(one.stdout_data, "first\n");
  const auto next = sh("echo ${RLM_RECYCLE_TEST-unset} ${LEFT-unset} $(pwd) $(ulimit -n)");
  EXPECT_OK(next);
  const auto cold = run_sh("echo ${RLM_RECYCLE_TEST-unset} ${LEFT-unset} $(pwd) $(ulimit -n)");
  EXPECT_EQ(next.stdout_data, cold.stdout_data);
  expect_one_sandbox();
}

// Keyrings, inotify instances (a per-uid count), the hostname, seccomp and no_new_privs: what a
// run can change of them does not reach the next, which has the same filter.
TEST_P(Recycled, KeyringsInotifyHostnameAndFiltersAreAsAtFirst) {
  const char* state = R"(
import ctypes, os
libc = ctypes.CDLL(None, use_errno=True)
key = libc.syscall(248, b"user", b"rlm-leak", b"x", 1, -4)  # add_key to the user keyring
found = libc.syscall(250, 10, -4, b"user", b"rlm-leak", 0)  # keyctl SEARCH
fds = 0
while fds < 4096 and libc.inotify_init() >= 0: fds += 1
status = dict(l.split(":\t", 1) for l in open("/proc/self/status").read().splitlines() if ":\t" in l)
print(os.uname().nodename, found >= 0, fds, status["Seccomp"].strip(), status["NoNewPrivs"].strip())
)";
  const auto first = python(state);
  EXPECT_OK(first);
  // The first run tries to change what it may not, and holds its inotify instances in a daemon.
  EXPECT_OK(python(R"(
import ctypes, os, socket, time
libc = ctypes.CDLL(None, use_errno=True)
print(libc.sethostname(b"changed", 7))
libc.syscall(248, b"user", b"rlm-leak", b"x", 1, -4)
if os.fork() == 0:
    os.setsid()
    while libc.inotify_init() >= 0: pass
    time.sleep(1000)
)"));
  const auto next = python(state);
  EXPECT_OK(next);
  EXPECT_EQ(next.stdout_data, first.stdout_data);
  EXPECT_NE(next.stdout_data.find(" False "), std::string::npos) << next.stdout_data;
  expect_one_sandbox();
}

// Recycling never crosses identities: a sandbox that served one owner is not handed to another
// (Request::bind_owner, which the server sets to each client's uid and gid).
TEST_F(RecycledPool, ARecycledSandboxServesOneIdentityOnly) {
  EXPECT_OK(sh("true"));
  wait_ready();
  Request other;
  other.argv = {"true"};
  other.bind_owner = HostIds{4242, 4242};
  EXPECT_OK(pool_->run(other));
  EXPECT_EQ(pool_->stats().cold_runs, 1u);
}

INSTANTIATE_TEST_SUITE_P(Through, Recycled, ::testing::Values("pool", "server"),
                         [](const auto& info) { return info.param; });

}  // namespace
}  // namespace rlm::test
