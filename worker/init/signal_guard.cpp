#include "signal_guard.hpp"

#include "proc_stat.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <poll.h>
#include <sys/stat.h>
#include <sys/statfs.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <climits>
#include <compare>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace rlm::init {
namespace {

constexpr long kPidfsMagic = 0x50494446;  // PID_FS_MAGIC

// Creation order: (pidfs inode, 0), or (start time in clock ticks, pid).
struct Age {
  unsigned long long major = 0;
  unsigned long long minor = 0;
  auto operator<=>(const Age&) const = default;
};

struct Caller {
  pid_t tgid = 0;
  pid_t session = 0;
  Age age;
};

class Pidfd {
 public:
  explicit Pidfd(pid_t pid) : fd_(static_cast<int>(syscall(SYS_pidfd_open, pid, 0))) {}
  ~Pidfd() {
    if (fd_ >= 0) close(fd_);
  }
  Pidfd(const Pidfd&) = delete;
  Pidfd& operator=(const Pidfd&) = delete;
  int get() const { return fd_; }
  // False once the process has exited (a pidfd polls readable then).
  bool alive() const {
    pollfd watched{fd_, POLLIN, 0};
    return poll(&watched, 1, 0) == 0;
  }

 private:
  int fd_;
};

// The thread group of a thread id; 0 when there is no such thread, -1 when it cannot be read.
pid_t thread_group_of(pid_t tid) {
  char path[32];
  std::snprintf(path, sizeof path, "/proc/%d/status", tid);
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return errno == ENOENT || errno == ESRCH ? 0 : -1;
  char buffer[4096];
  const ssize_t length = read(fd, buffer, sizeof buffer - 1);
  close(fd);
  if (length <= 0) return -1;
  buffer[length] = '\0';
  const char* line = std::strstr(buffer, "\nTgid:");
  if (!line) return -1;
  char* end = nullptr;
  const long tgid = std::strtol(line + 6, &end, 10);
  return end != line + 6 && tgid > 0 ? static_cast<pid_t>(tgid) : -1;
}

enum class Found { yes, gone, unknown };

Found age_of(pid_t tgid, bool pidfs, Age& age) {
  const Pidfd pidfd(tgid);
  if (pidfd.get() < 0) return errno == ESRCH ? Found::gone : Found::unknown;
  if (pidfs) {
    struct stat info {};
    if (fstat(pidfd.get(), &info) != 0) return Found::unknown;
    age = {static_cast<unsigned long long>(info.st_ino), 0};
    return Found::yes;
  }
  ProcStat stat;
  const bool read = read_proc_stat(tgid, stat);
  // Still alive after the read: the line was the pinned process's, not a recycled pid's.
  if (!pidfd.alive()) return Found::gone;
  if (!read) return Found::unknown;
  age = {stat.start, static_cast<unsigned long long>(tgid)};
  return Found::yes;
}

class Decision {
 public:
  Decision(const Caller& caller, bool pidfs) : caller_(caller), pidfs_(pidfs) {}

  // A thread group: the caller's own, or one started after it.
  bool reaches_process(pid_t tgid) const {
    if (tgid == caller_.tgid) return true;
    Age age;
    switch (age_of(tgid, pidfs_, age)) {
      case Found::yes:
        return age > caller_.age;
      case Found::gone:
        return true;  // the kernel answers ESRCH, or finds a process younger than the caller
      case Found::unknown:
        break;
    }
    return false;
  }

  // Any thread id (the kernel signals its whole thread group, or checks it for tgkill).
  bool reaches_thread(pid_t tid) const {
    if (tid <= 0) return false;
    const pid_t tgid = thread_group_of(tid);
    if (tgid == 0) return true;  // no such thread: ESRCH, or a younger process
    return tgid > 0 && reaches_process(tgid);
  }

  // Every live process whose `pick` field matches: a process group, a session, or (broadcast)
  // everything but init and the caller.
  enum class Scope { group, session, everyone };
  bool reaches_all(Scope scope, pid_t id) const {
    DIR* proc = opendir("/proc");
    if (!proc) return false;
    bool allowed = true;
    while (const dirent* item = readdir(proc)) {
      char* end = nullptr;
      const long pid = std::strtol(item->d_name, &end, 10);
      if (pid <= 0 || *end != '\0') continue;
      ProcStat stat;
      if (!read_proc_stat(static_cast<pid_t>(pid), stat) || stat.state == 'Z' || stat.state == 'X')
        continue;  // gone, or dead already
      const bool member = scope == Scope::group     ? stat.pgrp == id
                          : scope == Scope::session ? stat.session == id
                                                    : pid != 1 && pid != caller_.tgid;
      if (member && !reaches_process(static_cast<pid_t>(pid))) {
        allowed = false;
        break;
      }
    }
    closedir(proc);
    return allowed;
  }

  // kill(2)'s and F_SETOWN's target: > 0 a process, < -1 (or < 0 for F_SETOWN) a process group.
  bool reaches_owner(int who) const {
    if (who > 0) return reaches_thread(who);
    if (who == INT_MIN) return false;
    return reaches_all(Scope::group, -who);
  }

  // kill(0, ...): the caller's own process group. The group it is in when the signal is delivered
  // may not be the one read now (another of its threads, or its parent, may move it), but it can
  // only move within its session: every process of the session must be reachable.
  bool reaches_own_group() const { return reaches_all(Scope::session, caller_.session); }

  bool reaches_everyone() const { return reaches_all(Scope::everyone, 0); }

 private:
  const Caller& caller_;
  bool pidfs_;
};

int int_arg(const NotifyListener::Caught& call, int index) {
  // pid_t, int and unsigned int arguments: the kernel uses the low 32 bits.
  return static_cast<int>(static_cast<std::uint32_t>(call.args[index]));
}

}  // namespace

SignalGuard::SignalGuard() : pidfs_(false) {
  const Pidfd self(getpid());
  struct statfs info {};
  pidfs_ = self.get() >= 0 && fstatfs(self.get(), &info) == 0 &&
           static_cast<long>(info.f_type) == kPidfsMagic;
}

bool SignalGuard::allows(const NotifyListener::Caught& call) const {
  Caller caller;
  caller.tgid = thread_group_of(call.pid);
  if (caller.tgid <= 0) return false;
  ProcStat stat;
  if (!read_proc_stat(caller.tgid, stat) || age_of(caller.tgid, pidfs_, caller.age) != Found::yes)
    return false;
  caller.session = stat.session;
  const Decision decision(caller, pidfs_);
  switch (call.syscall) {
    case SYS_kill: {
      if (int_arg(call, 1) == 0) return true;  // only asks whether the target exists
      const int pid = int_arg(call, 0);
      if (pid == 0) return decision.reaches_own_group();
      if (pid == -1) return decision.reaches_everyone();
      return decision.reaches_owner(pid);
    }
    case SYS_tkill:
      return int_arg(call, 1) == 0 || decision.reaches_thread(int_arg(call, 0));
    case SYS_tgkill:
      return int_arg(call, 2) == 0 || decision.reaches_thread(int_arg(call, 1));
    case SYS_rt_sigqueueinfo:
      return decision.reaches_thread(int_arg(call, 0));
    case SYS_rt_tgsigqueueinfo:
      return decision.reaches_thread(int_arg(call, 1));
    case SYS_prlimit64:
      return decision.reaches_thread(int_arg(call, 0));
    case SYS_fcntl:
      if (int_arg(call, 1) != F_SETOWN) return false;
      return int_arg(call, 2) == 0 || decision.reaches_owner(int_arg(call, 2));
    default:
      return false;
  }
}

}  // namespace rlm::init
