// Per-user kernel limits are per sandbox (issue 11 line 9). With a root runtime each live sandbox
// runs as a host uid of its own from a reserved range, and owns its user namespace, so the kernel's
// per-user counters (inotify instances and watches, fds in flight, processes, POSIX message
// queues, user namespaces, pending signals, pipe buffers) are charged to that uid alone: one
// sandbox exhausting them leaves every other sandbox and the host theirs. Real sandboxes, real
// kernel counters; a sandbox "holds" its resources until the host lets it go.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <linux/nsfs.h>
#include <sys/inotify.h>
#include <sys/ioctl.h>
#include <sys/stat.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <thread>
#include <utility>

#include "namespace_backend_test_util.hpp"
#include "rlm_sandbox/session.hpp"
#include "support/scoped_env.hpp"

namespace rlm::test {
namespace {

using Clock = std::chrono::steady_clock;

constexpr uid_t kNobody = 65534;

#define RLM_REQUIRE_ROOT_RUNTIME()                                                    \
  if (::geteuid() != 0)                                                               \
  GTEST_SKIP() << "needs root: only a root runtime gives each sandbox a host uid of " \
                  "its own (rootless, the caller's uid is the only one there is)"

// A small range of this test process's own, outside the default one, so that no other runtime
// on the machine takes its uids.
uid_t private_range_first(unsigned test_number) {
  return 0x70100000u + static_cast<uid_t>(getpid() % 20000) * 64u + test_number * 8u;
}

// A sandbox that runs `script` (Python) on a thread of its own. The script calls held(text) when it
// holds what it came for, then waits until the host creates /out/go (bounded by its wall limit).
constexpr const char* kHeldPreamble =
    R"py(import os as _os
def held(text):
    with open('/out/held.tmp', 'w') as f:
        f.write(text)
    _os.rename('/out/held.tmp', '/out/held')
)py";
class HeldSandbox {
 public:
  HeldSandbox(const std::string& script, Policy policy = ns_policy()) {
    mark_ = "held-" + std::to_string(getpid()) + "-" + std::to_string(next_++);
    policy.env.set["RLM_TEST_MARK"] = mark_;
    bind_writable(policy, dir_, "/out");
    const std::string program = kHeldPreamble + script +
                                R"py(
import os as _os, time as _time
for _ in range(1500):
    if _os.path.exists('/out/go'): break
    _time.sleep(0.01)
)py";
    thread_ = std::thread([this, program, policy] {
      result_ = run_ns({"python3", "-c", program}, policy);
      done_ = true;
    });
  }
  ~HeldSandbox() { release(); }
  HeldSandbox(const HeldSandbox&) = delete;
  HeldSandbox& operator=(const HeldSandbox&) = delete;

  // What the script wrote to /out/held, once it is there ("" if it never came).
  std::string wait_held() {
    const auto until = Clock::now() + 20s;
    while (Clock::now() < until) {
      if (access(dir_.file("held").c_str(), F_OK) == 0) return dir_.read("held");
      if (done_) return "";
      std::this_thread::sleep_for(10ms);
    }
    return "";
  }
  // Lets the sandbox end and waits for it; its Result.
  const Result& release() {
    if (thread_.joinable()) {
      dir_.write("go", "");
      thread_.join();
    }
    return result_;
  }
  const TempDir& dir() const { return dir_; }
  const std::string& mark() const { return mark_; }

 private:
  static inline int next_ = 0;
  TempDir dir_;
  std::string mark_;
  std::thread thread_;
  Result result_;
  std::atomic<bool> done_{false};
};

// The host uid a sandbox wrote to `path` (read from its /proc/self/uid_map: what its files would
// have belonged to before read-write binds were idmapped to their owner).
uid_t host_uid_in(const TempDir& dir, const std::string& name) {
  try {
    return static_cast<uid_t>(std::stoul(dir.read(name)));
  } catch (const std::exception&) {
    return static_cast<uid_t>(-1);
  }
}

