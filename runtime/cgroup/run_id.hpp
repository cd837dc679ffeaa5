// Run ids name each run's group (and the docker backend's containers, docker/ownership.hpp) so
// that stale-group collection can tell whether the runtime process that made it is still alive:
// "<pid>-<starttime>-<pidns>-<counter>", where starttime is field 22 of /proc/<pid>/stat (guards
// against a recycled pid) and pidns the inode of the owner's PID namespace (a pid is only
// meaningful there; groups of owners in another PID namespace are never judged).
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace rlm::cgroup {

struct RunId {
  pid_t pid = 0;
  std::uint64_t start_time = 0;
  std::uint64_t pid_ns = 0;
  std::uint64_t counter = 0;
  std::string to_string() const;
};

// A fresh id owned by this process (thread-safe; never repeats within the process).
RunId next_run_id();
// Parses a directory name; nullopt for anything not written by to_string() (left untouched).
std::optional<RunId> parse_run_id(std::string_view name);

enum class Owner { alive, dead, unknown };
// Whether the process that created `id` still runs. `unknown` (another PID namespace, or /proc
// unreadable) means: do not touch.
Owner owner_state(const RunId& id);

// Field 22 of /proc/<pid>/stat, or nullopt when the process is gone.
std::optional<std::uint64_t> process_start_time(pid_t pid);
// The inode of this process's PID namespace, 0 if unknown.
std::uint64_t own_pid_ns();

}  // namespace rlm::cgroup
