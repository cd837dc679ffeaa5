// Escape attempts through processes and the kernel from inside the default sandbox on the
// namespace backend: host processes, privileges and ids, dangerous syscalls (by name and by
// number), the UTS namespace, and what /proc tells of the host. Each is tried for real from inside,
// never checked in the configuration.
#include <sys/stat.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "seccomp/preamble_by_number.hpp"
#include "security_test_util.hpp"
#include "support/host_probes.hpp"

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

TEST_F(NamespaceTest, PayloadIsUid1000AndWhatItWritesThroughABindBelongsToTheCaller) {
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

  // On the host what it made is the caller's (a root runtime idmaps the bind to the caller), never
  // the sandbox's own host id, which a later sandbox may be given.
  for (const char* name : {"file", "dir"}) {
    struct stat st {};
    ASSERT_EQ(::lstat(shared.file(name).c_str(), &st), 0) << name << " was not created";
    EXPECT_EQ(st.st_uid, rlm::test::written_uid()) << name << " belongs to " << st.st_uid;
    EXPECT_EQ(st.st_gid, rlm::test::written_gid()) << name << " belongs to group " << st.st_gid;
  }
}

// The caller's own directory, with its own modes (a fresh one is 0700): no mode bits to open up,
// root included, and what the payload writes is the caller's, as with `docker run -v`.
TEST_F(NamespaceTest, CliBindFilesBelongToTheCaller) {
  test::TempDir own;
  // Where this host cannot idmap (a container without CAP_SYS_ADMIN), root's sandbox writes as
  // its own uid, where the modes let anyone, and the output uid gets what it wrote.
  ASSERT_EQ(::chmod(own.path().c_str(), rlm::test::root_binds_idmapped() ? 0700 : 0777), 0);
  auto out = cli({"run", "--bind", own.path() + ":/out", "--", "sh", "-c",
                  "id -u; id -g; echo hi > /out/cli-file; mkdir /out/cli-dir"});
  ASSERT_EQ(out.exit_code, 0) << out.err;
  EXPECT_EQ(out.out, "1000\n1000\n");
  for (const char* name : {"cli-file", "cli-dir"}) {
    struct stat st {};
    ASSERT_EQ(::lstat(own.file(name).c_str(), &st), 0) << name;
    EXPECT_EQ(st.st_uid, rlm::test::written_uid()) << name;
    EXPECT_EQ(st.st_gid, rlm::test::written_gid()) << name;
  }
  EXPECT_EQ(own.read("cli-file"), "hi\n");
}

// A root caller's sandbox writes as root, so the bind's directory carries the mark that keeps the
// runtime from following a link planted there (written_mark.hpp): the payload can neither read,
// remove nor forge it, and set-id bits stay refused on what it makes (now root's).
TEST_F(NamespaceTest, ARootCallersWritableBindIsMarkedAndThePayloadCannotUnmarkIt) {
  if (::geteuid() != 0) GTEST_SKIP() << "only a root caller's sandbox writes as root";
  if (!rlm::test::root_binds_idmapped())
    GTEST_SKIP() << "this host cannot idmap a bind (no CAP_SYS_ADMIN over the filesystem): "
                    "root's sandbox writes as its own uid and nothing of it becomes root's";
  test::TempDir own;
  auto result = python(R"PY(
import errno, os
def attempt(label, call):
    try:
        call()
        print(label, 'SUCCEEDED')
    except OSError as e:
        print(label, errno.errorcode.get(e.errno, str(e.errno)))
name = 'trusted.rlm-sandbox.written'
attempt('get', lambda: os.getxattr('/out', name))
attempt('remove', lambda: os.removexattr('/out', name))
attempt('set', lambda: os.setxattr('/out', name, b'0'))
os.mkdir('/out/d')
attempt('mark_own_dir', lambda: os.setxattr('/out/d', 'trusted.other', b'1'))
with open('/out/f', 'w') as f:
    f.write('x')
attempt('setuid', lambda: os.chmod('/out/f', 0o4755))
attempt('setgid_dir', lambda: os.chmod('/out/d', 0o2775))
)PY",
                       with_rw_bind(own.path(), "/out"));
  ASSERT_EQ(result.status, Status::ok) << describe(result);
  auto v = parse_lines(result.stdout_data);
  // Unprivileged, the trusted namespace is invisible (ENODATA) or refused (EPERM).
  EXPECT_TRUE(v["get"] == "ENODATA" || v["get"] == "EPERM") << v["get"];
  for (const char* key : {"remove", "set", "mark_own_dir", "setuid", "setgid_dir"})
    EXPECT_TRUE(v[key] == "EPERM" || v[key] == "ENODATA") << key << ": " << v[key];
  char value[8] = {};
  EXPECT_EQ(::getxattr(own.path().c_str(), "trusted.rlm-sandbox.written", value, sizeof value), 1)
      << "the bind's directory is not marked: " << std::strerror(errno);
  struct stat st {};
  ASSERT_EQ(::stat(own.file("f").c_str(), &st), 0);
  EXPECT_EQ(st.st_uid, 0u);
  EXPECT_EQ(st.st_mode & (S_ISUID | S_ISGID), 0u);
}

