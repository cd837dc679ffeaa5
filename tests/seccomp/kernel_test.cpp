// Real kernel behaviour: each probe runs in a forked child under a compiled filter.
#include <fcntl.h>
#include <sched.h>
#include <sys/ioctl.h>
#include <sys/personality.h>
#include <sys/ptrace.h>
#include <sys/socket.h>
#include <sys/syscall.h>
#include <sys/utsname.h>

#include <sys/stat.h>

#include <csignal>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <thread>

#include "preamble_by_number.hpp"
#include "seccomp/model.hpp"
#include "seccomp_test_util.hpp"

namespace rlm::seccomp::test {
namespace {

// A directory of its own for probes that make files, removed with what is in it.
struct TempDirForProbes {
  std::string path;
  TempDirForProbes() {
    char name[] = "/tmp/rlm-seccomp-setid-XXXXXX";
    path = mkdtemp(name) ? name : "";
  }
  ~TempDirForProbes() { std::filesystem::remove_all(path); }
};

Program allow_all() {
  return compile(policy("SCMP_ACT_ALLOW"));
}

// clone(2) with raw flags. A clone the filter wrongly lets through returns 0 in a new child,
// which must not go on running the probe.
long raw_clone(unsigned long flags) {
  const long r = syscall(SYS_clone, flags | SIGCHLD, nullptr, nullptr, nullptr, nullptr);
  if (r == 0) syscall(SYS_exit_group, 99);
  if (r > 0) syscall(SYS_wait4, r, nullptr, 0, nullptr);
  return r;
}

// An ioctl on a descriptor that is not open (EBADF unless the filter answers first).
int ioctl_on_bad_fd(unsigned long request) {
  int buffer = 0;
  return errno_of(syscall(SYS_ioctl, kBadFd, request, &buffer));
}

// The preamble's own answers inside syscalls a policy allows (ioctl, clone): TIOCSTI is refused
// while other ioctls reach the kernel, and a clone may make no namespace but still a process.
void expect_preamble_within_allowed_calls(const Program& program) {
  expect_exit(
      program, EPERM, [] { return ioctl_on_bad_fd(TIOCSTI); }, "TIOCSTI");
  expect_exit(
      program, EBADF, [] { return ioctl_on_bad_fd(FIONREAD); }, "FIONREAD");
  expect_exit(
      program, EPERM, [] { return errno_of(raw_clone(CLONE_NEWNET)); }, "clone(CLONE_NEWNET)");
  expect_exit(
      program, 0, [] { return errno_of(raw_clone(0)); }, "plain clone");
}

int new_user_namespace() {
  return errno_of(syscall(SYS_unshare, CLONE_NEWUSER));
}

TEST(SeccompKernel, PreambleDeniesUserNamespaceCreation) {
  expect_exit(allow_all(), EPERM, new_user_namespace, "unshare");
  // Control: root here can create one, so the EPERM above is the filter's.
  EXPECT_EQ(run_child(nullptr, new_user_namespace).exit_code, 0);
}

TEST(SeccompKernel, PreambleDeniesEveryListedSyscall) {
  const Program program = allow_all();
  // Arguments are junk (mostly the bad pointer 1): should a denial be missing, the call fails
  // with EFAULT or EINVAL instead of doing anything.
  struct Case {
    const char* name;
    long nr;
  };
  const Case cases[] = {
      {"unshare", SYS_unshare},
      {"setns", SYS_setns},
      {"mount", SYS_mount},
      {"umount2", SYS_umount2},
      {"pivot_root", SYS_pivot_root},
      {"bpf", SYS_bpf},
      {"keyctl", SYS_keyctl},
      {"add_key", SYS_add_key},
      {"request_key", SYS_request_key},
      {"perf_event_open", SYS_perf_event_open},
      {"userfaultfd", SYS_userfaultfd},
      {"kexec_load", SYS_kexec_load},
      {"kexec_file_load", SYS_kexec_file_load},
      {"init_module", SYS_init_module},
      {"finit_module", SYS_finit_module},
      {"delete_module", SYS_delete_module},
      {"io_uring_setup", SYS_io_uring_setup},
      {"io_uring_enter", SYS_io_uring_enter},
      {"io_uring_register", SYS_io_uring_register},
      {"open_tree", SYS_open_tree},
      {"move_mount", SYS_move_mount},
      {"fsopen", SYS_fsopen},
      {"fsconfig", SYS_fsconfig},
      {"fsmount", SYS_fsmount},
      {"fspick", SYS_fspick},
      {"mount_setattr", SYS_mount_setattr},
      {"ptrace", SYS_ptrace},
      {"process_vm_readv", SYS_process_vm_readv},
      {"process_vm_writev", SYS_process_vm_writev},
      {"pidfd_getfd", SYS_pidfd_getfd},
#ifdef SYS_iopl
      {"iopl", SYS_iopl},
      {"ioperm", SYS_ioperm},
#endif
      {"swapon", SYS_swapon},
      {"swapoff", SYS_swapoff},
      {"reboot", SYS_reboot},
      {"acct", SYS_acct},
      {"lookup_dcookie", SYS_lookup_dcookie},
      {"quotactl", SYS_quotactl},
      {"name_to_handle_at", SYS_name_to_handle_at},
      {"open_by_handle_at", SYS_open_by_handle_at},
  };
  for (const auto& c : cases)
    expect_exit(
        program, EPERM, [&] { return errno_of(syscall(c.nr, 1, 1, 1, 1, 1, 1)); }, c.name);
}

TEST(SeccompKernel, TheByNumberListIsExactlyWhatThePreambleDeniesForEveryCall) {
  std::vector<Diagnostic> problems;
  const detail::Filter filter = detail::layer(policy("SCMP_ACT_ALLOW"), problems);
  ASSERT_TRUE(problems.empty());
  std::map<long, std::string> preamble;  // number -> "name errno"
  for (const auto& rule : filter.rules) {
    if (!rule.conditions.empty()) continue;
    const auto nr = detail::resolve_syscall(rule.syscall);
    ASSERT_TRUE(nr.has_value()) << rule.syscall;
    if (*nr < 0) continue;  // not a syscall of this architecture
    preamble[*nr] = rule.syscall + " " + std::to_string(rule.action.errno_value);
  }
  std::map<long, std::string> listed;
  for (const auto& d : kPreambleDeniedByNumber) {
    listed[d.number] = std::string(d.name) + " " + std::to_string(d.error);
    // Where libseccomp knows the name, it agrees with the number written here.
    const int known = seccomp_syscall_resolve_name(d.name);
    if (known != __NR_SCMP_ERROR) {
      EXPECT_EQ(known, d.number) << d.name;
    }
  }
  EXPECT_EQ(preamble, listed);
}

TEST(SeccompKernel, PreambleDeniesEachSyscallByItsRawNumber) {
  const Program program = allow_all();
  // Junk arguments (mostly the bad pointer 1): were a denial missing, the call would fail with
  // EFAULT, EBADF or EINVAL instead of doing anything.
  for (const auto& d : kPreambleDeniedByNumber)
    expect_exit(
        program, d.error, [&] { return errno_of(syscall(d.number, 1, 1, 1, 1, 1, 1)); },
        std::string(d.name) + " (" + std::to_string(d.number) + ")");
}

TEST(SeccompKernel, SocketFamiliesOutsideTheAllowListFailWithEafnosupport) {
  const Program program = allow_all();
  auto make_socket = [](unsigned long family, int type) {
    const long fd = syscall(SYS_socket, family, type | SOCK_CLOEXEC, 0);
    if (fd >= 0) close(static_cast<int>(fd));
    return errno_of(fd < 0 ? -1 : 0);
  };
  auto make_pair = [](unsigned long family, int type) {
    int fds[2];
    const long r = syscall(SYS_socketpair, family, type | SOCK_CLOEXEC, 0, fds);
    if (r == 0) close(fds[0]), close(fds[1]);
    return errno_of(r);
  };
  // The allowed families keep working.
  expect_exit(
      program, 0, [&] { return make_socket(AF_UNIX, SOCK_STREAM); }, "socket(AF_UNIX)");
  expect_exit(
      program, 0, [&] { return make_socket(AF_INET, SOCK_DGRAM); }, "socket(AF_INET)");
  expect_exit(
      program, 0, [&] { return make_socket(AF_NETLINK, SOCK_RAW); }, "socket(AF_NETLINK)");
  if (run_child(nullptr, [&] { return make_socket(AF_INET6, SOCK_DGRAM); }).exit_code == 0)
    expect_exit(
        program, 0, [&] { return make_socket(AF_INET6, SOCK_DGRAM); }, "socket(AF_INET6)");
  expect_exit(
      program, 0, [&] { return make_pair(AF_UNIX, SOCK_STREAM); }, "socketpair(AF_UNIX)");

  // Control: unfiltered, this host really has vsock (the family a network namespace does not
  // isolate), so the EAFNOSUPPORT below is the filter's.
  const ChildEnd control = run_child(nullptr, [&] { return make_socket(AF_VSOCK, SOCK_STREAM); });
  if (control.exit_code != 0)
    std::cout << "note: this host has no AF_VSOCK (errno " << control.exit_code
              << "); the filter is still checked\n";
  for (const unsigned long family :
       {static_cast<unsigned long>(AF_VSOCK), static_cast<unsigned long>(AF_PACKET),
        static_cast<unsigned long>(AF_ALG), static_cast<unsigned long>(AF_KEY),
        static_cast<unsigned long>(AF_BLUETOOTH), static_cast<unsigned long>(AF_CAN),
        static_cast<unsigned long>(AF_TIPC), static_cast<unsigned long>(AF_RDS),
        static_cast<unsigned long>(AF_XDP), static_cast<unsigned long>(AF_UNSPEC), 46ul, 0xfffful,
        0xfffffffful}) {
    expect_exit(
        program, EAFNOSUPPORT, [&] { return make_socket(family, SOCK_STREAM); },
        "socket(" + std::to_string(family) + ")");
    expect_exit(
        program, EAFNOSUPPORT, [&] { return make_pair(family, SOCK_STREAM); },
        "socketpair(" + std::to_string(family) + ")");
  }
  // The kernel reads the domain as an int: upper bits neither hide a denied family nor cost an
  // allowed one.
  expect_exit(
      program, EAFNOSUPPORT, [&] { return make_socket((1ul << 32) | AF_VSOCK, SOCK_STREAM); },
      "socket(1<<32 | AF_VSOCK)");
  expect_exit(
      program, 0, [&] { return make_socket((1ul << 32) | AF_UNIX, SOCK_STREAM); },
      "socket(1<<32 | AF_UNIX)");
}

TEST(SeccompKernel, PtraceAttachToParentIsDenied) {
  expect_exit(
      allow_all(), EPERM,
      [] { return errno_of(ptrace(PTRACE_ATTACH, getppid(), nullptr, nullptr)); },
      "ptrace(PTRACE_ATTACH)");
}

TEST(SeccompKernel, Clone3FailsWithEnosysSoThreadsFallBackToClone) {
  const Program program = allow_all();
  expect_exit(
      program, ENOSYS, [] { return errno_of(syscall(SYS_clone3, nullptr, 0)); }, "clone3");
  // glibc's pthread_create tries clone3 first and falls back on ENOSYS.
  expect_exit(
      program, 42,
      [] {
        int value = 0;
        std::thread([&] { value = 42; }).join();
        return value;
      },
      "std::thread");
}

// A set-uid or set-gid file made in a read-write bind would outlive the sandbox on the host
// (issue 24): no call that sets a mode may set those bits, whatever else it does.
TEST(SeccompKernel, SetIdModeBitsAreRefusedWhereverAModeIsSet) {
  const Program program = allow_all();
  TempDirForProbes dir;
  const std::string file = dir.path + "/f";
  ASSERT_EQ(close(open(file.c_str(), O_WRONLY | O_CREAT | O_CLOEXEC, 0644)), 0);
  const char* path = file.c_str();
  const std::string made = dir.path + "/made";
  const char* new_path = made.c_str();
  for (const mode_t bits : {mode_t{S_ISUID}, mode_t{S_ISGID}, mode_t{S_ISUID | S_ISGID}}) {
    const mode_t mode = bits | 0755;
    const std::string what = " with mode " + std::to_string(mode);
    expect_exit(
        program, EPERM, [&] { return errno_of(syscall(SYS_chmod, path, mode)); }, "chmod" + what);
    expect_exit(
        program, EPERM, [&] { return errno_of(syscall(SYS_fchmodat, AT_FDCWD, path, mode)); },
        "fchmodat" + what);
    expect_exit(
        program, EPERM, [&] { return errno_of(syscall(452, AT_FDCWD, path, mode, 0)); },
        "fchmodat2" + what);
    expect_exit(
        program, EPERM,
        [&] {
          const int fd = open(path, O_RDONLY | O_CLOEXEC);
          return fd < 0 ? kSetupFailed : errno_of(syscall(SYS_fchmod, fd, mode));
        },
        "fchmod" + what);
    expect_exit(
        program, EPERM,
        [&] { return errno_of(syscall(SYS_open, new_path, O_WRONLY | O_CREAT, mode)); },
        "open(O_CREAT)" + what);
    expect_exit(
        program, EPERM,
        [&] { return errno_of(syscall(SYS_openat, AT_FDCWD, new_path, O_WRONLY | O_CREAT, mode)); },
        "openat(O_CREAT)" + what);
    expect_exit(
        program, EPERM,
        [&] {
          return errno_of(
              syscall(SYS_openat, AT_FDCWD, dir.path.c_str(), O_TMPFILE | O_WRONLY, mode));
        },
        "openat(O_TMPFILE)" + what);
    expect_exit(
        program, EPERM, [&] { return errno_of(syscall(SYS_creat, new_path, mode)); },
        "creat" + what);
    expect_exit(
        program, EPERM,
        [&] { return errno_of(syscall(SYS_mknodat, AT_FDCWD, new_path, S_IFREG | mode, 0)); },
        "mknodat" + what);
    // Upper bits of the register cannot hide them: the kernel reads the low 16.
    expect_exit(
        program, EPERM, [&] { return errno_of(syscall(SYS_chmod, path, 0xffff00000000ul | mode)); },
        "chmod with upper bits" + what);
  }
  // Nothing of the file changed, and the controls work: plain modes, and opening without creating
  // whatever the (ignored) mode argument holds.
  struct stat st {};
  ASSERT_EQ(stat(path, &st), 0);
  EXPECT_EQ(st.st_mode & 07777, 0644u);
  EXPECT_NE(access(new_path, F_OK), 0) << "a refused call made the file";
  expect_exit(
      program, 0, [&] { return errno_of(syscall(SYS_chmod, path, 01777)); }, "chmod 1777");
  expect_exit(
      program, 0,
      [&] {
        const long fd = syscall(SYS_openat, AT_FDCWD, path, O_RDONLY, 06777);
        return fd < 0 ? errno : (close(static_cast<int>(fd)), 0);
      },
      "openat without O_CREAT, a set-id mode argument ignored");
  expect_exit(
      program, 0,
      [&] {
        const long fd = syscall(SYS_openat, AT_FDCWD, new_path, O_WRONLY | O_CREAT, 0755);
        return fd < 0 ? errno : (close(static_cast<int>(fd)), 0);
      },
      "openat(O_CREAT, 0755)");
  // openat2 hides its mode in a struct: absent, so callers fall back to openat.
  expect_exit(
      program, ENOSYS, [&] { return errno_of(syscall(SYS_openat2, AT_FDCWD, path, nullptr, 0)); },
      "openat2");
  // The control: unfiltered, the same calls succeed (root may set the bits).
  const ChildEnd control =
      run_child(nullptr, [&] { return errno_of(syscall(SYS_chmod, path, 04755)); });
  EXPECT_EQ(control.exit_code, 0);
}

TEST(SeccompKernel, CloneWithANamespaceFlagIsDeniedButForkWorks) {
  const Program program = allow_all();
  for (const unsigned long flag : {CLONE_NEWNS, CLONE_NEWUTS, CLONE_NEWIPC, CLONE_NEWUSER,
                                   CLONE_NEWPID, CLONE_NEWNET, CLONE_NEWCGROUP}) {
    expect_exit(
        program, EPERM, [&] { return errno_of(raw_clone(flag)); },
        "clone with flag " + std::to_string(flag));
  }
  // The flags check ignores nothing the kernel reads: extra harmless flags do not hide one.
  expect_exit(
      program, EPERM, [] { return errno_of(raw_clone(CLONE_NEWNET | CLONE_FILES)); },
      "clone(CLONE_NEWNET | CLONE_FILES)");
  expect_exit(
      program, 7,
      [] {
        const pid_t child = fork();
        if (child == 0) _exit(7);
        int status = 0;
        if (child < 0 || waitpid(child, &status, 0) != child) return kSetupFailed;
        return WIFEXITED(status) ? WEXITSTATUS(status) : kSetupFailed;
      },
      "fork");
}

TEST(SeccompKernel, TerminalInjectionIoctlsAreDeniedWhateverTheUpperBits) {
  const Program program = allow_all();
  expect_exit(
      program, EPERM, [] { return ioctl_on_bad_fd(TIOCSTI); }, "TIOCSTI");
  expect_exit(
      program, EPERM, [] { return ioctl_on_bad_fd(TIOCLINUX); }, "TIOCLINUX");
  // The kernel reads the request as 32 bits, so upper bits must not hide it.
  expect_exit(
      program, EPERM, [] { return ioctl_on_bad_fd((1ul << 32) | TIOCSTI); }, "TIOCSTI | 1<<32");
  expect_exit(
      program, EBADF, [] { return ioctl_on_bad_fd(TCGETS); }, "TCGETS");
  expect_exit(
      program, EBADF, [] { return ioctl_on_bad_fd(FIONREAD); }, "FIONREAD");
  EXPECT_EQ(run_child(nullptr, [] { return ioctl_on_bad_fd(TIOCSTI); }).exit_code, EBADF);
}

TEST(SeccompKernel, PersonalityAllowsOnlyHarmlessPersonas) {
  const Program program = allow_all();
  auto set = [](unsigned long persona) { return errno_of(syscall(SYS_personality, persona)); };
  for (const unsigned long ok : {0x0ul, 0x8ul, 0x20000ul, 0x20008ul, 0xfffffffful})
    expect_exit(
        program, 0, [&] { return set(ok); }, "personality " + std::to_string(ok));
  // The kernel ignores the upper half, and so does the check.
  expect_exit(
      program, 0, [&] { return set(1ul << 32); }, "personality 1<<32");
  for (const unsigned long bad :
       {static_cast<unsigned long>(READ_IMPLIES_EXEC),
        static_cast<unsigned long>(ADDR_NO_RANDOMIZE), static_cast<unsigned long>(MMAP_PAGE_ZERO),
        0x1ul, 0xfffffffeul, (1ul << 32) | READ_IMPLIES_EXEC})
    expect_exit(
        program, EPERM, [&] { return set(bad); }, "personality " + std::to_string(bad));
}

TEST(SeccompKernel, PolicyErrnoRuleReturnsItsErrno) {
  const Program program =
      compile(policy("SCMP_ACT_ALLOW", {rule({"uname"}, "SCMP_ACT_ERRNO", ENOSYS)}));
  expect_exit(
      program, ENOSYS,
      [] {
        utsname u{};
        return errno_of(uname(&u));
      },
      "uname");
  expect_exit(
      program, 0, [] { return errno_of(getppid() > 0 ? 0 : -1); }, "getppid");
}

TEST(SeccompKernel, PolicyKillRuleKillsTheProcessWithSigsys) {
  for (const char* action : {"SCMP_ACT_KILL_PROCESS", "SCMP_ACT_KILL", "SCMP_ACT_KILL_THREAD"}) {
    const Program program = compile(policy("SCMP_ACT_ALLOW", {rule({"getppid"}, action)}));
    const ChildEnd end = run_filtered(program, [] {
      syscall(SYS_getppid);
      return 0;
    });
    EXPECT_EQ(end.signal, SIGSYS) << action;
    // KILL and KILL_THREAD kill the whole process too, even when another thread makes the call.
    const ChildEnd threaded = run_filtered(program, [] {
      std::thread([] { syscall(SYS_getppid); }).join();
      return 0;
    });
    EXPECT_EQ(threaded.signal, SIGSYS) << action << " from a second thread";
  }
}

TEST(SeccompKernel, AllowListPolicyRunsAProgram) {
  // What /bin/true and the probes need; everything else fails with EPERM.
  const std::vector<std::string> needed = {"execve",
                                           "brk",
                                           "arch_prctl",
                                           "mmap",
                                           "munmap",
                                           "mprotect",
                                           "access",
                                           "openat",
                                           "newfstatat",
                                           "fstat",
                                           "read",
                                           "pread64",
                                           "close",
                                           "rseq",
                                           "prlimit64",
                                           "getrandom",
                                           "set_tid_address",
                                           "set_robust_list",
                                           "exit_group",
                                           "exit",
                                           "getpid",
                                           "ioctl",
                                           "clone",
                                           "wait4",
                                           "write"};
  const Program program = compile(policy("SCMP_ACT_ERRNO", {rule(needed, "SCMP_ACT_ALLOW")}));
  expect_exit(
      program, 0, [] { return syscall(SYS_getpid) == getpid() ? 0 : kSetupFailed; }, "getpid");
  expect_exit(
      program, EPERM, [] { return errno_of(syscall(SYS_getppid)); }, "getppid");
  expect_exit(
      program, 0,
      [] {
        execl("/bin/true", "true", static_cast<char*>(nullptr));
        return kSetupFailed;
      },
      "exec /bin/true");
  // The preamble still applies inside what the policy allows. (The default's errno is EPERM too,
  // so PreambleErrnosHoldUnderAKillDefault tells the two apart.)
  expect_preamble_within_allowed_calls(program);
}

TEST(SeccompKernel, PreambleErrnosHoldUnderAKillDefault) {
  const Program program =
      compile(policy("SCMP_ACT_KILL_PROCESS",
                     {rule({"exit_group", "ioctl", "clone", "wait4"}, "SCMP_ACT_ALLOW")}));
  // The preamble answers its syscalls itself, whatever the default...
  expect_exit(program, EPERM, new_user_namespace, "unshare");
  expect_exit(
      program, ENOSYS, [] { return errno_of(syscall(SYS_clone3, nullptr, 0)); }, "clone3");
  // ...including the calls it denies of syscalls the policy allows...
  expect_preamble_within_allowed_calls(program);
  // ...and everything else meets the default.
  EXPECT_EQ(run_filtered(program, [] { return errno_of(syscall(SYS_getppid)); }).signal, SIGSYS);
  EXPECT_EQ(run_filtered(program, [] { return errno_of(syscall(SYS_personality, 0)); }).signal,
            SIGSYS);
}

TEST(SeccompKernel, ArgumentConditionsSelectCalls) {
  const Program program = compile(policy(
      "SCMP_ACT_ALLOW",
      {rule({"socket"}, "SCMP_ACT_ERRNO", EACCES, {arg(0, "SCMP_CMP_EQ", AF_INET)}),
       // Unix datagram sockets, whatever the SOCK_* flags in the upper bits of `type`.
       rule({"socket"}, "SCMP_ACT_ERRNO", EPROTONOSUPPORT,
            {arg(0, "SCMP_CMP_EQ", AF_UNIX), arg(1, "SCMP_CMP_MASKED_EQ", 0xf, SOCK_DGRAM)})}));
  expect_exit(
      program, EACCES, [] { return errno_of(socket(AF_INET, SOCK_STREAM, 0)); }, "socket(AF_INET)");
  expect_exit(
      program, 0, [] { return errno_of(socket(AF_UNIX, SOCK_STREAM, 0)); },
      "socket(AF_UNIX, SOCK_STREAM)");
  expect_exit(
      program, EPROTONOSUPPORT,
      [] { return errno_of(socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC, 0)); },
      "socket(AF_UNIX, SOCK_DGRAM | SOCK_CLOEXEC)");
}

TEST(SeccompKernel, StricterPolicyActionsReplacePreambleOnes) {
  const Program program = compile(policy(
      "SCMP_ACT_ALLOW",
      {rule({"mount"}, "SCMP_ACT_KILL_PROCESS"),
       rule({"ioctl"}, "SCMP_ACT_KILL_PROCESS", std::nullopt, {arg(1, "SCMP_CMP_EQ", FIONREAD)}),
       rule({"ptrace"}, "SCMP_ACT_ERRNO", ENOSYS)}));
  EXPECT_EQ(
      run_filtered(program, [] { return errno_of(syscall(SYS_mount, 1, 1, 1, 1, 1)); }).signal,
      SIGSYS);
  EXPECT_EQ(run_filtered(program,
                         [] {
                           int n = 0;
                           return errno_of(ioctl(0, FIONREAD, &n));
                         })
                .signal,
            SIGSYS);
  expect_exit(
      program, ENOSYS, [] { return errno_of(ptrace(PTRACE_TRACEME, 0, nullptr, nullptr)); },
      "ptrace");
  expect_exit(
      program, EPERM,
      [] {
        char c = 'x';
        return errno_of(ioctl(0, TIOCSTI, &c));
      },
      "TIOCSTI");
}

#if defined(__x86_64__)
// getpid through the 32-bit int 0x80 entry (i386 syscall 20).
int int80_getpid() {
  long result = 20;
  asm volatile("int $0x80" : "+a"(result) : : "memory", "r8", "r9", "r10", "r11");
  return result == getpid() ? 0 : kSetupFailed;
}
#endif

TEST(SeccompKernel, Int80FromX86_64KillsTheProcess) {
#if defined(__x86_64__)
  const ChildEnd control = run_child(nullptr, int80_getpid);
  if (control.exit_code != 0)
    GTEST_SKIP() << "this kernel has no 32-bit syscall entry (IA32 emulation off); the probe "
                 << "ended with exit " << control.exit_code << ", signal " << control.signal;
  EXPECT_EQ(run_filtered(allow_all(), int80_getpid).signal, SIGSYS);
#else
  GTEST_SKIP() << "int 0x80 exists only on x86_64";
#endif
}

TEST(SeccompKernel, X32SyscallFromX86_64KillsTheProcess) {
#if defined(__x86_64__)
  constexpr long kX32Bit = 0x40000000;
  const ChildEnd end =
      run_filtered(allow_all(), [] { return errno_of(syscall(kX32Bit | SYS_getpid)); });
  EXPECT_EQ(end.signal, SIGSYS);
#else
  GTEST_SKIP() << "x32 exists only on x86_64";
#endif
}

TEST(SeccompKernel, FiltersStackSoALaterOneOnlyTightens) {
  const Program outer = allow_all();
  const Program inner = compile(policy("SCMP_ACT_ALLOW", {rule({"getppid"}, "SCMP_ACT_ERRNO", 5)}));
  expect_exit(
      outer, EPERM,
      [&] {
        if (install(inner) != 0) return kApplyFailed;
        if (errno_of(syscall(SYS_getppid)) != 5) return kSetupFailed;
        return new_user_namespace();
      },
      "two filters");
}

}  // namespace
}  // namespace rlm::seccomp::test
