// Landlock beneath the namespace backend's mounts (defence in depth): a "mount-namespace mistake"
// -- here a directory descriptor from outside the sandbox's tree, handed in through
// Request::inherit_fds -- still cannot be used to open, create or remove anything outside, while
// the host process holding the same descriptor can, and the paths the sandbox's mounts show keep
// working. Each attempt is made for real from inside the sandbox; the host is looked at after.
#include <fcntl.h>
#include <seccomp.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <thread>

#include "rlm_sandbox/pool.hpp"
#include "security_test_util.hpp"

namespace rlm::sectest {
namespace {

// The kernel's Landlock ABI as this process sees it (0: none), asked directly.
int kernel_landlock_abi() {
  constexpr unsigned kVersion = 1;  // LANDLOCK_CREATE_RULESET_VERSION
  const long abi = ::syscall(SYS_landlock_create_ruleset, nullptr, 0, kVersion);
  return abi < 0 ? 0 : static_cast<int>(abi);
}

// An owned descriptor of a host path, numbered 10 or above (a payload inherits fds >= 4 only).
class HostFd {
 public:
  HostFd(const std::string& path, int flags) {
    const int fd = ::open(path.c_str(), flags | O_CLOEXEC);
    if (fd < 0) return;
    fd_ = ::fcntl(fd, F_DUPFD_CLOEXEC, 10);
    ::close(fd);
  }
  ~HostFd() {
    if (fd_ >= 0) ::close(fd_);
  }
  HostFd(const HostFd&) = delete;
  HostFd& operator=(const HostFd&) = delete;
  int get() const { return fd_; }

 private:
  int fd_ = -1;
};

// Python run in the sandbox: each attempt on a descriptor it inherited prints "name OK value" or
// "name ERR errno".
std::string attempts_on_fds(int dir_fd, int path_fd) {
  return R"PY(
import os
def attempt(name, f):
    try:
        print(name, 'OK', f())
    except OSError as e:
        print(name, 'ERR', e.errno)
for label, fd in (('dir', )PY" +
         std::to_string(dir_fd) + R"PY(), ('opath', )PY" + std::to_string(path_fd) + R"PY()):
    attempt(label + '.open', lambda: os.read(os.open('secret', os.O_RDONLY, dir_fd=fd), 100).decode())
    attempt(label + '.reopen', lambda: open('/proc/self/fd/%d/secret' % fd).read())
    attempt(label + '.create', lambda: os.close(os.open('planted', os.O_WRONLY | os.O_CREAT, 0o644, dir_fd=fd)))
    attempt(label + '.mkdir', lambda: os.mkdir('planted-dir', dir_fd=fd))
    attempt(label + '.unlink', lambda: os.unlink('secret', dir_fd=fd))
    attempt(label + '.fstat', lambda: oct(os.fstat(fd).st_mode))
)PY";
}

// A host directory any uid may enter, read and write, holding a file any uid may read and write,
// and two descriptors of it (O_RDONLY and O_PATH): only Landlock stands between a sandbox holding
// them and the file.
class OutsideDir : public test::TempDir {
 public:
  OutsideDir()
      : secret_("rlm-landlock-secret-" + random_token()),
        dir_(path(), O_RDONLY | O_DIRECTORY),
        opath_(path(), O_PATH | O_DIRECTORY) {
    ::chmod(path().c_str(), 0777);
    write("secret", secret_);
    ::chmod(file("secret").c_str(), 0666);
  }
  const std::string& secret() const { return secret_; }
  bool has_fds() const { return dir_.get() >= 0 && opath_.get() >= 0; }

  // The control: the host process, holding the same descriptors, reads the file through each.
  void expect_readable_from_the_host() const {
    for (int fd : {dir_.get(), opath_.get()}) {
      const int opened = ::openat(fd, "secret", O_RDONLY | O_CLOEXEC);
      ASSERT_GE(opened, 0) << "the host cannot open the file through its own descriptor";
      char buffer[128] = {};
      const ssize_t got = ::read(opened, buffer, sizeof buffer - 1);
      ::close(opened);
      EXPECT_EQ(std::string(buffer, got > 0 ? static_cast<std::size_t>(got) : 0), secret_);
    }
  }

