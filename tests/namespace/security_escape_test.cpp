// Escape attempts from inside the default sandbox on the namespace backend. Every property is
// checked by trying the thing for real from inside (and, where it matters, looking at the host
// afterwards), never by inspecting how the sandbox was configured.
#include <arpa/inet.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "seccomp/preamble_by_number.hpp"
#include "security_test_util.hpp"

namespace rlm::sectest {
namespace {

// ---- PID namespace ------------------------------------------------------------------------------

TEST_F(NamespaceTest, HostProcessesAreInvisibleAndInitIsPid1) {
  // This test process is a host process with a distinctive command line. The payload looks for
  // it in every /proc/*/cmdline it can see; the needle is assembled at run time so that the
  // payload's own command line (which holds this script) cannot match it.
  std::string self = read_file("/proc/self/cmdline");
  std::string exe = std::filesystem::path(self.substr(0, self.find('\0'))).filename().string();
  ASSERT_GE(exe.size(), 4u) << exe;
  const std::string half1 = exe.substr(0, exe.size() / 2), half2 = exe.substr(exe.size() / 2);

  auto result = python(R"PY(
import os
pids = sorted(int(p) for p in os.listdir('/proc') if p.isdigit())
def cmdline(pid):
    try:
        with open('/proc/%d/cmdline' % pid, 'rb') as f:
            return f.read().replace(b'\0', b' ').replace(b'\n', b' ').decode(errors='replace').strip()
    except OSError as e:
        return type(e).__name__
def comm(pid):
    try:
        with open('/proc/%d/comm' % pid) as f:
            return f.read().strip()
    except OSError as e:
        return type(e).__name__
needle = ')PY" + half1 +
                       R"PY(' + ')PY" + half2 + R"PY('
print('pids', ' '.join(map(str, pids)))
print('self', os.getpid())
print('init_cmdline', cmdline(1))
print('init_comm', comm(1))
chain, pid = [], os.getpid()
while pid > 1:
    with open('/proc/%d/stat' % pid) as f:
        pid = int(f.read().rsplit(')', 1)[1].split()[1])
    chain.append(pid)
print('ancestors', ' '.join(map(str, chain)))
print('host_seen', sum(1 for p in pids if needle in cmdline(p)))
)PY");
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  auto v = parse_lines(result.stdout_data);

  std::vector<int> pids;
  std::istringstream in(v["pids"]);
  for (int pid; in >> pid;) pids.push_back(pid);
  ASSERT_FALSE(pids.empty()) << result.stdout_data;
  EXPECT_EQ(pids.front(), 1) << "no PID 1 in the sandbox's /proc: " << v["pids"];
  EXPECT_LE(pids.size(), 4u) << "the sandbox sees more than its own few processes: " << v["pids"];
  EXPECT_LE(pids.back(), 16) << "a pid from outside the sandbox? " << v["pids"];
  EXPECT_LE(std::stoi(v["self"]), 4) << v["self"];
  EXPECT_EQ(v["host_seen"], "0") << "a host process is visible from inside the sandbox";
  // PID 1 is rlm-sandbox-init (comm is cut to 15 characters), and it is the payload's ancestor.
  EXPECT_TRUE(v["init_cmdline"].find("rlm-sandbox-init") != std::string::npos ||
              v["init_comm"] == "rlm-sandbox-ini")
      << "PID 1 inside is not rlm-sandbox-init: cmdline '" << v["init_cmdline"] << "', comm '"
      << v["init_comm"] << "'";
  EXPECT_TRUE(v["ancestors"].size() >= 1 && v["ancestors"].back() == '1')
      << "the payload does not descend from PID 1: " << v["ancestors"];
}

// ---- Network namespace --------------------------------------------------------------------------

// A listening TCP socket on the host, closed on destruction.
class HostListener {
 public:
  HostListener(int family, const std::string& address) {
    fd_ = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
    if (fd_ < 0) return;
    sockaddr_storage storage{};
    socklen_t length = 0;
    if (family == AF_INET) {
      auto* in = reinterpret_cast<sockaddr_in*>(&storage);
      in->sin_family = AF_INET;
      ::inet_pton(AF_INET, address.c_str(), &in->sin_addr);
      length = sizeof *in;
    } else {
      auto* in6 = reinterpret_cast<sockaddr_in6*>(&storage);
      in6->sin6_family = AF_INET6;
      ::inet_pton(AF_INET6, address.c_str(), &in6->sin6_addr);
      length = sizeof *in6;
    }
    if (::bind(fd_, reinterpret_cast<sockaddr*>(&storage), length) != 0 || ::listen(fd_, 16) != 0 ||
        ::getsockname(fd_, reinterpret_cast<sockaddr*>(&storage), &length) != 0) {
      ::close(fd_);
      fd_ = -1;
      return;
    }
    port_ = ntohs(family == AF_INET ? reinterpret_cast<sockaddr_in*>(&storage)->sin_port
                                    : reinterpret_cast<sockaddr_in6*>(&storage)->sin6_port);
  }
  ~HostListener() {
    if (fd_ >= 0) ::close(fd_);
  }
  HostListener(const HostListener&) = delete;
  HostListener& operator=(const HostListener&) = delete;