// The "Uid:" line of /proc/PID/status: real, effective, saved, fs.
std::string status_uids(pid_t pid) {
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
  for (std::string line; std::getline(in, line);)
    if (line.starts_with("Uid:")) return line.substr(4);
  return "";
}

// ---- Who a sandbox is on the host ---------------------------------------------------------------

TEST(SandboxUid, TwoConcurrentSandboxesRunAsDifferentHostUidsThatOwnTheirUserNamespaces) {
  RLM_REQUIRE_ROOT_RUNTIME();
  HeldSandbox a(
      "open('/out/a', 'w').write(open('/proc/self/uid_map').read().split()[1])\nheld('ok')");
  ASSERT_EQ(a.wait_held(), "ok") << describe(a.release());
  const uid_t uid_a = host_uid_in(a.dir(), "a");

  // Seen from the host: every process of A runs as that uid, and A's user namespace is owned by
  // it (so the kernel charges the namespace's per-user counters one level up to it, not to root).
  const auto pids = processes_with_environment("RLM_TEST_MARK=" + a.mark());
  ASSERT_FALSE(pids.empty());
  for (pid_t pid : pids) {
    const auto id = std::to_string(uid_a);
    EXPECT_EQ(status_uids(pid), "\t" + id + "\t" + id + "\t" + id + "\t" + id) << pid;
    const int ns =
        open(("/proc/" + std::to_string(pid) + "/ns/user").c_str(), O_RDONLY | O_CLOEXEC);
    ASSERT_GE(ns, 0) << pid;
    uid_t owner = 0;
    EXPECT_EQ(ioctl(ns, NS_GET_OWNER_UID, &owner), 0);
    close(ns);
    EXPECT_EQ(owner, uid_a) << "the user namespace of " << pid << " is owned by " << owner;
  }

  TempDir dir_b;
  Policy policy_b = ns_policy();
  bind_writable(policy_b, dir_b, "/out");
  const auto b =
      run_sh("read inside host count < /proc/self/uid_map; echo $host > /out/b", policy_b);
  ASSERT_EQ(b.status, Status::ok) << describe(b);
  const uid_t uid_b = host_uid_in(dir_b, "b");

  EXPECT_NE(uid_a, uid_b) << "two live sandboxes share host uid " << uid_a;
  for (uid_t uid : {uid_a, uid_b}) {
    EXPECT_NE(uid, 0u);
    EXPECT_NE(uid, kNobody);
  }
  EXPECT_EQ(a.release().status, Status::ok) << describe(a.release());
}

TEST(SandboxUid, AUidIsHandedOutAgainOnlyAfterItsSandboxEnded) {
  RLM_REQUIRE_ROOT_RUNTIME();
  const uid_t first = private_range_first(0);
  ScopedEnv range("RLM_SANDBOX_UID_RANGE", std::to_string(first) + "-" + std::to_string(first + 1));

  auto a = std::make_unique<HeldSandbox>(
      "open('/out/a', 'w').write(open('/proc/self/uid_map').read().split()[1])\n"
      "held('ok')");
  ASSERT_EQ(a->wait_held(), "ok") << describe(a->release());
  EXPECT_EQ(host_uid_in(a->dir(), "a"), first);  // the first free slot
  {
    HeldSandbox b(
        "open('/out/b', 'w').write(open('/proc/self/uid_map').read().split()[1])\nheld('ok')");
    ASSERT_EQ(b.wait_held(), "ok") << describe(b.release());
    EXPECT_EQ(host_uid_in(b.dir(), "b"), first + 1);

    // Both uids of the range are held: a third sandbox does not start, and says why and how to fix.
    const auto c = run_sh("true");
    EXPECT_EQ(c.status, Status::sandbox_error) << describe(c);
    EXPECT_NE(c.detail.find("RLM_SANDBOX_UID_RANGE"), std::string::npos) << c.detail;
  }
  // B ended: its uid is free again, A's is not.
  TempDir dir;
  Policy policy = ns_policy();
  bind_writable(policy, dir, "/out");
  auto d = run_sh("read inside host count < /proc/self/uid_map; echo $host > /out/d", policy);
  ASSERT_EQ(d.status, Status::ok) << describe(d);
  EXPECT_EQ(host_uid_in(dir, "d"), first + 1);

  EXPECT_EQ(a->release().status, Status::ok);
  a.reset();
  d = run_sh("read inside host count < /proc/self/uid_map; echo $host > /out/d2", policy);
  ASSERT_EQ(d.status, Status::ok) << describe(d);
  EXPECT_EQ(host_uid_in(dir, "d2"), first);
}

