// Small, exception-free helpers over cgroupfs files shared by the v1 and v2 code, the usage reader
// and stale-group collection: read/write control files, list and kill a group's members, remove a
// group tree.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace rlm::cgroup::cgfs {

// The whole file, or nullopt (errno set) when it cannot be read.
std::optional<std::string> read_file(const std::string& path);
// Writes `value` with a single write(2), as cgroupfs expects. Returns 0 or the errno.
int write_file(const std::string& path, std::string_view value);
bool exists(const std::string& path);

// "key value" lines (memory.events, pids.events, cpu.stat, memory.oom_control): the value of
// `key`, or nullopt when the file or key is missing.
std::optional<std::uint64_t> read_key(const std::string& path, std::string_view key);
// The same, in such a file's text already read (several keys of one file in one read).
std::optional<std::uint64_t> key_value(std::string_view text, std::string_view key);
// A file holding one number (memory.peak, cpuacct.usage), or nullopt.
std::optional<std::uint64_t> read_number(const std::string& path);
// The same, in such a file's text already read.
std::optional<std::uint64_t> parse_number(std::string_view text);
// The whitespace-separated words of a file (cgroup.controllers, cgroup.subtree_control).
std::vector<std::string> read_words(const std::string& path);
bool contains(const std::vector<std::string>& words, std::string_view word);

// The pids listed in <group>/cgroup.procs (empty when the group is empty or gone).
std::vector<pid_t> members(const std::string& group);

// SIGKILLs every process listed in the groups' cgroup.procs, once. A pid is pinned with a pidfd
// and its /proc/<pid>/cgroup re-read afterwards, so a pid recycled by an unrelated process
// between reading cgroup.procs and the kill is never hit. `group_suffix` ("/rlm-sandbox/<id>")
// is how membership is recognised. Returns how many processes were signalled.
int kill_members_once(const std::vector<std::string>& groups, std::string_view group_suffix);

// Repeats kill_members_once until every group's cgroup.procs is empty or `timeout` passes.
// Converges for a fork bomb: a process with SIGKILL pending cannot fork, and pids.max bounds how
// many can appear between two sweeps. True when empty.
bool kill_until_empty(const std::vector<std::string>& groups, std::string_view group_suffix,
                      std::chrono::milliseconds timeout);

// Kills everything in `group` and its descendants and rmdirs them depth-first, retrying while
// the kernel still counts exiting members (EBUSY), until `timeout`. ENOENT counts as removed
// (another collector got there first). True when the directory is gone.
bool remove_group(const std::string& group, std::string_view group_suffix,
                  std::chrono::milliseconds timeout);

// mkdir that treats "already there" as success. Returns 0 or the errno.
int make_dir(const std::string& path);

}  // namespace rlm::cgroup::cgfs