  // A payload that tries everything through both descriptors (attempts_on_fds).
  Request request() const {
    Request request;
    request.language = "python";
    request.code = attempts_on_fds(dir_.get(), opath_.get());
    request.inherit_fds = {dir_.get(), opath_.get()};
    return request;
  }

  void expect_untouched() const {
    EXPECT_EQ(read("secret"), secret_);
    EXPECT_NE(::access(file("planted").c_str(), F_OK), 0);
    EXPECT_NE(::access(file("planted-dir").c_str(), F_OK), 0);
  }

 private:
  std::string secret_;
  HostFd dir_, opath_;
};

// `argv` run with landlock_create_ruleset refused (ENOSYS) by a seccomp filter, as Docker's
// default profile refuses it: the runtime in it sees no Landlock. Its stdout and stderr, joined,
// and its exit status; it is killed after 120 s.
std::pair<int, std::string> run_without_landlock(const std::vector<std::string>& argv) {
  std::vector<char*> args;
  for (const auto& arg : argv) args.push_back(const_cast<char*>(arg.c_str()));
  args.push_back(nullptr);
  int out[2];
  if (::pipe2(out, O_CLOEXEC) != 0) return {-1, "pipe2 failed"};
  const pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(out[1], 1);
    ::dup2(out[1], 2);
    ::alarm(120);
    scmp_filter_ctx filter = seccomp_init(SCMP_ACT_ALLOW);
    if (!filter ||
        seccomp_rule_add(filter, SCMP_ACT_ERRNO(ENOSYS), SCMP_SYS(landlock_create_ruleset), 0) ||
        seccomp_load(filter))
      ::_exit(98);
    ::execv(args[0], args.data());
    ::_exit(99);
  }
  ::close(out[1]);
  const std::string output = test::read_to_eof(out[0]);
  ::close(out[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return {WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status), output};
}

class NamespaceLandlockTest : public NamespaceTest {
 protected:
  void SetUp() override {
    NamespaceTest::SetUp();
    if (HasFatalFailure()) return;
    abi_ = kernel_landlock_abi();
    if (abi_ == 0) GTEST_SKIP() << "this kernel has no Landlock (or it is disabled)";
  }

  void expect_confined(const std::map<std::string, std::string>& seen,
                       const std::string& output) const {
    for (const char* label : {"dir", "opath"}) {
      const std::string l = label;
      // Landlock refuses the open itself (EACCES), before any permission bit is looked at.
      EXPECT_EQ(seen.count(l + ".open") ? seen.at(l + ".open") : "", "ERR 13") << output;
      EXPECT_EQ(seen.count(l + ".reopen") ? seen.at(l + ".reopen") : "", "ERR 13") << output;
      EXPECT_EQ(seen.count(l + ".create") ? seen.at(l + ".create") : "", "ERR 13") << output;
      EXPECT_EQ(seen.count(l + ".mkdir") ? seen.at(l + ".mkdir") : "", "ERR 13") << output;
      EXPECT_EQ(seen.count(l + ".unlink") ? seen.at(l + ".unlink") : "", "ERR 13") << output;
      // The descriptors did arrive: what needs no new open still works on them.
      EXPECT_EQ((seen.count(l + ".fstat") ? seen.at(l + ".fstat") : "").rfind("OK 0o4", 0), 0u)
          << output;
    }
  }