// What a held sandbox below reports: how many it took, and the errno name that stopped it.
std::pair<unsigned, std::string> count_and_error(const std::string& held) {
  std::istringstream fields(held);
  unsigned count = 0;
  std::string error;
  fields >> count >> error;
  return {count, error};
}

// ---- inotify instances --------------------------------------------------------------------------

unsigned read_number(const char* path) {
  std::ifstream in(path);
  unsigned value = 0;
  in >> value;
  return value;
}

TEST(SandboxUid, ASandboxHoldingEveryInotifyInstanceLeavesOtherSandboxesAndTheHostTheirs) {
  RLM_REQUIRE_ROOT_RUNTIME();
  const unsigned per_user = read_number("/proc/sys/fs/inotify/max_user_instances");
  ASSERT_GT(per_user, 0u);
  Policy policy = ns_policy();
  // Room for more instances than the per-user limit in one process, so the limit that stops the
  // loop is the kernel's per-user count, not the fd limit.
  policy.limits.open_files = std::max(policy.limits.open_files, per_user + 64);
  HeldSandbox a(
      R"py(import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
fds, err = [], 0
while len(fds) < 100000:
    fd = libc.inotify_init1(0)
    if fd < 0:
        err = ctypes.get_errno()
        break
    fds.append(fd)
held('%d %s' % (len(fds), errno.errorcode.get(err, err)))
)py",
      policy);
  const std::string held = a.wait_held();
  ASSERT_FALSE(held.empty()) << describe(a.release());
  const auto [count, error] = count_and_error(held);
  // It took every instance it could; what stopped it is the per-user count (EMFILE).
  EXPECT_EQ(error, "EMFILE") << held;
  EXPECT_GT(count, 0u) << held;

  // Meanwhile another sandbox ...
  const auto b = run_ns({"python3", "-c",
                         R"py(import ctypes, errno
libc = ctypes.CDLL(None, use_errno=True)
fd = libc.inotify_init1(0)
print('ok' if fd >= 0 else errno.errorcode[ctypes.get_errno()])
)py"});
  EXPECT_EQ(b.status, Status::ok) << describe(b);
  EXPECT_EQ(b.stdout_data, "ok\n") << "a second sandbox: " << describe(b);
  // ... and the host (root) still get one.
  const int host = inotify_init1(IN_CLOEXEC);
  const int host_error = errno;
  EXPECT_GE(host, 0) << "the host's inotify_init1: " << std::strerror(host_error) << " (sandbox A "
                     << "holds " << held << ")";
  if (host >= 0) close(host);

  const auto& result = a.release();
  EXPECT_EQ(result.status, Status::ok) << describe(result);
  // A ended and nothing of it is left.
  EXPECT_TRUE(processes_with_environment("RLM_TEST_MARK=" + a.mark()).empty());
  EXPECT_TRUE(own_cgroup_dirs().empty());
  EXPECT_TRUE(children_of_this_process().empty());
}

