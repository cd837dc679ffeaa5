// Escapes attempted through the landlock backend, each asserted to fail, next to a control that
// shows the same attempt works where the backend allows it (so no test passes because the attempt
// never could have worked). Everything the attempts aim at -- secrets, listeners, the process to
// signal -- is made by this test process itself, outside the sandbox: the binary runs alone on
// the host and inside a default Docker container (docs/landlock-backend.md, "Tests").
#include <arpa/inet.h>
#include <fcntl.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <initializer_list>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/request.hpp"
#include "rlm_sandbox/result.hpp"
#include "support/host_probes.hpp"

namespace rlm {
namespace {

namespace fs = std::filesystem;

#define REQUIRE_BACKEND(backend)                                         \
  auto backend = make_backend("landlock");                               \
  ASSERT_NE(backend, nullptr);                                           \
  if (const auto why = backend->unavailable_reason(); !why.empty()) {    \
    GTEST_SKIP() << "the landlock backend is unavailable here: " << why; \
  }

Policy landlock_policy() {
  Policy policy = load_policy("default");
  policy.backend.prefer = {"landlock"};
  return policy;
}

Mount read_only_bind(const std::string& path) {
  Mount mount;
  mount.source = mount.target = path;
  mount.type = Mount::Type::bind;
  mount.readonly = true;
  return mount;
}

Result run_python(Backend& backend, const Policy& policy, const std::string& code) {
  Request request;
  request.argv = {"python3", "-c", code};
  return backend.run(request, policy);
}

std::string describe(const Result& result) {
  return result.to_json().dump();
}

// A directory of this test's own (removed after), world-readable and world-writable, so that
// only the sandbox's confinement -- not file permissions -- can stand between the payload and it.
class PlantedDir {
 public:
  PlantedDir() {
    char pattern[] = "/tmp/rlm-landlock-planted-XXXXXX";
    if (!mkdtemp(pattern)) ADD_FAILURE() << "mkdtemp: " << std::strerror(errno);
    path_ = pattern;
    chmod(path_.c_str(), 0777);
  }
  ~PlantedDir() {
    std::error_code ignored;
    fs::remove_all(path_, ignored);
  }
  std::string plant(const std::string& name, const std::string& text) const {
    const std::string file = path_ + "/" + name;
    std::ofstream(file) << text;
    chmod(file.c_str(), 0666);
    return file;
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

TEST(LandlockEscape, ReadingAPlantedHostSecretOutsideTheAllowedPathsFails) {
  REQUIRE_BACKEND(backend);
  PlantedDir outside, allowed;
  const std::string secret = outside.plant("secret", "landlock-secret-7f3a");
  const std::string visible = allowed.plant("visible", "landlock-visible-19c2");
  Policy policy = landlock_policy();
  policy.filesystem.mounts.push_back(read_only_bind(allowed.path()));
  const std::string code = "import sys\nfor p in sys.argv[1:] or ['" + secret + "', '" + visible +
                           "']:\n"
                           "  try: print(open(p).read())\n"
                           "  except OSError as e: print('denied', p, e.errno)\n";
  const Result result = run_python(*backend, policy, code);
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(result.stdout_data.find("landlock-secret-7f3a"), std::string::npos) << describe(result);
  EXPECT_NE(result.stdout_data.find("denied " + secret), std::string::npos) << describe(result);
  // Control: the file under the policy's bind is read.
  EXPECT_NE(result.stdout_data.find("landlock-visible-19c2"), std::string::npos)
      << describe(result);
  // Neither a link in the sandbox's own directory nor /proc's magic links lead out.
  const std::string detour = "import os\nos.symlink('" + secret +
                             "', 'link')\n"
                             "for p in ['link', '/proc/self/root" +
                             secret + "', '/proc/1/root" + secret +
                             "']:\n"
                             "  try: print(open(p).read())\n"
                             "  except OSError as e: print('denied', e.errno)\n";
  const Result through = run_python(*backend, policy, detour);
  EXPECT_EQ(through.stdout_data.find("landlock-secret-7f3a"), std::string::npos)
      << describe(through);
  EXPECT_NE(through.stdout_data.find("denied"), std::string::npos) << describe(through);
}

TEST(LandlockEscape, WritingOutsideTheRunsTmpFails) {
  REQUIRE_BACKEND(backend);
  PlantedDir outside, bound_ro;
  const std::string existing = outside.plant("existing", "original");
  Policy policy = landlock_policy();
  policy.filesystem.mounts.push_back(read_only_bind(bound_ro.path()));
  const std::string code =
      "import os\n"
      "for p in ['" +
      outside.path() + "/created', '" + existing + "', '" + bound_ro.path() +
      "/created', '/tmp/rlm-landlock-escape-" + std::to_string(getpid()) +
      "']:\n"
      "  try:\n"
      "    open(p, 'a').write('escaped')\n"
      "    print('wrote', p)\n"
      "  except OSError as e: print('denied', p, e.errno)\n"
      "try: os.rename('" +
      existing + "', '" + outside.path() +
      "/renamed'); print('renamed')\n"
      "except OSError as e: print('denied rename', e.errno)\n"
      "open(os.environ['TMPDIR'] + '/mine', 'w').write('ok')\n"
      "print('tmpdir', open(os.environ['TMPDIR'] + '/mine').read())\n";
  const Result result = run_python(*backend, policy, code);
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(result.stdout_data.find("wrote"), std::string::npos) << describe(result);
  EXPECT_EQ(result.stdout_data.find("renamed"), std::string::npos) << describe(result);
  EXPECT_FALSE(fs::exists(outside.path() + "/created"));
  EXPECT_FALSE(fs::exists(bound_ro.path() + "/created"));
  EXPECT_FALSE(fs::exists("/tmp/rlm-landlock-escape-" + std::to_string(getpid())));
  std::ifstream original(existing);
  std::string text((std::istreambuf_iterator<char>(original)), std::istreambuf_iterator<char>());
  EXPECT_EQ(text, "original");
  // Control: the run's own TMPDIR takes writes.
  EXPECT_NE(result.stdout_data.find("tmpdir ok"), std::string::npos) << describe(result);
}

// A listening TCP socket on 127.0.0.1, owned by the test.
struct TcpListener {
  int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  int port = 0;
  TcpListener() {
    sockaddr_in address{};
    address.sin_family = AF_INET;
    address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t length = sizeof address;
    if (bind(fd, reinterpret_cast<sockaddr*>(&address), sizeof address) != 0 ||
        listen(fd, 16) != 0 || getsockname(fd, reinterpret_cast<sockaddr*>(&address), &length))
      ADD_FAILURE() << "listener: " << std::strerror(errno);
    port = ntohs(address.sin_port);
  }
  ~TcpListener() { close(fd); }
  // How many connections are waiting (each accepted and closed).
  int accepted() const {
    int count = 0;
    for (int c; (c = accept4(fd, nullptr, nullptr, SOCK_CLOEXEC)) >= 0; ++count) close(c);
    return count;
  }
};

// Runs `code` under network "none": no line says `reached`, each of `denied` is printed and the
// listener gets no connection. Control: under network "host" the same payload says `reached tcp`
// and the listener gets one.
void expect_the_listener_reached_under_host_only(Backend& backend, const TcpListener& listener,
                                                 const std::string& code,
                                                 const std::string& reached,
                                                 std::initializer_list<const char*> denied) {
  const Result result = run_python(backend, landlock_policy(), code);
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(result.stdout_data.find(reached), std::string::npos) << describe(result);
  for (const char* name : denied)
    EXPECT_NE(result.stdout_data.find(name), std::string::npos) << name << describe(result);
  EXPECT_EQ(listener.accepted(), 0);
  Policy open = landlock_policy();
  open.network = Network::host;
  const Result control = run_python(backend, open, code);
  EXPECT_NE(control.stdout_data.find(reached + " tcp"), std::string::npos) << describe(control);
  EXPECT_GE(listener.accepted(), 1);
}

TEST(LandlockEscape, TcpConnectToAListenerFailsAlsoOverMptcp) {
  REQUIRE_BACKEND(backend);
  TcpListener listener;
  const std::string code =
      "import socket\n"
      "for name, proto in [('tcp', 0), ('tcp6', 0), ('iptcp', socket.IPPROTO_TCP), ('mptcp', "
      "262)]:\n"
      "  family = socket.AF_INET6 if name == 'tcp6' else socket.AF_INET\n"
      "  host = '::ffff:127.0.0.1' if name == 'tcp6' else '127.0.0.1'\n"
      "  try:\n"
      "    s = socket.socket(family, socket.SOCK_STREAM, proto)\n"
      "    s.settimeout(5)\n"
      "    s.connect((host, " +
      std::to_string(listener.port) +
      "))\n"
      "    print('connected', name)\n"
      "  except OSError as e: print('denied', name, e.errno)\n";
  expect_the_listener_reached_under_host_only(
      *backend, listener, code, "connected",
      {"denied tcp ", "denied tcp6 ", "denied iptcp ", "denied mptcp "});
}

// TCP Fast Open connects from sendto(MSG_FASTOPEN) without connect(2), the only call Landlock's
// TCP rule checks: a full connection to a listener outside, data and reply, under network "none".
TEST(LandlockEscape, TcpFastOpenSendToAListenerFails) {
  REQUIRE_BACKEND(backend);
  TcpListener listener;
  const std::string code =
      "import socket\n"
      "for name, family, host in [('tcp', socket.AF_INET, '127.0.0.1'),\n"
      "                           ('tcp6', socket.AF_INET6, '::ffff:127.0.0.1')]:\n"
      "  try:\n"
      "    s = socket.socket(family, socket.SOCK_STREAM)\n"
      "    s.sendto(b'escaped', socket.MSG_FASTOPEN, (host, " +
      std::to_string(listener.port) +
      "))\n"
      "    print('sent', name)\n"
      "  except OSError as e: print('denied', name, e.errno)\n";
  expect_the_listener_reached_under_host_only(*backend, listener, code, "sent",
                                              {"denied tcp ", "denied tcp6 "});
}

// The ports of TCP sockets listening now (/proc/net/tcp and tcp6, state 0A).
std::set<int> listening_ports() {
  std::set<int> ports;
  for (const char* table : {"/proc/net/tcp", "/proc/net/tcp6"}) {
    std::ifstream in(table);
    std::string line;
    std::getline(in, line);  // the header
    while (std::getline(in, line)) {
      std::istringstream fields(line);
      std::string slot, local, remote, state;
      fields >> slot >> local >> remote >> state;
      const auto colon = local.rfind(':');
      if (state == "0A" && colon != std::string::npos)
        ports.insert(std::stoi(local.substr(colon + 1), nullptr, 16));
    }
  }
  return ports;
}

// Runs `code` while a thread connects (127.0.0.1) once to each TCP port that starts listening
// during the run, closing at once: a payload's listener shows an accepted connection.
Result run_while_connecting_to_new_listeners(Backend& backend, const Policy& policy,
                                             const std::string& code) {
  const std::set<int> before = listening_ports();
  std::atomic<bool> done{false};
  std::thread connector([&] {
    std::set<int> tried = before;
    while (!done) {
      for (const int port : listening_ports()) {
        if (!tried.insert(port).second) continue;
        const int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
        sockaddr_in address{};
        address.sin_family = AF_INET;
        address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
        address.sin_port = htons(static_cast<std::uint16_t>(port));
        connect(fd, reinterpret_cast<sockaddr*>(&address), sizeof address);
        close(fd);
      }
      usleep(10000);
    }
  });
  Result result = run_python(backend, policy, code);
  done = true;
  connector.join();
  return result;
}

// listen(2) on an unbound TCP socket binds it to an ephemeral port on every address without
// bind(2), the call Landlock's TCP rule checks: the payload would serve the host's network
// under network "none". The test connects from outside to the port the payload reports.
TEST(LandlockEscape, TcpListenWithoutBindFails) {
  REQUIRE_BACKEND(backend);
  const std::string code =
      "import socket, sys\n"
      "for name, family in [('tcp', socket.AF_INET), ('tcp6', socket.AF_INET6)]:\n"
      "  try:\n"
      "    s = socket.socket(family, socket.SOCK_STREAM)\n"
      "    s.listen()\n"
      "    s.settimeout(5)\n"
      "    print('listening', name, flush=True)\n"
      "    c, _ = s.accept()\n"
      "    c.sendall(b'from-inside')\n"
      "    print('accepted', name, flush=True)\n"
      "  except OSError as e: print('denied', name, e.errno, flush=True)\n";
  // The payload's stdout is seen when the run ends: the port comes from /proc/net/tcp{,6}.
  const Result result = run_while_connecting_to_new_listeners(*backend, landlock_policy(), code);
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(result.stdout_data.find("listening"), std::string::npos) << describe(result);
  EXPECT_EQ(result.stdout_data.find("accepted"), std::string::npos) << describe(result);
  for (const char* name : {"denied tcp ", "denied tcp6 "})
    EXPECT_NE(result.stdout_data.find(name), std::string::npos) << name << describe(result);
  // Control: under network "host" the payload listens and this test reaches it.
  Policy open = landlock_policy();
  open.network = Network::host;
  const Result control = run_while_connecting_to_new_listeners(*backend, open, code);
  EXPECT_NE(control.stdout_data.find("accepted tcp"), std::string::npos) << describe(control);
}

TEST(LandlockEscape, UdpSendFails) {
  REQUIRE_BACKEND(backend);
  const int receiver = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  sockaddr_in address{};
  address.sin_family = AF_INET;
  address.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t length = sizeof address;
  ASSERT_EQ(bind(receiver, reinterpret_cast<sockaddr*>(&address), sizeof address), 0);
  ASSERT_EQ(getsockname(receiver, reinterpret_cast<sockaddr*>(&address), &length), 0);
  const std::string code =
      "import socket\n"
      "try:\n"
      "  s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)\n"
      "  s.sendto(b'escaped', ('127.0.0.1', " +
      std::to_string(ntohs(address.sin_port)) +
      "))\n"
      "  print('sent')\n"
      "except OSError as e: print('denied', e.errno)\n";
  const Result result = run_python(*backend, landlock_policy(), code);
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_NE(result.stdout_data.find("denied"), std::string::npos) << describe(result);
  char buffer[16];
  EXPECT_LT(recv(receiver, buffer, sizeof buffer, 0), 0) << "a datagram got out";
  // Control: under network "host" it arrives.
  Policy open = landlock_policy();
  open.network = Network::host;
  const Result control = run_python(*backend, open, code);
  EXPECT_NE(control.stdout_data.find("sent"), std::string::npos) << describe(control);
  pollfd p{receiver, POLLIN, 0};
  EXPECT_EQ(poll(&p, 1, 5000), 1);
  close(receiver);
}

TEST(LandlockEscape, AbstractUnixConnectToAListenerOutsideFails) {
  REQUIRE_BACKEND(backend);
  const int listener = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
  const std::string name = "rlm-landlock-escape/" + std::to_string(getpid());
  sockaddr_un address{};
  address.sun_family = AF_UNIX;
  std::memcpy(address.sun_path + 1, name.data(), name.size());
  const auto length = static_cast<socklen_t>(offsetof(sockaddr_un, sun_path) + 1 + name.size());
  ASSERT_EQ(bind(listener, reinterpret_cast<sockaddr*>(&address), length), 0);
  ASSERT_EQ(listen(listener, 4), 0);
  const std::string code =
      "import socket\n"
      "def attempt(label, name):\n"
      "  try:\n"
      "    socket.socket(socket.AF_UNIX).connect(name); print('connected', label)\n"
      "  except OSError as e: print('denied', label, e.errno)\n"
      "attempt('outside', '\\0" +
      name +
      "')\n"
      "own = socket.socket(socket.AF_UNIX); own.bind('\\0" +
      name +
      "-own'); own.listen(1)\n"
      "attempt('own', '\\0" +
      name + "-own')\n";
  const Result result = run_python(*backend, landlock_policy(), code);
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_NE(result.stdout_data.find("denied outside"), std::string::npos) << describe(result);
  EXPECT_EQ(accept(listener, nullptr, nullptr), -1);
  // Control: a listener of the sandbox's own is reachable.
  EXPECT_NE(result.stdout_data.find("connected own"), std::string::npos) << describe(result);
  close(listener);
}

TEST(LandlockEscape, SignallingOrPtracingAProcessOutsideFails) {
  REQUIRE_BACKEND(backend);
  const pid_t outside = fork();
  if (outside == 0) {
    prctl(PR_SET_PDEATHSIG, SIGKILL);  // never outlives the test
    for (;;) pause();
  }
  ASSERT_GT(outside, 0);
  const std::string pid = std::to_string(outside);
  const std::string code =
      "import ctypes, os, signal, subprocess\n"
      "for sig in (signal.SIGKILL, signal.SIGTERM, 0):\n"
      "  try: os.kill(" +
      pid +
      ", sig); print('signalled', sig)\n"
      "  except OSError as e: print('denied kill', e.errno)\n"
      "libc = ctypes.CDLL(None, use_errno=True)\n"
      "for request in (16, 0x4206):  # PTRACE_ATTACH, PTRACE_SEIZE\n"
      "  if libc.ptrace(request, " +
      pid +
      ", 0, 0) == 0: print('traced')\n"
      "  else: print('denied ptrace', ctypes.get_errno())\n"
      "child = subprocess.Popen(['sleep', '30'])\n"
      "os.kill(child.pid, signal.SIGKILL); child.wait(); print('own child', child.returncode)\n";
  const Result result = run_python(*backend, landlock_policy(), code);
  EXPECT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(result.stdout_data.find("signalled"), std::string::npos) << describe(result);
  EXPECT_EQ(result.stdout_data.find("traced"), std::string::npos) << describe(result);
  EXPECT_NE(result.stdout_data.find("denied ptrace"), std::string::npos) << describe(result);
  int status = 0;
  EXPECT_EQ(waitpid(outside, &status, WNOHANG), 0) << "the process outside was stopped or killed";
  // Control: the sandbox signals a process of its own.
  EXPECT_NE(result.stdout_data.find("own child -9"), std::string::npos) << describe(result);
  kill(outside, SIGKILL);
  waitpid(outside, nullptr, 0);
}

TEST(LandlockEscape, IoUringSetupFails) {
  REQUIRE_BACKEND(backend);
  const std::string code =
      "import ctypes\n"
      "libc = ctypes.CDLL(None, use_errno=True)\n"
      "params = ctypes.create_string_buffer(120)\n"
      "fd = libc.syscall(425, 4, params)  # io_uring_setup\n"
      "print('io_uring', fd, ctypes.get_errno())\n"
      "print('getpid', libc.syscall(39) > 0)\n";
  const Result result = run_python(*backend, landlock_policy(), code);
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_NE(result.stdout_data.find("io_uring -1 1\n"), std::string::npos) << describe(result);
  // Control: a harmless syscall through the same path works.
  EXPECT_NE(result.stdout_data.find("getpid True"), std::string::npos) << describe(result);
}

// Landlock does not mediate inotify or fanotify: a watch needs only read permission on the
// inode, so a payload refused listdir(/tmp) could still watch the host's /tmp and learn the
// names of the files other users create there. The test process creates files in /tmp all
// through the run (after the payload's watch, whenever that was made).
TEST(LandlockEscape, WatchingAHostDirectoryFails) {
  REQUIRE_BACKEND(backend);
  const std::string marker = "rlm-landlock-watched-" + std::to_string(getpid());
  const std::string code =
      "import ctypes, os, select\n"
      "libc = ctypes.CDLL(None, use_errno=True)\n"
      "try: os.listdir('/tmp'); print('listed /tmp')\n"
      "except OSError as e: print('denied listdir', e.errno)\n"
      "fd = libc.inotify_init1(os.O_CLOEXEC | os.O_NONBLOCK)\n"
      "print('inotify_init1', fd >= 0)\n"
      "wd = libc.inotify_add_watch(fd, b'/tmp', 0x100)  # IN_CREATE\n"
      "print('inotify watch', wd, ctypes.get_errno(), flush=True)\n"
      "seen = b''\n"
      "if wd >= 0:\n"
      "  for _ in range(50):\n"
      "    if select.select([fd], [], [], 0.1)[0]: seen += os.read(fd, 65536)\n"
      "    if b'" +
      marker +
      "' in seen: break\n"
      "print('seen', seen.count(b'" +
      marker +
      "'))\n"
      "fan = libc.fanotify_init(0x200, 0)  # FAN_REPORT_FID, the unprivileged kind\n"
      "print('fanotify_init', fan, ctypes.get_errno())\n"
      "if fan >= 0:\n"
      "  ctypes.set_errno(0)\n"
      "  r = libc.fanotify_mark(fan, 1, ctypes.c_uint64(0x100), -100, b'/tmp')  # ADD, "
      "FAN_CREATE\n"
      "  print('fanotify mark', r, ctypes.get_errno())\n"
      "tmp = os.environ['TMPDIR']\n"
      "open(tmp + '/own', 'w').write('mine')\n"
      "print('own', os.listdir(tmp), open(tmp + '/own').read())\n";
  std::atomic<bool> done{false};
  std::vector<std::string> created;
  std::thread creator([&] {
    for (int i = 0; !done; ++i) {
      const std::string path = "/tmp/" + marker + "-" + std::to_string(i);
      std::ofstream(path) << "x";
      created.push_back(path);
      usleep(20000);
    }
  });
  const Result result = run_python(*backend, landlock_policy(), code);
  done = true;
  creator.join();
  for (const auto& path : created) ::unlink(path.c_str());
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_NE(result.stdout_data.find("denied listdir"), std::string::npos) << describe(result);
  EXPECT_NE(result.stdout_data.find("inotify watch -1 13\n"), std::string::npos)
      << describe(result);
  EXPECT_NE(result.stdout_data.find("seen 0\n"), std::string::npos) << describe(result);
  // fanotify: refused at init (EPERM), or where a kernel lets it init, at the mark (EACCES).
  const bool fanotify_refused =
      result.stdout_data.find("fanotify_init -1 1\n") != std::string::npos ||
      result.stdout_data.find("fanotify mark -1 13\n") != std::string::npos;
  EXPECT_TRUE(fanotify_refused) << describe(result);
  // Control: inotify itself, and the payload's own directory, work.
  EXPECT_NE(result.stdout_data.find("inotify_init1 True"), std::string::npos) << describe(result);
  EXPECT_NE(result.stdout_data.find("own ['own'] mine"), std::string::npos) << describe(result);
}

TEST(LandlockEscape, SysVSharedMemoryFailsUnderNetworkNone) {
  REQUIRE_BACKEND(backend);
  const std::string code =
      "import ctypes\n"
      "libc = ctypes.CDLL(None, use_errno=True)\n"
      "print('shmget', libc.shmget(0, 4096, 0o1600), ctypes.get_errno())\n";
  const Result result = run_python(*backend, landlock_policy(), code);
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_NE(result.stdout_data.find("shmget -1 1\n"), std::string::npos) << describe(result);
}

// Issue 24, line 1, on this backend: the payload runs in place as the sandbox's own host uid, which
// the next sandbox may be given. What it made in a read-write bind must not be that uid's after
// the run (the caller's instead), it may set no set-id bit, and a link it planted is not followed.
TEST(LandlockEscape, NothingTheSandboxUidMadeOutlivesTheRun) {
  REQUIRE_BACKEND(backend);
  if (geteuid() != 0) GTEST_SKIP() << "a sandbox uid of its own needs a root runtime";
  PlantedDir out, elsewhere;
  const std::string bystander = elsewhere.plant("bystander", "not the sandbox's");
  ASSERT_EQ(chown(bystander.c_str(), 65534, 65534), 0);
  Policy policy = landlock_policy();
  Mount bind = read_only_bind(out.path());
  bind.readonly = false;
  policy.filesystem.mounts.push_back(bind);
  const std::string code =
      "import os, shutil\n"
      "d = '" +
      out.path() +
      "'\n"
      "print('uid', os.getuid())\n"
      "open(d + '/file', 'w').write('x')\n"
      "os.mkdir(d + '/dir'); open(d + '/dir/inner', 'w').write('y')\n"
      "os.symlink('" +
      bystander +
      "', d + '/link')\n"
      "shutil.copy('/bin/true', d + '/px')\n"
      "for mode in (0o4755, 0o2755):\n"
      "  try: os.chmod(d + '/px', mode); print('chmod', oct(mode), 'SUCCEEDED')\n"
      "  except OSError as e: print('chmod', oct(mode), e.errno)\n";
  const Result result = run_python(*backend, policy, code);
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_NE(result.stdout_data.find("chmod 0o4755 1\n"), std::string::npos) << describe(result);
  EXPECT_NE(result.stdout_data.find("chmod 0o2755 1\n"), std::string::npos) << describe(result);
  EXPECT_EQ(result.stdout_data.find("uid 0\n"), std::string::npos) << "ran as root";
  for (const char* name : {"file", "dir", "dir/inner", "link", "px"}) {
    struct stat st {};
    ASSERT_EQ(lstat((out.path() + "/" + name).c_str(), &st), 0) << name;
    EXPECT_EQ(st.st_uid, rlm::test::landlock_written_uid())
        << name << " belongs to uid " << st.st_uid;
    EXPECT_EQ(st.st_gid, rlm::test::landlock_written_gid())
        << name << " belongs to gid " << st.st_gid;
    EXPECT_EQ(st.st_mode & 06000, 0u) << name;
  }
  struct stat st {};
  ASSERT_EQ(stat(bystander.c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 65534u) << "the walk followed the planted link";
}

TEST(LandlockHealth, HealthAndEveryResultListTheUnenforcedProperties) {
  REQUIRE_BACKEND(backend);
  const Health health = backend->health();
  EXPECT_TRUE(health.available) << health.detail;
  EXPECT_TRUE(health.isolated);
  for (const char* field :
       {"isolation.pid", "isolation.mount", "isolation.private_tmp", "isolation.named_unix_sockets",
        "isolation.stat_outside_paths", "limits.memory_bytes"})
    EXPECT_NE(std::find(health.unenforced.begin(), health.unenforced.end(), field),
              health.unenforced.end())
        << field;
  EXPECT_TRUE(health.fallbacks.contains("limits.memory_bytes"));
  Request request;
  request.argv = {"true"};
  const Result result = backend->run(request, landlock_policy());
  EXPECT_EQ(result.status, Status::ok) << describe(result);
  EXPECT_EQ(result.backend, "landlock");
  EXPECT_EQ(result.unenforced, health.unenforced);
  // A failing run says the same.
  request.argv = {"false"};
  EXPECT_EQ(backend->run(request, landlock_policy()).unenforced, health.unenforced);
}

TEST(LandlockSelection, TheBackendIsOptInOnly) {
  // No shipped policy but landlock's own prefers it, and auto selection never lands on it for
  // the default policy.
  for (const auto& name : shipped_policy_names()) {
    const Policy policy = load_policy(name);
    const bool prefers = std::find(policy.backend.prefer.begin(), policy.backend.prefer.end(),
                                   "landlock") != policy.backend.prefer.end();
    EXPECT_EQ(prefers, name == "landlock") << name;
  }
}

}  // namespace
}  // namespace rlm
