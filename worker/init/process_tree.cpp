#include "process_tree.hpp"

#include "proc_stat.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <unordered_map>
#include <unordered_set>

namespace rlm::init {
namespace {

int open_pidfd(pid_t pid) {
  return static_cast<int>(syscall(SYS_pidfd_open, pid, 0));
}

int send_via_pidfd(int pidfd, int signal) {
  return static_cast<int>(syscall(SYS_pidfd_send_signal, pidfd, signal, nullptr, 0));
}

bool read_entry(pid_t pid, ProcessEntry& entry) {
  ProcStat stat;
  if (!read_proc_stat(pid, stat)) return false;
  entry.pid = pid;
  entry.parent = stat.parent;
  entry.state = stat.state;
  return true;
}

std::vector<ProcessEntry> list_processes() {
  std::vector<ProcessEntry> entries;
  DIR* proc = opendir("/proc");
  if (!proc) return entries;
  while (const dirent* item = readdir(proc)) {
    char* end = nullptr;
    const long pid = std::strtol(item->d_name, &end, 10);
    if (pid <= 0 || *end != '\0') continue;
    ProcessEntry entry;
    if (read_entry(static_cast<pid_t>(pid), entry)) entries.push_back(entry);
  }
  closedir(proc);
  return entries;
}

// Signals one process, if after pinning it is still the one found below `root`.
bool signal_member(const ProcessEntry& member, pid_t root, const std::unordered_set<pid_t>& members,
                   int signal) {
  const auto in_tree = [&](pid_t parent) { return parent == root || members.count(parent) > 0; };
  const int pidfd = open_pidfd(member.pid);
  if (pidfd < 0 && errno != ENOSYS) return false;  // gone already
  // Re-read after pinning: a recycled pid would now show a parent outside the tree. (An orphan
  // reparented to init, or to a subreaper inside the tree, still counts as ours.)
  ProcessEntry now;
  const bool ours = read_entry(member.pid, now) && in_tree(now.parent);
  bool sent = false;
  if (ours) sent = (pidfd >= 0 ? send_via_pidfd(pidfd, signal) : kill(member.pid, signal)) == 0;
  if (pidfd >= 0) close(pidfd);
  return sent;
}

}  // namespace

std::vector<ProcessEntry> find_descendants(pid_t root) {
  const auto all = list_processes();
  std::unordered_multimap<pid_t, const ProcessEntry*> children;
  for (const auto& entry : all) children.emplace(entry.parent, &entry);
  std::vector<ProcessEntry> found;
  std::vector<pid_t> frontier{root};
  std::unordered_set<pid_t> seen{root};
  while (!frontier.empty()) {
    const pid_t parent = frontier.back();
    frontier.pop_back();
    const auto [begin, end] = children.equal_range(parent);
    for (auto it = begin; it != end; ++it) {
      const ProcessEntry& child = *it->second;
      if (!seen.insert(child.pid).second) continue;  // a cycle would mean a torn read
      found.push_back(child);
      frontier.push_back(child.pid);
    }
  }
  return found;
}

std::size_t signal_descendants(pid_t root, int signal) {
  const auto members = find_descendants(root);
  std::unordered_set<pid_t> member_pids;
  for (const auto& member : members) member_pids.insert(member.pid);
  std::size_t signalled = 0;
  for (const auto& member : members) {
    if (member.state == 'Z') continue;  // already dead; its parent (or init) reaps it
    if (signal_member(member, root, member_pids, signal)) ++signalled;
  }
  return signalled;
}

}  // namespace rlm::init