// Rootless, every sandbox shares the caller's uid and so its per-user budgets; the sandbox's own
// user namespace then caps its share: half of the host's inotify and fanotify budgets, and no
// nested user namespaces. (Asserted under a root runtime, where the same caps apply.)
TEST(SandboxUid, TheSandboxsOwnNamespaceCapsItsShareOfEachPerUserBudget) {
  RLM_REQUIRE_ROOT_RUNTIME();
  const unsigned per_user = read_number("/proc/sys/fs/inotify/max_user_instances");
  const unsigned watches = read_number("/proc/sys/user/max_inotify_watches");
  Policy policy = ns_policy();
  policy.limits.open_files = std::max(policy.limits.open_files, per_user + 64);
  const auto result = run_ns({"python3", "-c",
                              R"py(import ctypes
for name in ('max_inotify_instances', 'max_inotify_watches', 'max_user_namespaces'):
    print(name, open('/proc/sys/user/' + name).read().strip())
libc = ctypes.CDLL(None, use_errno=True)
count = 0
while count < 100000 and libc.inotify_init1(0) >= 0:
    count += 1
print('opened', count)
)py"},
                             policy);
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  const std::string expected =
      "max_inotify_instances " + std::to_string(std::max(1u, per_user / 2)) +
      "\nmax_inotify_watches " + std::to_string(std::max(1u, watches / 2)) +
      "\nmax_user_namespaces 0\nopened " + std::to_string(std::max(1u, per_user / 2)) + "\n";
  EXPECT_EQ(result.stdout_data, expected) << describe(result);
}

// ---- fds in flight (SCM_RIGHTS) -----------------------------------------------------------------

TEST(SandboxUid, ASandboxWithFdsInFlightLeavesOtherSandboxesAndSessionsTheirs) {
  RLM_REQUIRE_ROOT_RUNTIME();
  Policy policy = ns_policy();
  // unix_inflight is charged to the sender's user and bounded by its RLIMIT_NOFILE: A sends copies
  // of one fd that nobody receives until the kernel refuses (ETOOMANYREFS).
  HeldSandbox a(
      R"py(import socket, errno
a, b = socket.socketpair()
a.setblocking(False)
sent, err = 0, ''
try:
    while sent < 100000:
        socket.send_fds(a, [b'x'], [0] * 100)
        sent += 100
except OSError as e:
    err = errno.errorcode.get(e.errno, str(e.errno))
held('%d %s' % (sent, err))
)py",
      policy);
  const std::string held = a.wait_held();
  ASSERT_FALSE(held.empty()) << describe(a.release());
  const auto [sent, error] = count_and_error(held);
  EXPECT_EQ(error, "ETOOMANYREFS") << held;
  EXPECT_GT(sent, policy.limits.open_files) << held;

  // Another sandbox passes an fd ...
  const auto b = run_ns({"python3", "-c",
                         R"py(import socket
a, b = socket.socketpair()
socket.send_fds(a, [b'x'], [0])
msg, fds, flags, addr = socket.recv_fds(b, 1, 1)
print('passed', len(fds))
)py"});
  EXPECT_EQ(b.status, Status::ok) << describe(b);
  EXPECT_EQ(b.stdout_data, "passed 1\n") << describe(b);
  // ... and a REPL session starts and runs a cell.
  Policy repl = load_policy("python-repl");
  repl.limits.wall_time = 20s;
  try {
    auto session = make_backend("namespace")->open_session(repl, {});
    const auto cell = session->execute("print(6 * 7)");
    EXPECT_EQ(cell.status, CellStatus::ok) << cell.to_json().dump();
    EXPECT_EQ(cell.stdout_data, "42\n") << cell.to_json().dump();
    session->close();
  } catch (const std::exception& failure) {
    ADD_FAILURE() << "a session did not start while sandbox A holds " << held << ": "
                  << failure.what();
  }
  EXPECT_EQ(a.release().status, Status::ok) << describe(a.release());
}

}  // namespace
}  // namespace rlm::test
