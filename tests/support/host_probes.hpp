// What a run could leave behind in this test process and on the host (fds, children, processes,
// cgroups, mounts), for tests that check a backend cleans up after itself.
#pragma once

#include <sys/stat.h>
#include <sys/types.h>
#include <unistd.h>

#include <cstddef>
#include <set>
#include <string>
#include <vector>

#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/policy.hpp"

namespace rlm::test {

// Whether this host idmaps a root caller's read-write binds (namespace/idmap.hpp): that needs
// CAP_SYS_ADMIN over the filesystem, which a container without it lacks; root's writes then go
// to the output uid instead. Asked of the namespace backend once (a file written through a bind);
// rootless, the caller's uid is the sandbox's, and this is true.
inline bool root_binds_idmapped() {
  static const bool idmapped = [] {
    if (getuid() != 0) return true;
    char dir[] = "/tmp/rlm-idmap-probe-XXXXXX";
    if (!mkdtemp(dir)) return false;
    chmod(dir, 0777);  // the fallback writes as the sandbox's own uid
    rlm::Policy policy = rlm::load_policy("default");
    rlm::Mount bind;
    bind.source = dir;
    bind.target = "/out";
    bind.type = rlm::Mount::Type::bind;
    bind.readonly = false;
    policy.filesystem.mounts.push_back(bind);
    rlm::Request request;
    request.argv = {"/bin/sh", "-c", "echo > /out/probe"};
    const std::string probe = std::string(dir) + "/probe";
    bool root_owned = false;
    if (auto backend = rlm::make_backend("namespace");
        backend && backend->run(request, policy).status == rlm::Status::ok) {
      struct stat st {};
      root_owned = lstat(probe.c_str(), &st) == 0 && st.st_uid == 0;
    }
    unlink(probe.c_str());
    rmdir(dir);
    return root_owned;
  }();
  return idmapped;
}

// Whose the files are on the host that a namespace sandbox run by this process writes through a
// read-write bind: this process's own (idmapped to them, root's too), except root's where this
// host cannot idmap, which the output uid gets (RLM_SANDBOX_OUTPUT_UID, unset in the tests).
inline uid_t written_uid() {
  return root_binds_idmapped() ? getuid() : 0x70010000u;
}
inline gid_t written_gid() {
  return root_binds_idmapped() ? getgid() : 0x70010000u;
}

// The same for a landlock sandbox (runtime/host/sandbox_uid.hpp, sandbox_write_owner): this
// process's own ids, except root's, which become the output uid's (RLM_SANDBOX_OUTPUT_UID, unset
// in the tests).
inline uid_t landlock_written_uid() {
  return getuid() == 0 ? 0x70010000u : getuid();
}
inline gid_t landlock_written_gid() {
  return getgid() == 0 ? 0x70010000u : getgid();
}

// This process's open file descriptors.
std::size_t open_fd_count();

// Pids of live or zombie processes whose parent is this process.
std::vector<pid_t> children_of_this_process();

// Pids of processes whose command line contains `needle` (NULs between arguments become spaces).
std::vector<pid_t> processes_with_cmdline(const std::string& needle);

// Pids of processes whose environment holds `needle`, e.g. "NAME=value" (NULs between the
// variables become spaces).
std::vector<pid_t> processes_with_environment(const std::string& needle);

// The directories below `root` down to `max_depth` levels (1: its entries only), symlinks not
// followed. Other processes on the machine create and remove directories there (cgroups of their
// sandboxes) while this reads: one that vanishes mid-walk is skipped, never ends the walk.
std::vector<std::string> directories_below(const std::string& root, int max_depth);

// cgroup directories this process created for its runs (their names start with "<pid>-", see
// runtime/cgroup/run_id.hpp), anywhere under /sys/fs/cgroup.
std::vector<std::string> own_cgroup_dirs();

// This process's /proc/self/mountinfo.
std::string mountinfo();

// Moves this process into a mount namespace of its own, a copy of the one it is in, so that its
// mount table changes only through this process and what it starts: a mount or unmount elsewhere
// on the machine (another test's docker container, anything) no longer shows in it, while a mount
// one of its runs leaves still does -- the copy's mounts are made shared anew, so a mount made in
// a namespace cloned from it that propagates back appears here too. Done once per process; it
// must be the only thread (a thread that already exists would stay behind). False, and nothing
// changed, where that cannot be done (no CAP_SYS_ADMIN, more than one thread): the table read is
// then the one the machine shares.
bool isolate_mount_table();

// The lines of /proc/self/mountinfo as a set: a mount made or removed between two readings is in
// exactly one of them, whatever else changed in the order of the lines.
std::set<std::string> mount_table();

// The mount table now, to compare with `before`: the mounts of `before` whose mount point is gone
// are counted as still there. When a process removes a directory something is mounted on, the
// kernel detaches that mount in every mount namespace, an isolated one too (another test's docker
// container going away does that); a mount a run of this process unmounted keeps its mount point.
std::set<std::string> mount_table_since(const std::set<std::string>& before);

}  // namespace rlm::test
