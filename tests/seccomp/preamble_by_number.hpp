// Every syscall the mandatory preamble denies for every call, by its raw number on this
// architecture, with the errno the preamble answers. Written out rather than taken from
// <sys/syscall.h> or libseccomp: Debian 12's headers and libseccomp 2.5.4 predate several of these
// syscalls (open_tree_attr, statmount, listmount), and the point is to check the numbers the
// kernel really dispatches on. Numbers from 424 on are the same on every architecture.
// tests/seccomp/kernel_test.cpp checks that this list is exactly the preamble's, and calls each
// under the compiled filter; tests/namespace/security_escape_process_test.cpp calls each from
// inside a sandbox.
#pragma once

#include <cerrno>

namespace rlm::seccomp::test {

struct DeniedSyscall {
  long number;
  const char* name;
  int error;
};

inline constexpr DeniedSyscall kPreambleDeniedByNumber[] = {
#if defined(__x86_64__)
    {272, "unshare", EPERM},
    {308, "setns", EPERM},
    {165, "mount", EPERM},
    {166, "umount2", EPERM},
    {155, "pivot_root", EPERM},
    {246, "kexec_load", EPERM},
    {320, "kexec_file_load", EPERM},
    {175, "init_module", EPERM},
    {313, "finit_module", EPERM},
    {176, "delete_module", EPERM},
    {172, "iopl", EPERM},
    {173, "ioperm", EPERM},
    {167, "swapon", EPERM},
    {168, "swapoff", EPERM},
    {169, "reboot", EPERM},
    {163, "acct", EPERM},
    {212, "lookup_dcookie", EPERM},
    {179, "quotactl", EPERM},
    {321, "bpf", EPERM},
    {250, "keyctl", EPERM},
    {248, "add_key", EPERM},
    {249, "request_key", EPERM},
    {298, "perf_event_open", EPERM},
    {323, "userfaultfd", EPERM},
    {101, "ptrace", EPERM},
    {310, "process_vm_readv", EPERM},
    {311, "process_vm_writev", EPERM},
    {303, "name_to_handle_at", EPERM},
    {304, "open_by_handle_at", EPERM},
#elif defined(__aarch64__)
    {97, "unshare", EPERM},
    {268, "setns", EPERM},
    {40, "mount", EPERM},
    {39, "umount2", EPERM},
    {41, "pivot_root", EPERM},
    {104, "kexec_load", EPERM},
    {294, "kexec_file_load", EPERM},
    {105, "init_module", EPERM},
    {273, "finit_module", EPERM},
    {106, "delete_module", EPERM},
    {224, "swapon", EPERM},
    {225, "swapoff", EPERM},
    {142, "reboot", EPERM},
    {89, "acct", EPERM},
    {18, "lookup_dcookie", EPERM},
    {60, "quotactl", EPERM},
    {280, "bpf", EPERM},
    {219, "keyctl", EPERM},
    {217, "add_key", EPERM},
    {218, "request_key", EPERM},
    {241, "perf_event_open", EPERM},
    {282, "userfaultfd", EPERM},
    {117, "ptrace", EPERM},
    {270, "process_vm_readv", EPERM},
    {271, "process_vm_writev", EPERM},
    {264, "name_to_handle_at", EPERM},
    {265, "open_by_handle_at", EPERM},
#else
#error "the preamble's syscall numbers are listed for x86_64 and aarch64 only"
#endif
    // The same number on every architecture from here on.
    {425, "io_uring_setup", EPERM},
    {426, "io_uring_enter", EPERM},
    {427, "io_uring_register", EPERM},
    {428, "open_tree", EPERM},
    {429, "move_mount", EPERM},
    {430, "fsopen", EPERM},
    {431, "fsconfig", EPERM},
    {432, "fsmount", EPERM},
    {433, "fspick", EPERM},
    {435, "clone3", ENOSYS},
    {437, "openat2", ENOSYS},
    {438, "pidfd_getfd", EPERM},
    {442, "mount_setattr", EPERM},
    {443, "quotactl_fd", EPERM},
    {457, "statmount", ENOSYS},
    {458, "listmount", ENOSYS},
    {467, "open_tree_attr", EPERM},
};

}  // namespace rlm::seccomp::test
