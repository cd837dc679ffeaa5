#include "process/child_start.hpp"

#include <sched.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>

namespace rlm::process {
namespace {

#ifndef CLONE_INTO_CGROUP
constexpr std::uint64_t CLONE_INTO_CGROUP = 0x200000000ULL;
#endif

// linux/sched.h's struct clone_args (its header clashes with glibc's <sched.h>). Fields past
// `size` are unknown to older kernels, which then answer E2BIG.
struct CloneArgs {
  std::uint64_t flags = 0;
  std::uint64_t pidfd = 0;
  std::uint64_t child_tid = 0;
  std::uint64_t parent_tid = 0;
  std::uint64_t exit_signal = 0;
  std::uint64_t stack = 0;
  std::uint64_t stack_size = 0;
  std::uint64_t tls = 0;
  std::uint64_t set_tid = 0;
  std::uint64_t set_tid_size = 0;
  std::uint64_t cgroup = 0;
};
constexpr std::size_t kArgsSizeWithoutCgroup = 64;  // CLONE_ARGS_SIZE_VER0
constexpr std::size_t kArgsSizeWithCgroup = 88;     // CLONE_ARGS_SIZE_VER2
static_assert(sizeof(CloneArgs) == kArgsSizeWithCgroup);

long clone3(CloneArgs& args, std::size_t size) noexcept {
  return syscall(SYS_clone3, &args, size);
}

// clone(2) with a null stack pointer continues on a copy of the caller's stack, like fork. The
// raw argument order differs by architecture (x86_64: flags, stack, parent_tid, child_tid, tls;
// aarch64 and most others: flags, stack, parent_tid, tls, child_tid); only parent_tid is used.
long legacy_clone(unsigned long flags, int* pidfd) noexcept {
  return syscall(SYS_clone, flags, nullptr, pidfd, nullptr, nullptr);
}

StartedChild clone_process(std::uint64_t namespaces, int cgroup_fd) noexcept {
  StartedChild result;
  int pidfd = -1;
  CloneArgs args;
  args.flags = namespaces | CLONE_PIDFD;
  args.pidfd = reinterpret_cast<std::uintptr_t>(&pidfd);
  args.exit_signal = SIGCHLD;
  std::size_t size = kArgsSizeWithoutCgroup;
  if (cgroup_fd >= 0) {
    args.flags |= CLONE_INTO_CGROUP;
    args.cgroup = static_cast<std::uint64_t>(cgroup_fd);
    size = kArgsSizeWithCgroup;
  }
  long pid = clone3(args, size);
  // E2BIG/EINVAL: a kernel (5.3-5.6) that knows clone3 but not CLONE_INTO_CGROUP.
  if (pid < 0 && cgroup_fd >= 0 && (errno == E2BIG || errno == EINVAL)) {
    args.flags &= ~CLONE_INTO_CGROUP;
    args.cgroup = 0;
    size = kArgsSizeWithoutCgroup;
    pid = clone3(args, size);
  }
  if (pid < 0 && errno == ENOSYS) {
    // No clone3 (kernel < 5.3, or a seccomp profile answering ENOSYS as ours does).
    size = 0;
    pid = legacy_clone(static_cast<unsigned long>(namespaces | CLONE_PIDFD | SIGCHLD), &pidfd);
    if (pid < 0 && errno == EINVAL)  // kernel < 5.2: no CLONE_PIDFD
      pid = legacy_clone(static_cast<unsigned long>(namespaces | SIGCHLD), nullptr);
  }
  result.pid = static_cast<pid_t>(pid);
  if (pid > 0) {
    result.pidfd = pidfd;
    result.into_cgroup = size == kArgsSizeWithCgroup;
  }
  return result;
}

// The vfork child's stack: enough for the deepest child the runtime runs this way (the recycled
// sandbox's setup, raw syscalls and small frames), with a guard page below it.
constexpr std::size_t kVforkStack = 256u << 10;

struct VforkStart {
  void (*run)(void*);
  void* argument;
};

// One stack per calling thread, mapped at its first vfork child and kept until the thread ends:
// each child has exec'd or exited before its clone returns (CLONE_VFORK), so the next child of
// the same thread may reuse it. A recycling pool starts a child per run; mapping, guarding and
// unmapping a fresh stack each time cost page faults and, on the unmap, a TLB shootdown of every
// CPU the busy, multithreaded process runs on.
class VforkStack {
 public:
  VforkStack() = default;
  VforkStack(const VforkStack&) = delete;
  VforkStack& operator=(const VforkStack&) = delete;
  ~VforkStack() {
    if (base_) munmap(base_, size_);
  }

  // The top of the stack (it grows down), or nullptr with errno set.
  char* top() noexcept {
    if (!base_) {
      const std::size_t page = static_cast<std::size_t>(sysconf(_SC_PAGESIZE));
      void* base = mmap(nullptr, kVforkStack + page, PROT_READ | PROT_WRITE,
                        MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE | MAP_STACK, -1, 0);
      if (base == MAP_FAILED) return nullptr;
      if (mprotect(base, page, PROT_NONE) != 0) {
        const int error = errno;
        munmap(base, kVforkStack + page);
        errno = error;
        return nullptr;
      }
      base_ = base;
      size_ = kVforkStack + page;
    }
    return static_cast<char*>(base_) + size_;
  }

 private:
  void* base_ = nullptr;
  std::size_t size_ = 0;
};

thread_local VforkStack t_vfork_stack;

int vfork_child_main(void* start) {
  const auto& what = *static_cast<const VforkStart*>(start);
  what.run(what.argument);
  _exit(kChildReturnedExit);
}

}  // namespace

StartedChild vfork_clone(std::uint64_t namespaces, void (*run)(void*), void* argument) noexcept {
  StartedChild result;
  char* const stack_top = t_vfork_stack.top();
  if (!stack_top) {
    result.error = errno;
    return result;
  }
  VforkStart start{run, argument};
  int pidfd = -1;
  const int flags = static_cast<int>(namespaces) | CLONE_VM | CLONE_VFORK | CLONE_PIDFD | SIGCHLD;
  // The child uses this thread's errno (no TLS of its own): keep the clone's own.
  const int pid = clone(vfork_child_main, stack_top, flags, &start, &pidfd);
  const int error = errno;
  result.pid = pid;
  if (pid < 0) {
    result.error = error;
    return result;
  }
  result.pidfd = pidfd;
  return result;
}

StartedChild fork_or_clone(const ChildOptions& options) noexcept {
  if (options.namespaces != 0 || options.cgroup_fd >= 0)
    return clone_process(options.namespaces, options.cgroup_fd);
  StartedChild result;
  result.pid = _Fork();
  return result;
}

}  // namespace rlm::process