// Through a root caller's bind the payload owns root's files, and a write through a shared mapping
// keeps a set-uid bit (the kernel drops it for write(2) only): a bind holding a set-uid, set-gid or
// file-capability program does not run, saying which and the fix.
TEST_F(NamespaceTest, ARootCallersWritableBindHoldingAPrivilegedProgramIsRefused) {
  if (::geteuid() != 0) GTEST_SKIP() << "only a root caller's sandbox writes as root";
  if (!rlm::test::root_binds_idmapped())
    GTEST_SKIP() << "this host cannot idmap a bind (no CAP_SYS_ADMIN over the filesystem): "
                    "root's sandbox writes as its own uid and cannot write root's programs";
  struct Case {
    const char* name;
    mode_t mode;
    bool capability;
    const char* said;
  };
  for (const Case& c : {Case{"suid", 04755, false, "a set-uid or set-gid program"},
                        Case{"sgid", 02755, false, "a set-uid or set-gid program"},
                        Case{"caps", 0755, true, "a program with file capabilities"}}) {
    test::TempDir own;
    ASSERT_EQ(::mkdir(own.file("bin").c_str(), 0755), 0);
    const std::string program = own.file("bin/helper");
    std::filesystem::copy_file("/bin/true", program);
    ASSERT_EQ(::chmod(program.c_str(), c.mode), 0);
    if (c.capability) {
      // VFS_CAP_REVISION_2, CAP_NET_RAW (13) permitted and effective.
      const std::uint32_t blob[5] = {0x02000001u, 1u << 13, 0, 0, 0};
      ASSERT_EQ(::setxattr(program.c_str(), "security.capability", blob, sizeof blob, 0), 0)
          << std::strerror(errno);
    }
    auto result = run({"sh", "-c", "echo ran > /out/ran"}, with_rw_bind(own.path(), "/out"));
    EXPECT_EQ(result.status, Status::sandbox_error) << c.name << ": " << describe(result);
    EXPECT_NE(result.detail.find("holds " + program + ", " + c.said), std::string::npos)
        << result.detail;
    EXPECT_NE(result.detail.find("To fix"), std::string::npos) << result.detail;
    EXPECT_FALSE(std::filesystem::exists(own.file("ran"))) << c.name;
    char value[8];
    EXPECT_LT(::getxattr(own.path().c_str(), "trusted.rlm-sandbox.written", value, sizeof value), 0)
        << "a bind that never ran was marked";
    // Without the privilege, the same bind runs.
    ASSERT_EQ(::chmod(program.c_str(), 0755), 0);
    if (c.capability) {
      ASSERT_EQ(::removexattr(program.c_str(), "security.capability"), 0);
    }
    auto after = run({"sh", "-c", "echo ran > /out/ran"}, with_rw_bind(own.path(), "/out"));
    EXPECT_EQ(after.status, Status::ok) << c.name << ": " << describe(after);
  }
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

// ---- Syscalls by number -------------------------------------------------------------------------

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