  int abi_ = 0;
};

TEST_F(NamespaceLandlockTest, ADirectoryFdFromOutsideOpensNothingThroughIt) {
  if (via_server()) GTEST_SKIP() << "the server does not pass Request::inherit_fds on";
  const OutsideDir outside;
  ASSERT_TRUE(outside.has_fds());
  outside.expect_readable_from_the_host();

  const Result result = run_request(outside.request(), policy_);
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  expect_confined(parse_lines(result.stdout_data), result.stdout_data);
  outside.expect_untouched();
}

// A pool's sandbox is built long before its payload is known: it gets the same ruleset.
TEST_F(NamespaceLandlockTest, APooledSandboxIsConfinedTheSameWay) {
  if (via_server()) GTEST_SKIP() << "the server does not pass Request::inherit_fds on";
  const OutsideDir outside;
  ASSERT_TRUE(outside.has_fds());

  Pool pool(policy_, PoolOptions{1, 0});
  const auto give_up = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (pool.stats().ready_sandboxes == 0 && std::chrono::steady_clock::now() < give_up)
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ASSERT_EQ(pool.stats().ready_sandboxes, 1u) << "no warm sandbox within 30 s";

  const Result result = pool.run(outside.request());
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(pool.stats().warm_runs, 1u) << "the run did not take a warm sandbox";
  expect_confined(parse_lines(result.stdout_data), result.stdout_data);
  outside.expect_untouched();
}

// A read-write bind is writable through its mount; a directory beside its source, reached through
// a descriptor, is not -- though its permission bits would let the sandbox's uid write there.
TEST_F(NamespaceLandlockTest, AReadWriteBindIsWritableAndNothingBesideIt) {
  if (via_server()) GTEST_SKIP() << "the server does not pass Request::inherit_fds on";
  SharedDir parent;
  const std::string rw = parent.file("rw"), beside = parent.file("beside");
  ASSERT_EQ(::mkdir(rw.c_str(), 0777), 0);
  ASSERT_EQ(::mkdir(beside.c_str(), 0777), 0);
  ::chmod(rw.c_str(), 0777);
  ::chmod(beside.c_str(), 0777);
  const HostFd beside_fd(beside, O_RDONLY | O_DIRECTORY);
  ASSERT_GE(beside_fd.get(), 0);

  Request request;
  request.language = "python";
  request.code = R"PY(
import os
def attempt(name, f):
    try:
        print(name, 'OK', f())
    except OSError as e:
        print(name, 'ERR', e.errno)
def write(path, **kw):
    fd = os.open(path, os.O_WRONLY | os.O_CREAT, 0o644, **kw)
    os.write(fd, b'x')
    os.close(fd)
    return 'written'
attempt('inside', lambda: write('/data/inside'))
attempt('inside.rename', lambda: (os.mkdir('/data/sub'), os.rename('/data/inside', '/data/sub/moved'))[1])
attempt('beside', lambda: write('planted', dir_fd=)PY" +
                 std::to_string(beside_fd.get()) + R"PY())
)PY";
  request.inherit_fds = {beside_fd.get()};
  const Result result = run_request(request, with_rw_bind(rw, "/data"));
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  const auto seen = parse_lines(result.stdout_data);
  EXPECT_EQ(seen.count("inside") ? seen.at("inside") : "", "OK written") << result.stdout_data;
  EXPECT_EQ(seen.count("inside.rename") ? seen.at("inside.rename") : "", "OK None")
      << result.stdout_data;
  EXPECT_EQ(::access((rw + "/sub/moved").c_str(), F_OK), 0) << result.stdout_data;
  EXPECT_EQ(seen.count("beside") ? seen.at("beside") : "", "ERR 13") << result.stdout_data;
  EXPECT_NE(::access((beside + "/planted").c_str(), F_OK), 0);
}

// The positive control: under the ruleset, what the default sandbox's mounts show still works --
// reading and executing from the binds, listing /, the generated /etc files, everything a
// program does in /tmp (files, directories, renames across them, truncation, fifos, sockets,
// links, executing a script), the device nodes and a pty's ioctls, /dev/shm, /proc/self.
TEST_F(NamespaceLandlockTest, TheSandboxsOwnPathsStillWork) {
  const Result result = python(R"PY(
import os, socket, subprocess
def attempt(name, f):
    try:
        print(name, 'OK', f())
    except OSError as e:
        print(name, 'ERR', e.errno)
def tmp_work():
    os.makedirs('/tmp/a/b')
    with open('/tmp/a/f', 'w') as f:
        f.write('hello world')
    os.rename('/tmp/a/f', '/tmp/a/b/g')
    os.truncate('/tmp/a/b/g', 5)
    os.mkfifo('/tmp/a/fifo')
    os.symlink('b/g', '/tmp/a/link')
    s = socket.socket(socket.AF_UNIX)
    s.bind('/tmp/a/sock')
    s.close()
    with open('/tmp/a/run.sh', 'w') as f:
        f.write('#!/bin/sh\necho ran\n')
    os.chmod('/tmp/a/run.sh', 0o755)
    out = subprocess.run(['/tmp/a/run.sh'], capture_output=True).stdout.decode().strip()
    os.unlink('/tmp/a/link')
    return open('/tmp/a/b/g').read() + ' ' + out
def pty():
    leader, follower = os.openpty()
    return os.isatty(follower)
def oom():
    value = open('/proc/self/oom_score_adj').read()
    with open('/proc/self/oom_score_adj', 'w') as f:
        f.write(value)
    return value.strip()
attempt('usr', lambda: len(open('/usr/bin/env', 'rb').read(4)))
attempt('exec', lambda: subprocess.run(['/bin/sh', '-c', 'echo sh'], capture_output=True).stdout.decode().strip())
attempt('ls', lambda: 'usr' in os.listdir('/') and 'tmp' in os.listdir('/'))
attempt('passwd', lambda: 'sandbox' in open('/etc/passwd').read())
attempt('tmp', tmp_work)
attempt('null', lambda: open('/dev/null', 'w').write('x'))
attempt('urandom', lambda: len(open('/dev/urandom', 'rb').read(8)))
attempt('pty', pty)
attempt('shm', lambda: open('/dev/shm/x', 'w').write('x'))
attempt('proc', lambda: 'Name:' in open('/proc/self/status').read())
attempt('oom', oom)
)PY");
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  const auto seen = parse_lines(result.stdout_data);
  const std::map<std::string, std::string> expected = {
      {"usr", "OK 4"},         {"exec", "OK sh"},  {"ls", "OK True"},   {"passwd", "OK True"},
      {"tmp", "OK hello ran"}, {"null", "OK 1"},   {"urandom", "OK 8"}, {"pty", "OK True"},
      {"shm", "OK 1"},         {"proc", "OK True"}};
  for (const auto& [name, value] : expected)
    EXPECT_EQ(seen.count(name) ? seen.at(name) : "(missing)", value)
        << name << "\n"
        << result.stdout_data << result.stderr_data;
  EXPECT_EQ((seen.count("oom") ? seen.at("oom") : "").rfind("OK ", 0), 0u) << result.stdout_data;
}

// health says runs get Landlock, at the kernel's ABI.
TEST_F(NamespaceLandlockTest, HealthSaysRunsAreConfinedByLandlock) {
  if (via_server()) GTEST_SKIP() << "the server's health is its host's; this checks the backend";
  const Health health = backend_->health();
  EXPECT_NE(health.detail.find("Landlock (ABI " + std::to_string(abi_) + ") beneath the mounts"),
            std::string::npos)
      << health.detail;
}

// Where the kernel offers no Landlock (here: a seccomp filter refuses it, as Docker's default
// profile does), runs go on as before, and health says there is none.
TEST_F(NamespaceTest, WithoutLandlockRunsGoOnAndHealthSaysSo) {
  if (via_server()) GTEST_SKIP() << "this runs the CLI directly under a seccomp filter";
  const auto health = run_without_landlock({test::bin_path("rlm-sandbox"), "health"});
  EXPECT_NE(health.second.find("no Landlock (the kernel has none"), std::string::npos)
      << health.second;
  EXPECT_EQ(health.second.find("Landlock (ABI"), std::string::npos) << health.second;
  const auto run = run_without_landlock(
      {test::bin_path("rlm-sandbox"), "run", "--policy", "default", "--", "/bin/sh", "-c",
       "ls / >/dev/null && echo x >/tmp/x && cat /tmp/x /etc/passwd | head -2"});
  EXPECT_EQ(run.first, 0) << run.second;
  EXPECT_EQ(run.second.rfind("x\nroot:", 0), 0u) << run.second;
}

}  // namespace
}  // namespace rlm::sectest