  bool ok() const { return fd_ >= 0; }
  int port() const { return port_; }
  // A connection that reached this listener, accepted and closed; false when none is pending
  // (the listening socket is nonblocking: accept never waits).
  bool take_pending_connection() const {
    int connection = ::accept4(fd_, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
    if (connection < 0) return false;
    ::close(connection);
    return true;
  }

 private:
  int fd_ = -1;
  int port_ = 0;
};

// True when this host process can connect to address:port (proves the listener is live).
bool host_can_connect(int family, const std::string& address, int port) {
  int fd = ::socket(family, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (fd < 0) return false;
  sockaddr_storage storage{};
  socklen_t length;
  if (family == AF_INET) {
    auto* in = reinterpret_cast<sockaddr_in*>(&storage);
    in->sin_family = AF_INET;
    in->sin_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET, address.c_str(), &in->sin_addr);
    length = sizeof *in;
  } else {
    auto* in6 = reinterpret_cast<sockaddr_in6*>(&storage);
    in6->sin6_family = AF_INET6;
    in6->sin6_port = htons(static_cast<uint16_t>(port));
    ::inet_pton(AF_INET6, address.c_str(), &in6->sin6_addr);
    length = sizeof *in6;
  }
  bool connected = ::connect(fd, reinterpret_cast<sockaddr*>(&storage), length) == 0;
  ::close(fd);
  return connected;
}

// The host's non-loopback IPv4 addresses.
std::vector<std::string> host_ipv4_addresses() {
  std::vector<std::string> addresses;
  ifaddrs* list = nullptr;
  if (::getifaddrs(&list) != 0) return addresses;
  for (ifaddrs* entry = list; entry; entry = entry->ifa_next) {
    if (!entry->ifa_addr || entry->ifa_addr->sa_family != AF_INET) continue;
    if (entry->ifa_flags & IFF_LOOPBACK) continue;
    char text[INET_ADDRSTRLEN] = {};
    ::inet_ntop(AF_INET, &reinterpret_cast<sockaddr_in*>(entry->ifa_addr)->sin_addr, text,
                sizeof text);
    addresses.push_back(text);
  }
  ::freeifaddrs(list);
  return addresses;
}

TEST_F(NamespaceTest, HostListenersAreUnreachableWhileLoopbackInsideWorks) {
  HostListener loopback(AF_INET, "127.0.0.1");
  HostListener any(AF_INET, "0.0.0.0");
  HostListener loopback6(AF_INET6, "::1");  // optional: hosts without IPv6 skip it
  ASSERT_TRUE(loopback.ok() && any.ok());

  struct Target {
    int family;
    std::string address;
    const HostListener* listener;
  };
  std::vector<Target> targets{{AF_INET, "127.0.0.1", &loopback}, {AF_INET, "127.0.0.1", &any}};
  for (const auto& address : host_ipv4_addresses()) targets.push_back({AF_INET, address, &any});
  if (loopback6.ok()) targets.push_back({AF_INET6, "::1", &loopback6});

  // Each listener really accepts connections from the host, so "unreachable" below means the
  // sandbox, not a dead listener.
  for (const auto& target : targets) {
    ASSERT_TRUE(host_can_connect(target.family, target.address, target.listener->port()))
        << target.address << ":" << target.listener->port();
    ASSERT_TRUE(target.listener->take_pending_connection());
  }

  std::string list;
  for (const auto& target : targets)
    list += "(" + std::to_string(target.family == AF_INET ? 2 : 10) + ", '" + target.address +
            "', " + std::to_string(target.listener->port()) + "), ";
  auto result = python(R"PY(
import socket
targets = [)PY" + list +
                       R"PY(]
for i, (family, host, port) in enumerate(targets):
    s = socket.socket(family, socket.SOCK_STREAM)
    s.settimeout(3)
    try:
        s.connect((host, port))
        outcome = 'CONNECTED'
    except OSError as e:
        outcome = type(e).__name__
    finally:
        s.close()
    print('target%d %s:%d %s' % (i, host, port, outcome))
try:
    server = socket.socket()
    server.bind(('127.0.0.1', 0))
    server.listen(1)
    client = socket.create_connection(server.getsockname(), timeout=3)
    accepted, _ = server.accept()
    client.sendall(b'ping')
    print('loopback', accepted.recv(4).decode())
except OSError as e:
    print('loopback', type(e).__name__, e)
print('interfaces', ','.join(sorted(name for _, name in socket.if_nameindex())))
)PY");
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  auto v = parse_lines(result.stdout_data);
  for (size_t i = 0; i < targets.size(); ++i) {
    auto line = v["target" + std::to_string(i)];
    EXPECT_FALSE(line.empty()) << result.stdout_data;
    EXPECT_EQ(line.find("CONNECTED"), std::string::npos)
        << "the sandbox reached a host listener: " << line;
  }
  for (const auto* listener : {&loopback, &any, &loopback6}) {
    if (listener->ok()) {
      EXPECT_FALSE(listener->take_pending_connection())
          << "a connection from the sandbox arrived at host port " << listener->port();
    }
  }
  EXPECT_EQ(v["loopback"], "ping") << "loopback inside the sandbox does not work";
  EXPECT_EQ(v["interfaces"], "lo") << "the sandbox has network interfaces besides lo";
}

TEST_F(NamespaceTest, HostAbstractUnixSocketIsUnreachable) {
  // Abstract unix sockets belong to the network namespace: a host daemon listening on one (as
  // many do) must not be reachable from inside.
  const std::string name = "rlm-sec-" + random_token();
  int fd = ::socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  ASSERT_GE(fd, 0);
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path + 1, name.data(), name.size());
  socklen_t length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&address), length), 0) << std::strerror(errno);
  ASSERT_EQ(::listen(fd, 4), 0);

  auto result = python(R"PY(
import socket
s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
s.settimeout(3)
try:
    s.connect('\0)PY" + name +
                       R"PY(')
    print('abstract CONNECTED')
except OSError as e:
    print('abstract', type(e).__name__)
)PY");
  int pending = ::accept4(fd, nullptr, nullptr, SOCK_NONBLOCK | SOCK_CLOEXEC);
  if (pending >= 0) ::close(pending);
  ::close(fd);
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(parse_lines(result.stdout_data)["abstract"], "ConnectionRefusedError")
      << result.stdout_data;
  EXPECT_LT(pending, 0) << "a connection from the sandbox reached the host's abstract socket";
}

// ---- Filesystem ---------------------------------------------------------------------------------

// A file planted on the host for the duration of a test, removed however the test ends.
class PlantedFile {
 public:
  PlantedFile(std::string path, const std::string& content) : path_(std::move(path)) {
    std::ofstream(path_, std::ios::binary) << content;
  }
  ~PlantedFile() { ::unlink(path_.c_str()); }
  PlantedFile(const PlantedFile&) = delete;
  PlantedFile& operator=(const PlantedFile&) = delete;
  const std::string& path() const { return path_; }
  bool exists() const { return ::access(path_.c_str(), F_OK) == 0; }

 private:
  std::string path_;
};

