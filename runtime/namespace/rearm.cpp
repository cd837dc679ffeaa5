#include "namespace/rearm.hpp"

#include <fcntl.h>
#include <poll.h>
#include <sched.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <string>

#include "namespace/child.hpp"
#include "process/child_failure.hpp"
#include "rlm_init/protocol.hpp"

namespace rlm::ns {
namespace {

[[noreturn]] void fail(const RearmPlan& plan, const process::ChildFailure& failure) noexcept {
  fail_child(plan.error_write, failure);
}

[[noreturn]] void fail(const RearmPlan& plan, const char* step) noexcept {
  fail_child(plan.error_write, step);
}

}  // namespace

void run_rearmed_child(const RearmPlan& plan) noexcept {
  umask(init_protocol::kPayloadUmask);
  close(plan.alive_write);
  close(plan.error_read);
  for (int fd : plan.join_cgroup_fds)
    if (fd >= 0 && write(fd, "0", 1) != 1) fail(plan, "joining the run's cgroup (tasks)");

  // The built tree made fresh where a run could write, as the host's root: the last run's /proc,
  // /dev/shm and writable tmpfs are detached (the kernel frees them once nothing holds them: every
  // process of that run is gone) and new ones mounted. No path here is one the sandbox writes.
  if (setns(plan.mount_ns, CLONE_NEWNS) != 0) fail(plan, "setns (the sandbox's mount namespace)");
  if (plan.net_ns >= 0 && setns(plan.net_ns, CLONE_NEWNET) != 0)
    fail(plan, "setns (the sandbox's network namespace)");
  process::ChildFailure failure;
  if (!plan.refresh->apply(failure)) fail(plan, failure);
  if (plan.hostname && sethostname(plan.hostname, plan.hostname_length) != 0)
    fail(plan, "sethostname");

  // Into the sandbox's user namespace, whose capabilities the rest needs and then drops.
  if (setns(plan.user_ns, CLONE_NEWUSER) != 0) fail(plan, "setns (the sandbox's user namespace)");
  // The namespace's limits were set by its first process and are kept with it.
  if (!apply_ids(*plan.ids, /*set_namespace_limits=*/false, failure)) fail(plan, failure);
  if (prctl(PR_SET_PDEATHSIG, SIGKILL) != 0) fail(plan, "prctl(PR_SET_PDEATHSIG)");
  pollfd parent{plan.alive_read, POLLIN, 0};
  if (poll(&parent, 1, 0) != 0) _exit(init_protocol::kInitFailureExit);
  if (setsid() < 0) fail(plan, "setsid");
  if (plan.cgroup_namespace && unshare(CLONE_NEWCGROUP) != 0)
    fail(plan, "unshare(CLONE_NEWCGROUP)");
  if (!plan.workdir->apply(failure)) fail(plan, failure);

  exec_init(plan.exec, plan.error_write);
}

std::string recycle_problem(const Policy& policy, bool privileged, bool has_cgroup,
                            bool binds_reclaimed) {
  if (!policy.capabilities.empty())
    return "recycling needs a policy that keeps no capability (the tree every run shares is the "
           "sandbox user namespace's: a capability there could change it for the next run)";
  if (!privileged)
    return "recycling needs a root runtime: the next run's namespaces are the host root's";
  if (!has_cgroup) return "recycling needs a cgroup (its counters restart per run)";
  if (policy.network != Network::none)
    return "recycling needs network \"none\": the state of an allowlist's or the host's "
           "network outlives a run";
  const auto& ns = policy.namespaces;
  if (!ns.pid || !ns.mount || !ns.ipc || !ns.uts)
    return "recycling needs the PID, mount, IPC and UTS namespaces (each run gets new ones)";
  if (binds_reclaimed)
    return "recycling needs idmapped read-write binds (what a run wrote is given back at the end)";
  return RootfsPlan::refresh_problem(policy);
}

namespace {

// Lines of a /proc/net table beyond its header (at most 2 counted: only "none" matters).
int entries_in(const std::string& path) {
  FILE* file = std::fopen(path.c_str(), "re");
  if (!file) return errno == ENOENT ? 0 : 2;  // a protocol this kernel lacks has none
  int lines = 0;
  char buffer[512];
  while (lines < 3 && std::fgets(buffer, sizeof buffer, file))
    if (std::strchr(buffer, '\n')) ++lines;
  std::fclose(file);
  return lines - 1;
}

// Every "inuse" and "tw" count of a sockstat file is 0 ("TCP: inuse 0 orphan 0 tw 0 alloc 3 mem
// 1"); orphan, alloc, mem and the first line's "sockets: used" are the whole machine's.
bool sockstat_is_empty(const std::string& path) {
  FILE* file = std::fopen(path.c_str(), "re");
  if (!file) return false;
  bool empty = true;
  char line[256];
  while (empty && std::fgets(line, sizeof line, file)) {
    for (const char* key : {" inuse ", " tw "}) {
      const char* at = std::strstr(line, key);
      if (at && std::strtoul(at + std::strlen(key), nullptr, 10) != 0) empty = false;
    }
  }
  std::fclose(file);
  return empty;
}

}  // namespace

bool network_namespace_is_empty(pid_t pid) {
  const std::string dir = "/proc/" + std::to_string(pid) + "/net/";
  // The namespace's own counters, not a walk of the TCP hash table (which is the machine's, and
  // costs milliseconds to list through /proc/net/tcp): TCP sockets hashed in it (orphans in
  // FIN_WAIT included) and in TIME_WAIT, UDP, raw and fragment queues, v4 and v6; then the unix
  // and packet sockets, whose tables are the namespace's own.
  return sockstat_is_empty(dir + "sockstat") && sockstat_is_empty(dir + "sockstat6") &&
         entries_in(dir + "unix") == 0 && entries_in(dir + "packet") == 0;
}

}  // namespace rlm::ns