TEST_F(NamespaceTest, HostSecretsAreAbsent) {
  const std::string token = random_token();
  const std::string content = "rlm-secret-content-" + token;
  PlantedFile root_secret("/root/rlm-secret-" + token, content);
  ASSERT_TRUE(root_secret.exists())
      << "cannot plant " << root_secret.path() << " (this suite runs as root)";
  test::TempDir host_tmp;  // a host /tmp directory: the sandbox's /tmp is its own
  host_tmp.write("rlm-secret-" + token, content);
  const std::string env_name = "RLM_SECRET_ENV_" + token;
  ::setenv(env_name.c_str(), content.c_str(), 1);

  auto result = python(R"PY(
import os
for i, path in enumerate([')PY" +
                       root_secret.path() + "', '" + host_tmp.file("rlm-secret-" + token) +
                       R"PY(']):
    try:
        with open(path, 'rb') as f:
            print('read%d READ %s' % (i, f.read().decode(errors='replace')))
    except OSError as e:
        print('read%d %s' % (i, type(e).__name__))
try:
    print('rootdir', ','.join(sorted(os.listdir('/root'))))
except OSError as e:
    print('rootdir', type(e).__name__)
hits = []
for top, dirs, files in os.walk('/'):
    if top == '/':
        dirs[:] = [d for d in dirs if d not in ('usr', 'bin', 'sbin', 'lib', 'lib64', 'proc', 'sys', 'dev')]
    hits += [os.path.join(top, f) for f in files if f.startswith('rlm-secret-')]
print('hits', ' '.join(hits))
print('env', ' '.join(k for k in os.environ if k.startswith('RLM_SECRET_ENV_')))
)PY");
  ::unsetenv(env_name.c_str());
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  auto v = parse_lines(result.stdout_data);
  EXPECT_EQ(v["read0"], "FileNotFoundError") << "/root secret: " << v["read0"];
  EXPECT_EQ(v["read1"], "FileNotFoundError") << "host /tmp secret: " << v["read1"];
  EXPECT_EQ(v["rootdir"].find("rlm-secret-"), std::string::npos) << v["rootdir"];
  EXPECT_EQ(v["hits"], "") << "planted host files found inside the sandbox";
  EXPECT_EQ(v["env"], "") << "the host's environment leaked into the sandbox";
  EXPECT_EQ(result.stdout_data.find(content), std::string::npos) << result.stdout_data;
}

TEST_F(NamespaceTest, WritesOutsideTmpFailAndTmpIsWritable) {
  const std::string token = random_token();
  const std::vector<std::string> dirs{"/", "/usr", "/etc", "/usr/bin", "/usr/lib", "/bin"};
  std::string list;
  for (const auto& dir : dirs) list += "'" + dir + "', ";
  // A world-writable host file under /usr: only the read-only mount can stop the writes to it.
  // (The VM lanes share the host's / read-only: no host file there can be written at all.)
  if (::access("/usr/lib", W_OK) != 0 && errno == EROFS)
    GTEST_SKIP() << "/usr is read-only on this host (tests/vm shares the host root read-only): "
                    "there is no writable host file to plant";
  PlantedFile planted("/usr/lib/rlm-sectest-" + token, "original");
  ASSERT_TRUE(planted.exists());
  ::chmod(planted.path().c_str(), 0666);

  auto result = python(R"PY(
import errno, os
name = 'rlm-write-)PY" +
                       token + R"PY('
planted = ')PY" + planted.path() +
                       R"PY('
def outcome(action):
    try:
        action()
        return 'SUCCEEDED'
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
for d in [)PY" + list + R"PY(]:
    path = os.path.join(d, name)
    print('create:' + d, outcome(lambda: os.close(os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644))))
    print('mkdir:' + d, outcome(lambda: os.mkdir(path + '.d')))
    print('symlink:' + d, outcome(lambda: os.symlink('/tmp', path + '.l')))
def append(path):
    with open(path, 'ab') as f:
        f.write(b'#')
print('append:/etc/passwd', outcome(lambda: append('/etc/passwd')))
print('append:planted', outcome(lambda: append(planted)))
print('truncate:planted', outcome(lambda: os.truncate(planted, 0)))
print('chmod:planted', outcome(lambda: os.chmod(planted, 0o4777)))
print('rename:planted', outcome(lambda: os.rename(planted, planted + '.moved')))
print('unlink:planted', outcome(lambda: os.unlink(planted)))
# Kernel knobs and devices a container escape goes for: opening them is enough to show they
# are out of reach (nothing is ever written to them).
for path in ['/proc/sysrq-trigger', '/proc/sys/kernel/core_pattern', '/proc/sys/kernel/modprobe',
             '/proc/sys/vm/drop_caches', '/sys/kernel/uevent_helper', '/sys/fs/cgroup/cgroup.procs']:
    print('open_w:' + path, outcome(lambda: os.close(os.open(path, os.O_WRONLY))))
for path in ['/proc/kcore', '/dev/mem', '/dev/kmem', '/dev/port', '/dev/kmsg', '/dev/sda', '/dev/vda']:
    print('open_r:' + path, outcome(lambda: os.close(os.open(path, os.O_RDONLY))))
with open('/tmp/' + name, 'w') as f:
    f.write('x' * 4096)
with open('/tmp/' + name) as f:
    print('tmp', 'ok' if f.read() == 'x' * 4096 else 'MISMATCH')
)PY");

  // Whatever the sandbox managed to change on the host is undone before anything is asserted.
  std::vector<std::string> leaked;
  for (const auto& dir : dirs)
    for (const auto& suffix : {"", ".d", ".l"}) {
      std::string host_path = (dir == "/" ? "" : dir) + "/rlm-write-" + token + suffix;
      std::error_code ec;
      if (std::filesystem::symlink_status(host_path, ec).type() !=
          std::filesystem::file_type::not_found) {
        leaked.push_back(host_path + " created");
        std::filesystem::remove_all(host_path, ec);
      }
    }
  if (::unlink((planted.path() + ".moved").c_str()) == 0) leaked.push_back("planted file renamed");
  if (::unlink(("/tmp/rlm-write-" + token).c_str()) == 0)
    leaked.push_back("the sandbox's /tmp file landed in the host's /tmp");
  struct stat st {};
  if (::stat(planted.path().c_str(), &st) != 0)
    leaked.push_back("planted file removed");
  else if ((st.st_mode & 07777) != 0666)
    leaked.push_back("planted file's mode changed");
  if (read_file(planted.path()) != "original") leaked.push_back("planted file modified");

  ASSERT_EQ(result.status, Status::ok) << describe(result);
  auto v = parse_lines(result.stdout_data);
  for (const auto& dir : dirs)
    for (const char* action : {"create:", "mkdir:", "symlink:"}) {
      auto key = action + dir;
      EXPECT_FALSE(v[key].empty()) << key << " missing: " << result.stdout_data;
      EXPECT_NE(v[key], "SUCCEEDED") << key << " inside the sandbox succeeded";
      // Read-only mounts, not just file permissions, stop them (the root is remounted read-only
      // and every system bind is read-only).
      EXPECT_EQ(v[key], "EROFS") << key;
    }
  for (const char* key : {"append:/etc/passwd", "append:planted", "truncate:planted",
                          "chmod:planted", "rename:planted", "unlink:planted"}) {
    EXPECT_FALSE(v[key].empty()) << key << " missing: " << result.stdout_data;
    EXPECT_NE(v[key], "SUCCEEDED") << key << " inside the sandbox succeeded";
    EXPECT_EQ(v[key], "EROFS") << key;
  }
  for (const char* key :
       {"open_w:/proc/sysrq-trigger", "open_w:/proc/sys/kernel/core_pattern",
        "open_w:/proc/sys/kernel/modprobe", "open_w:/proc/sys/vm/drop_caches",
        "open_w:/sys/kernel/uevent_helper", "open_w:/sys/fs/cgroup/cgroup.procs",
        "open_r:/proc/kcore", "open_r:/dev/mem", "open_r:/dev/kmem", "open_r:/dev/port",
        "open_r:/dev/kmsg", "open_r:/dev/sda", "open_r:/dev/vda"}) {
    EXPECT_FALSE(v[key].empty()) << key << " missing: " << result.stdout_data;
    EXPECT_NE(v[key], "SUCCEEDED") << key << " inside the sandbox succeeded";
  }
  EXPECT_EQ(v["tmp"], "ok") << describe(result);
  for (const auto& what : leaked) ADD_FAILURE() << "the sandbox changed the host: " << what;
}

// Fills /tmp with 1 MiB writes spread over files smaller than limits.file_size_bytes, so only the
// tmpfs size can stop it. Its files go in a directory of their own; should the sandbox's /tmp be
// the host's, the destructor removes them and the test fails.
class TmpFill {
 public:
  TmpFill() : dir_("/tmp/rlm-fill-" + random_token()) {}
  ~TmpFill() {
    std::error_code ec;
    std::filesystem::remove_all(dir_, ec);
  }
  TmpFill(const TmpFill&) = delete;
  TmpFill& operator=(const TmpFill&) = delete;
  bool landed_on_host() const { return ::access(dir_.c_str(), F_OK) == 0; }

  std::string script(int files, int mib_per_file) const {
    return R"PY(
import errno, os
chunk = b'\xa5' * (1 << 20)
total, err = 0, 'none'
os.mkdir(')PY" +
           dir_ + R"PY(')
try:
    for i in range()PY" +
           std::to_string(files) + R"PY():
        fd = os.open(')PY" +
           dir_ + R"PY(/fill%d' % i, os.O_WRONLY | os.O_CREAT, 0o600)
        try:
            for _ in range()PY" +
           std::to_string(mib_per_file) + R"PY():
                total += os.write(fd, chunk)
        finally:
            os.close(fd)
except OSError as e:
    err = errno.errorcode.get(e.errno, str(e.errno))
print('total', total)
print('err', err)
)PY";
  }

 private:
  std::string dir_;
};

TEST_F(NamespaceTest, TmpIsCappedAtTheDefaultTmpfsBytes) {
  const auto cap = policy_.limits.tmpfs_bytes;
  ASSERT_EQ(cap, 64ull << 20) << "the shipped default policy's limits.tmpfs_bytes changed";
  TmpFill fill;
  auto result = python(fill.script(12, 8));  // 96 MiB in 8 MiB files
  EXPECT_FALSE(fill.landed_on_host()) << "the sandbox's /tmp is the host's /tmp";
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  auto v = parse_lines(result.stdout_data);
  EXPECT_EQ(v["err"], "ENOSPC") << result.stdout_data;
  auto total = std::stoull(v["total"]);
  EXPECT_LE(total, cap) << "wrote more than limits.tmpfs_bytes into /tmp";
  EXPECT_GE(total, cap - (4ull << 20)) << "/tmp holds much less than limits.tmpfs_bytes";
}

TEST_F(NamespaceTest, TmpFollowsThePolicysTmpfsBytes) {
  Policy policy = policy_;
  policy.limits.tmpfs_bytes = 8ull << 20;
  TmpFill fill;
  auto result = python(fill.script(12, 1), policy);  // 12 MiB
  EXPECT_FALSE(fill.landed_on_host()) << "the sandbox's /tmp is the host's /tmp";
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  auto v = parse_lines(result.stdout_data);
  EXPECT_EQ(v["err"], "ENOSPC") << result.stdout_data;
  auto total = std::stoull(v["total"]);
  EXPECT_LE(total, 8ull << 20);
  EXPECT_GE(total, 6ull << 20);
}

// ---- Privileges ---------------------------------------------------------------------------------

TEST_F(NamespaceTest, ProcStatusShowsNoCapabilitiesNoNewPrivsAndASeccompFilter) {
  auto result = run({"cat", "/proc/self/status"});
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  const auto& status = result.stdout_data;
  EXPECT_EQ(status_field(status, "CapEff"), "0000000000000000");
  EXPECT_EQ(status_field(status, "CapPrm"), "0000000000000000");
  EXPECT_EQ(status_field(status, "CapInh"), "0000000000000000");
  EXPECT_EQ(status_field(status, "CapAmb"), "0000000000000000");
  EXPECT_EQ(status_field(status, "CapBnd"), "0000000000000000");
  EXPECT_EQ(status_field(status, "NoNewPrivs"), "1");
  EXPECT_EQ(status_field(status, "Seccomp"), "2");
  auto filters = status_field(status, "Seccomp_filters");
  if (!filters.empty()) {
    EXPECT_GE(std::stoi(filters), 1);
  }
  if (HasFailure()) ADD_FAILURE() << "/proc/self/status inside the sandbox:\n" << status;
}

// The host ids the sandbox user may be mapped to: rootless, the caller's own; under a root
// runtime, one of the sandbox uid range (RLM_SANDBOX_UID_RANGE, by default
// 1879048192-1879113727), its own while it lives -- never root, never nobody (65534).
bool is_sandbox_host_id(unsigned long id) {
  if (::geteuid() != 0) return id == ::geteuid();
  unsigned long first = 1879048192, last = 1879048192 + 65535;
  if (const char* range = std::getenv("RLM_SANDBOX_UID_RANGE"))
    if (std::sscanf(range, "%lu-%lu", &first, &last) != 2) return false;
  return id != 0 && id != 65534 && first <= id && id <= last;
}

TEST_F(NamespaceTest, PayloadIsUid1000AndItsFilesBelongToTheMappedHostId) {
  SharedDir shared;
  auto result = python(R"PY(
import errno, os
print('uid', os.getuid(), os.geteuid())
print('gid', os.getgid(), os.getegid())
print('uid_map', ';'.join(' '.join(l.split()) for l in open('/proc/self/uid_map').read().splitlines()))
print('gid_map', ';'.join(' '.join(l.split()) for l in open('/proc/self/gid_map').read().splitlines()))
with open('/out/file', 'w') as f:
    f.write('from the sandbox')
os.mkdir('/out/dir')
for name, call in [('setuid0', lambda: os.setuid(0)), ('setgid0', lambda: os.setgid(0)),
                   ('setresuid0', lambda: os.setresuid(0, 0, 0))]:
    try:
        call()
        print(name, 'SUCCEEDED', os.getuid())
    except OSError as e:
        print(name, errno.errorcode.get(e.errno, str(e.errno)))
)PY",
                       with_rw_bind(shared.path(), "/out"));
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  auto v = parse_lines(result.stdout_data);
  EXPECT_EQ(v["uid"], "1000 1000");
  EXPECT_EQ(v["gid"], "1000 1000");
  // EPERM (no capability) or EINVAL (id 0 is not even mapped in the sandbox's user namespace).
  for (const char* key : {"setuid0", "setgid0", "setresuid0"})
    EXPECT_TRUE(v[key] == "EPERM" || v[key] == "EINVAL") << key << ": " << v[key];

  // No line of either map reaches host id 0 ("inside outside count").
  for (const char* key : {"uid_map", "gid_map"}) {
    std::istringstream lines(v[key]);
    std::string line;
    ASSERT_FALSE(v[key].empty()) << key;
    while (std::getline(lines, line, ';')) {
      unsigned long inside = 0, outside = 0, count = 0;
      ASSERT_EQ(std::sscanf(line.c_str(), "%lu %lu %lu", &inside, &outside, &count), 3) << line;
      EXPECT_TRUE(outside > 0 || count == 0) << key << " maps host id 0: " << line;
      if (std::string(key) == "uid_map" && inside <= 1000 && 1000 < inside + count) {
        EXPECT_TRUE(is_sandbox_host_id(outside + (1000 - inside))) << line;
      }
    }
  }

  for (const char* name : {"file", "dir"}) {
    struct stat st {};
    ASSERT_EQ(::lstat(shared.file(name).c_str(), &st), 0) << name << " was not created";
    EXPECT_NE(st.st_uid, 0u) << name << " is owned by host root";
    EXPECT_NE(st.st_gid, 0u) << name << " belongs to host group root";
    EXPECT_TRUE(is_sandbox_host_id(st.st_uid)) << name << " belongs to " << st.st_uid;
    EXPECT_TRUE(is_sandbox_host_id(st.st_gid)) << name << " belongs to group " << st.st_gid;
  }
}

TEST_F(NamespaceTest, CliBindFilesBelongToTheMappedHostId) {
  SharedDir shared;
  auto out = cli({"run", "--bind", shared.path() + ":/out", "--", "sh", "-c",
                  "id -u; id -g; echo hi > /out/cli-file"});
  ASSERT_EQ(out.exit_code, 0) << out.err;
  EXPECT_EQ(out.out, "1000\n1000\n");
  struct stat st {};
  ASSERT_EQ(::lstat(shared.file("cli-file").c_str(), &st), 0);
  EXPECT_NE(st.st_uid, 0u);
  EXPECT_NE(st.st_gid, 0u);
  EXPECT_TRUE(is_sandbox_host_id(st.st_uid)) << st.st_uid;
}

// ---- Dangerous syscalls -------------------------------------------------------------------------

TEST_F(NamespaceTest, DangerousSyscallsFailWithEperm) {
  auto result = python(R"PY(
import ctypes, errno, os, shutil, signal, tempfile, time
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
NR = {
    'x86_64': dict(mount=165, umount2=166, pivot_root=155, ptrace=101, unshare=272, setns=308,
                   clone=56, bpf=321, keyctl=250, add_key=248, request_key=249,
                   perf_event_open=298, userfaultfd=323, io_uring_setup=425,
                   open_by_handle_at=304, init_module=175, process_vm_readv=310),
    'aarch64': dict(mount=40, umount2=39, pivot_root=41, ptrace=117, unshare=97, setns=268,
                    clone=220, bpf=280, keyctl=219, add_key=217, request_key=218,
                    perf_event_open=241, userfaultfd=282, io_uring_setup=425,
                    open_by_handle_at=265, init_module=105, process_vm_readv=270),
}[os.uname().machine]
L, S = ctypes.c_long, ctypes.c_char_p
def report(label, r, e):
    print(label, r, errno.errorcode.get(e, str(e)) if r < 0 else 'none', flush=True)
def attempt(label, name, *args):
    ctypes.set_errno(0)
    r = libc.syscall(L(NR[name]), *args)
    e = ctypes.get_errno()
    if name == 'clone' and r == 0:
        os._exit(0)  # a child that should never have existed
    report(label, r, e)
    return r

# Every attempt is aimed so that, should it succeed against a broken sandbox (one still in the
# host's namespaces, as root), it harms nothing but this payload's own scratch directories.
scratch = tempfile.mkdtemp(prefix='rlm-sectest-')
for d in ('a', 'b', 'newroot/old'):
    os.makedirs(os.path.join(scratch, d))
A, B, NEWROOT = (os.path.join(scratch, d).encode() for d in ('a', 'b', 'newroot'))
if attempt('mount', 'mount', S(b'none'), S(A), S(b'tmpfs'), L(0), L(0)) == 0:
    libc.umount2(S(A), 2)
if attempt('mount_bind', 'mount', S(A), S(B), L(0), L(0x1000), L(0)) == 0:  # MS_BIND
    libc.umount2(S(B), 2)
attempt('umount2', 'umount2', S(A), L(2 | 8))  # MNT_DETACH | UMOUNT_NOFOLLOW, not a mount point
attempt('pivot_root', 'pivot_root', S(NEWROOT), S(NEWROOT + b'/old'))  # not a mount point

PTRACE_ATTACH = 16
if os.getpid() < 100:  # in a PID namespace, PID 1 is the sandbox's own init
    attempt('ptrace_init', 'ptrace', L(PTRACE_ATTACH), L(1), L(0), L(0))
else:
    print('ptrace_init NOT-ATTEMPTED (no PID namespace: PID 1 is the host init)')
target = os.fork()
if target == 0:
    time.sleep(30)
    os._exit(0)
attempt('ptrace_child', 'ptrace', L(PTRACE_ATTACH), L(target), L(0), L(0))
sibling = os.fork()
if sibling == 0:
    ctypes.set_errno(0)
    r = libc.syscall(L(NR['ptrace']), L(PTRACE_ATTACH), L(target), L(0), L(0))
    os._exit(0 if r == 0 else min(ctypes.get_errno(), 255) or 255)
code = os.waitstatus_to_exitcode(os.waitpid(sibling, 0)[1])
report('ptrace_sibling', 0 if code == 0 else -1, code)
buf = ctypes.create_string_buffer(64)
iov = (ctypes.c_void_p * 2)(ctypes.cast(buf, ctypes.c_void_p), ctypes.c_void_p(64))
attempt('process_vm_readv', 'process_vm_readv', L(target), iov, L(1), iov, L(1), L(0))
os.kill(target, signal.SIGKILL)
os.waitpid(target, 0)

CLONE_NEWNS, CLONE_NEWUSER, CLONE_NEWNET, CLONE_NEWPID = 0x20000, 0x10000000, 0x40000000, 0x20000000
# (clone and setns first: a successful unshare would change what they test)
attempt('clone_newuser', 'clone', L(CLONE_NEWUSER | signal.SIGCHLD), L(0), L(0), L(0), L(0))
attempt('clone_newpid', 'clone', L(CLONE_NEWPID | signal.SIGCHLD), L(0), L(0), L(0), L(0))
fd = os.open('/proc/self/ns/net', os.O_RDONLY)
attempt('setns', 'setns', L(fd), L(0))
attempt('unshare_net', 'unshare', L(CLONE_NEWNET))
attempt('unshare_mount', 'unshare', L(CLONE_NEWNS))
attempt('unshare_user', 'unshare', L(CLONE_NEWUSER))

attr = ctypes.create_string_buffer(128)
ctypes.memmove(attr, (ctypes.c_uint32 * 4)(1, 4, 4, 1), 16)  # BPF_MAP_TYPE_HASH, 4, 4, 1
attempt('bpf', 'bpf', L(0), attr, L(128))  # BPF_MAP_CREATE
attempt('keyctl', 'keyctl', L(0), L(-3), L(1))  # KEYCTL_GET_KEYRING_ID(session, create)
attempt('add_key', 'add_key', S(b'user'), S(b'rlm'), S(b'x'), L(1), L(-3))
attempt('request_key', 'request_key', S(b'user'), S(b'rlm'), S(None), L(0))
perf = ctypes.create_string_buffer(128)
ctypes.memmove(perf, (ctypes.c_uint32 * 2)(1, 128), 8)  # PERF_TYPE_SOFTWARE, size
attempt('perf_event_open', 'perf_event_open', perf, L(0), L(-1), L(-1), L(0))
attempt('userfaultfd', 'userfaultfd', L(0))
params = ctypes.create_string_buffer(120)
attempt('io_uring_setup', 'io_uring_setup', L(1), params)
handle = ctypes.create_string_buffer(136)
ctypes.memmove(handle, (ctypes.c_uint32 * 2)(8, 1), 8)
attempt('open_by_handle_at', 'open_by_handle_at', L(-100), handle, L(0))
attempt('init_module', 'init_module', L(0), L(0), S(b''))
shutil.rmtree(scratch, ignore_errors=True)
print('done', flush=True)
)PY");
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  auto v = parse_lines(result.stdout_data);
  EXPECT_EQ(v.count("done"), 1u) << "the probe did not finish: " << describe(result);
  for (const char* key :
       {"mount",          "mount_bind",        "umount2",          "pivot_root",      "ptrace_init",
        "ptrace_child",   "ptrace_sibling",    "process_vm_readv", "unshare_user",    "unshare_net",
        "unshare_mount",  "clone_newuser",     "clone_newpid",     "setns",           "bpf",
        "keyctl",         "add_key",           "request_key",      "perf_event_open", "userfaultfd",
        "io_uring_setup", "open_by_handle_at", "init_module"}) {
    ASSERT_TRUE(v.count(key)) << key << " was not attempted: " << describe(result);
    EXPECT_EQ(v[key], "-1 EPERM") << key << " from inside the sandbox";
  }
}

TEST_F(NamespaceTest, UnshareCommandFails) {
  for (const char* flag : {"-U", "-n", "-m", "-p"}) {
    auto result = run({"unshare", flag, "--fork", "true"});
    EXPECT_EQ(result.status, Status::exit_nonzero) << flag << ": " << describe(result);
    EXPECT_NE(result.stderr_data.find("Operation not permitted"), std::string::npos)
        << flag << ": " << result.stderr_data;
  }
}

TEST_F(NamespaceTest, UtsNamespaceHasThePolicysHostname) {
  char host_name[256] = {};
  ::gethostname(host_name, sizeof host_name - 1);
  auto result = python("import socket; print(socket.gethostname())");
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(result.stdout_data, policy_.hostname + "\n");
  auto sethost = python(
      "import socket\ntry:\n    socket.sethostname('rlm-escaped')\n    print('SUCCEEDED')\n"
      "except OSError as e:\n    print(type(e).__name__)");
  ASSERT_EQ(sethost.status, Status::ok) << describe(sethost);
  EXPECT_EQ(sethost.stdout_data, "PermissionError\n");
  char after[256] = {};
  ::gethostname(after, sizeof after - 1);
  if (std::string(after) != host_name) {
    ::sethostname(host_name, std::strlen(host_name));  // undo before failing
    ADD_FAILURE() << "the sandbox renamed the host to '" << after << "'";
  }
}

TEST_F(NamespaceTest, CliDefaultRunUsesTheNamespaceBackend) {
  auto out = cli({"run", "--json", "--", "true"});
  ASSERT_EQ(out.exit_code, 0) << out.err;
  auto result = nlohmann::json::parse(out.out);
  EXPECT_EQ(result["backend"], "namespace");
  EXPECT_EQ(result["status"], "ok");
  EXPECT_EQ(result["policy"], "default");
}

// ---- Socket families and syscalls by number -----------------------------------------------------

TEST_F(NamespaceTest, VsockCannotBindOrListenUnderNetworkNone) {
  // Control: this host has a vsock transport (a network namespace does not isolate vsock, so a
  // listener inside would sit in the machine's real vsock port space).
  const int host = ::socket(AF_VSOCK, SOCK_STREAM | SOCK_CLOEXEC, 0);
  if (host < 0)
    GTEST_SKIP() << "no AF_VSOCK on this host (" << std::strerror(errno)
                 << "); nothing for a sandbox to reach";
  ::close(host);
  ASSERT_EQ(policy_.network, Network::none);
  const std::string port =
      std::to_string(20000 + std::stoul(random_token().substr(0, 4), nullptr, 16) % 30000);
  auto result = python(R"PY(
import errno, socket
def outcome(make):
    try:
        s = make()
        return 'CREATED'
    except OSError as e:
        return errno.errorcode.get(e.errno, str(e.errno))
def listen():
    s = socket.socket(socket.AF_VSOCK, socket.SOCK_STREAM)
    s.bind((socket.VMADDR_CID_ANY, )PY" +
                       port + R"PY())
    s.listen(1)
    print('vsock_port', s.getsockname()[1], flush=True)
    return s
print('vsock_listen', outcome(listen))
print('vsock_dgram', outcome(lambda: socket.socket(socket.AF_VSOCK, socket.SOCK_DGRAM)))
print('vsock_pair', outcome(lambda: socket.socketpair(socket.AF_VSOCK, socket.SOCK_STREAM)))
for name, kind in [('AF_PACKET', socket.SOCK_RAW), ('AF_ALG', socket.SOCK_SEQPACKET),
                   ('AF_CAN', socket.SOCK_RAW), ('AF_TIPC', socket.SOCK_RDM),
                   ('AF_RDS', socket.SOCK_SEQPACKET), ('AF_BLUETOOTH', socket.SOCK_STREAM)]:
    print('family_' + name, outcome(lambda: socket.socket(getattr(socket, name), kind)))
print('family_AF_UNIX', outcome(lambda: socket.socketpair(socket.AF_UNIX)))
print('family_AF_INET', outcome(lambda: socket.socket(socket.AF_INET, socket.SOCK_DGRAM)))
print('family_AF_NETLINK', outcome(lambda: socket.socket(socket.AF_NETLINK, socket.SOCK_RAW)))
)PY");
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  auto v = parse_lines(result.stdout_data);
  EXPECT_EQ(v["vsock_listen"], "EAFNOSUPPORT")
      << "a sandbox under network: none listened on vsock port " << v["vsock_port"];
  EXPECT_EQ(v["vsock_dgram"], "EAFNOSUPPORT");
  EXPECT_EQ(v["vsock_pair"], "EAFNOSUPPORT");
  for (const char* family : {"AF_PACKET", "AF_ALG", "AF_CAN", "AF_TIPC", "AF_RDS", "AF_BLUETOOTH"})
    EXPECT_EQ(v[std::string("family_") + family], "EAFNOSUPPORT") << family;
  for (const char* family : {"AF_UNIX", "AF_INET", "AF_NETLINK"})
    EXPECT_EQ(v[std::string("family_") + family], "CREATED") << family;
}

TEST_F(NamespaceTest, EveryPreambleSyscallIsDeniedByNumberInside) {
  std::string table;
  for (const auto& d : seccomp::test::kPreambleDeniedByNumber)
    table += "(" + std::to_string(d.number) + ", '" + d.name + "'), ";
  // Junk arguments (the bad pointer 1): a call the filter let through would fail with EFAULT,
  // EBADF or EINVAL and do nothing.
  auto result = python(R"PY(
import ctypes
libc = ctypes.CDLL(None, use_errno=True)
libc.syscall.restype = ctypes.c_long
L = ctypes.c_long
for nr, name in [)PY" + table +
                       R"PY(]:
    ctypes.set_errno(0)
    r = libc.syscall(L(nr), L(1), L(1), L(1), L(1), L(1), L(1))
    print(name, r, ctypes.get_errno() if r < 0 else 0, flush=True)
# Without a capability the kernel itself answers many of those with EPERM; these calls it would
# carry out: open_tree_attr and open_tree without OPEN_TREE_CLONE just return an O_PATH fd of /.
for nr, name in [(467, 'open_tree_attr'), (428, 'open_tree')]:
    ctypes.set_errno(0)
    r = libc.syscall(L(nr), L(-100), ctypes.c_char_p(b'/'), L(0), L(0), L(0))
    print(name + '_plain', 'FD' if r >= 0 else r, ctypes.get_errno() if r < 0 else 0, flush=True)
print('done')
)PY");
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  auto v = parse_lines(result.stdout_data);
  ASSERT_EQ(v.count("done"), 1u) << describe(result);
  for (const auto& d : seccomp::test::kPreambleDeniedByNumber)
    EXPECT_EQ(v[d.name], "-1 " + std::to_string(d.error))
        << d.name << " (syscall " << d.number << ") from inside the sandbox";
  EXPECT_EQ(v["open_tree_attr_plain"], "-1 " + std::to_string(EPERM));
  EXPECT_EQ(v["open_tree_plain"], "-1 " + std::to_string(EPERM));
}

// ---- Paths through links the payload planted ----------------------------------------------------

// A host path the attacks below aim at, removed (and reported) if it appears.
class HostTarget {
 public:
  HostTarget() : path_("/tmp/rlm-escape-" + random_token()) {}
  ~HostTarget() { removed(); }
  HostTarget(const HostTarget&) = delete;
  HostTarget& operator=(const HostTarget&) = delete;
  const std::string& path() const { return path_; }
  std::string name() const { return path_.substr(5); }
  // True when it existed (it is gone afterwards).
  bool removed() const {
    std::error_code ec;
    const bool existed =
        std::filesystem::symlink_status(path_, ec).type() != std::filesystem::file_type::not_found;
    std::filesystem::remove_all(path_, ec);
    return existed;
  }

 private:
  std::string path_;
};

TEST_F(NamespaceTest, CliWorkdirThroughAPlantedLinkCreatesNothingOnTheHost) {
  SharedDir shared;
  HostTarget target;
  // Run 1 plants a link to where the host root sits while the sandbox is built.
  auto plant = cli({"run", "--bind", shared.path() + ":/data", "--", "ln", "-s",
                    "/.rlm-old-root/tmp", "/data/w"});
  ASSERT_EQ(plant.exit_code, 0) << plant.err;
  ASSERT_TRUE(std::filesystem::is_symlink(shared.file("w")));
  // Run 2 is given a workdir through it.
  auto run2 = cli({"run", "--bind", shared.path() + ":/data", "--workdir",
                   "/data/w/" + target.name(), "--", "true"});
  EXPECT_FALSE(target.removed()) << "run 2 created " << target.path() << " on the host";
  EXPECT_EQ(run2.exit_code, 125) << run2.out << run2.err;
  EXPECT_NE(run2.err.find("workdir"), std::string::npos) << run2.err;
}

TEST_F(NamespaceTest, MountTargetsThroughAPlantedLinkCreateNothingOnTheHost) {
  SharedDir shared;
  auto plant = python("import os\nos.symlink('/.rlm-old-root/tmp', '/data/w')\n",
                      with_rw_bind(shared.path(), "/data"));
  ASSERT_EQ(plant.status, Status::ok) << describe(plant);
  shared.write("file", "x");
  for (const bool file : {false, true}) {
    HostTarget target;
    Policy policy = with_rw_bind(shared.path(), "/data");
    Mount mount;
    mount.target = "/data/w/" + target.name();
    if (file) {  // a file bind: its mount point is a file the plan creates
      mount.type = Mount::Type::bind;
      mount.source = shared.file("file");
    } else {
      mount.type = Mount::Type::tmpfs;
    }
    policy.filesystem.mounts.push_back(mount);
    auto result = run({"true"}, policy);
    EXPECT_FALSE(target.removed()) << (file ? "a file bind" : "a tmpfs") << " target created "
                                   << target.path() << " on the host";
    EXPECT_EQ(result.status, Status::sandbox_error) << describe(result);
  }
}

TEST_F(NamespaceTest, BindSourceThroughALinkAnEarlierSandboxPlantedIsRefused) {
  SharedDir shared;
  auto plant =
      python("import os\nos.symlink('/etc', '/data/src')\n", with_rw_bind(shared.path(), "/data"));
  ASSERT_EQ(plant.status, Status::ok) << describe(plant);
  Policy policy = policy_;
  Mount mount;
  mount.source = shared.file("src");
  mount.target = "/leak";
  mount.type = Mount::Type::bind;
  policy.filesystem.mounts.push_back(mount);
  auto result = run({"ls", "/leak"}, policy);
  EXPECT_EQ(result.stdout_data.find("passwd"), std::string::npos)
      << "the host's /etc was bound into the sandbox: " << result.stdout_data;
  EXPECT_EQ(result.status, Status::sandbox_error) << describe(result);
  EXPECT_NE(result.detail.find(".source"), std::string::npos) << result.detail;
}

// ---- Host information in /proc ------------------------------------------------------------------

TEST_F(NamespaceTest, ProcShowsNothingOfTheHostsBootIdCmdlineLoadPressureOrLocks) {
  const std::string host_boot_id = read_file("/proc/sys/kernel/random/boot_id");
  const std::string host_cmdline = read_file("/proc/cmdline");
  ASSERT_FALSE(host_boot_id.empty());
  ASSERT_FALSE(host_cmdline.empty());
  auto result = python(R"PY(
import os
def show(path):
    try:
        with open(path, 'rb') as f:
            data = f.read()
        return repr(data.decode(errors='replace'))
    except OSError as e:
        return type(e).__name__
for key, path in [('boot_id', '/proc/sys/kernel/random/boot_id'), ('cmdline', '/proc/cmdline'),
                  ('loadavg', '/proc/loadavg'), ('locks', '/proc/locks'),
                  ('interrupts', '/proc/interrupts'), ('keys', '/proc/keys'),
                  ('timer_list', '/proc/timer_list')]:
    print(key, show(path))
try:
    print('pressure', repr(sorted(os.listdir('/proc/pressure'))))
except OSError as e:
    print('pressure', type(e).__name__)
for name in ('cpu', 'memory', 'io'):
    print('pressure_' + name, show('/proc/pressure/' + name))
)PY");
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  auto v = parse_lines(result.stdout_data);
  EXPECT_EQ(v["boot_id"], "''") << "the host's boot_id is " << host_boot_id;
  EXPECT_EQ(v["cmdline"], "''") << "the host's command line is " << host_cmdline;
  // loadavg's 4th field is the host's running/total thread count.
  EXPECT_EQ(v["loadavg"], "''");
  EXPECT_EQ(v["locks"], "''");
  EXPECT_EQ(v["interrupts"], "''");
  EXPECT_EQ(v["keys"], "''");
  EXPECT_EQ(v["timer_list"], "''");
  EXPECT_EQ(v["pressure"], "[]");
  for (const char* name : {"pressure_cpu", "pressure_memory", "pressure_io"})
    EXPECT_EQ(v[name], "FileNotFoundError") << name;
  EXPECT_EQ(result.stdout_data.find(host_boot_id.substr(0, 36)), std::string::npos);
}

TEST_F(NamespaceTest, PsAndProcSelfStillWorkWithProcMasked) {
  auto result = run({"sh", "-c",
                     "ps -eo pid,comm; python3 -c 'import os; "
                     "print(\"self\", open(\"/proc/self/stat\").read().split()[1], "
                     "len(open(\"/proc/self/status\").read()) > 0, os.cpu_count() > 0)'; "
                     "grep -c . /proc/meminfo /proc/uptime; "
                     "top -b -n1 >/dev/null && echo top-ok; uptime >/dev/null && echo uptime-ok"});
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_NE(result.stdout_data.find(" ps\n"), std::string::npos) << result.stdout_data;
  EXPECT_NE(result.stdout_data.find("self (python3) True True"), std::string::npos)
      << result.stdout_data;
  EXPECT_NE(result.stdout_data.find("/proc/uptime:1"), std::string::npos) << result.stdout_data;
  EXPECT_NE(result.stdout_data.find("top-ok\nuptime-ok\n"), std::string::npos)
      << result.stdout_data;
}

}  // namespace
}  // namespace rlm::sectest
