#include "docker/container_spec.hpp"

#include <limits.h>
#include <stdlib.h>
#include <sys/stat.h>

#include <algorithm>
#include <cmath>
#include <cstdint>

#include "docker/ownership.hpp"
#include "policy/python_environment.hpp"
#include "seccomp/seccomp.hpp"
#include "supervisor/rlimits.hpp"

namespace rlm::docker {
namespace {

std::string joined(const std::vector<Diagnostic>& problems) {
  std::string text;
  for (const auto& problem : problems) text += "\n  " + problem.to_string();
  return text;
}

bool host_path_exists(const std::string& path) {
  struct stat info {};
  return ::stat(path.c_str(), &info) == 0;  // follows symlinks: a dangling one counts as missing
}

bool is_under(const std::string& path, const std::string& directory) {
  return path == directory || (path.starts_with(directory) && path[directory.size()] == '/');
}

// A bind of a host symlink onto the same path (/bin -> usr/bin, /sbin -> usr/sbin) is how the
// namespace backend recreates the host's layout. Docker cannot make a symlink in the container;
// when another bind already brings the link's destination to the same place (/usr bound at /usr),
// the image's own /bin or /sbin is left as it is instead of binding the destination a second time.
bool is_covered_symlink(const Mount& mount, const Policy& policy) {
  if (mount.type != Mount::Type::bind || mount.target != mount.source) return false;
  struct stat link {};
  if (::lstat(mount.source.c_str(), &link) != 0 || !S_ISLNK(link.st_mode)) return false;
  char resolved[PATH_MAX];
  if (!::realpath(mount.source.c_str(), resolved)) return false;
  for (const auto& other : policy.filesystem.mounts)
    if (&other != &mount && other.type == Mount::Type::bind && other.target == other.source &&
        is_under(resolved, other.source))
      return true;
  return false;
}

bool is_shared_tmp(const std::string& target) {
  return target == "/tmp" || target == "/var/tmp";
}

nlohmann::json mount_entry(const Mount& mount, const Policy& policy) {
  if (mount.type == Mount::Type::tmpfs) {
    return {{"Type", "tmpfs"},
            {"Target", mount.target},
            {"ReadOnly", mount.readonly},
            {"TmpfsOptions",
             {{"SizeBytes", mount.size_bytes.value_or(policy.limits.tmpfs_bytes)},
              {"Mode", is_shared_tmp(mount.target) ? 01777 : 0755}}}};
  }
  // rprivate: nothing mounted on the host later shows up inside, nothing inside reaches the host.
  return {{"Type", "bind"},
          {"Source", mount.source},
          {"Target", mount.target},
          {"ReadOnly", mount.readonly},
          {"BindOptions", {{"Propagation", "rprivate"}}}};
}

// The policy's rlimits as every init-launching backend sets them (CPU time per process in whole
// seconds, its hard limit one more so SIGXCPU comes before SIGKILL; file size; open files; no core
// dumps), but RLIMIT_AS: the container's cgroup holds the memory.
nlohmann::json ulimits(const Limits& limits) {
  auto entries = nlohmann::json::array();
  for (const auto& limit : supervisor::policy_rlimits(limits))
    if (limit.resource != supervisor::Resource::as)
      entries.push_back({{"Name", supervisor::resource_name(limit.resource)},
                         {"Soft", limit.soft},
                         {"Hard", limit.hard}});
  return entries;
}

}  // namespace

std::vector<Diagnostic> unsupported_fields(const Policy& policy, const DaemonTraits& daemon) {
  std::vector<Diagnostic> problems;
  if (!policy.namespaces.mount)
    problems.push_back({"namespaces.mount",
                        "false cannot be honoured by the docker backend: every container has its "
                        "own mount namespace (its root filesystem is the image)"});
  if (policy.namespaces.user && policy.user.uid == 0 && !daemon.remaps_users)
    problems.push_back(
        {"user.uid",
         "0 would be the host's root inside the container: this Docker daemon does not remap "
         "users (no userns-remap), so namespaces.user cannot be honoured for uid 0; run as another "
         "uid, set namespaces.user to false to accept a root payload, or use the namespace "
         "backend"});
  if (!policy.capabilities.empty() && policy.user.uid != 0)
    problems.push_back(
        {"capabilities", "Docker gives added capabilities to uid 0 only (user.uid is " +
                             std::to_string(policy.user.uid) +
                             "), so the payload would run without them; use the namespace backend, "
                             "or user.uid 0 with namespaces.user false"});
  try {
    seccomp::docker_profile(policy.seccomp);
  } catch (const Error& error) {
    problems.push_back({"seccomp", error.what()});
  }
  return problems;
}

void require_supported(const Policy& policy, const DaemonTraits& daemon) {
  const auto problems = unsupported_fields(policy, daemon);
  if (problems.empty()) return;
  const std::string name = policy.name.empty() ? "this policy" : "policy '" + policy.name + "'";
  throw Error("the docker backend cannot honour " + name + " as written:" + joined(problems));
}

nlohmann::json create_body(const Policy& policy, const ContainerPlan& plan) {
  const auto& limits = policy.limits;
  const auto& namespaces = policy.namespaces;

  auto mounts = nlohmann::json::array();
  // Docker bind-mounts its init at /sbin/docker-init; a mount on /sbin would hide it.
  bool init_fits = true;
  for (const auto& mount : policy.filesystem.mounts) {
    if (mount.type == Mount::Type::bind && mount.optional && !host_path_exists(mount.source))
      continue;
    if (is_covered_symlink(mount, policy)) continue;
    if (mount.target == "/sbin") init_fits = false;
    mounts.push_back(mount_entry(mount, policy));
  }
  // The Python environment's directories, read-only at their host paths (Docker orders the
  // mounts by depth itself).
  for (const auto& dir : policy::python_dirs(policy)) {
    if (dir.bound_by_policy) continue;
    Mount mount;
    mount.source = mount.target = dir.path;
    mounts.push_back(mount_entry(mount, policy));
  }

  nlohmann::json host_config = {
      {"NetworkMode", policy.network == Network::host ? "host" : "none"},
      {"Memory", limits.memory_bytes},
      {"MemorySwap", limits.memory_bytes},  // equal: no swap on top of the memory limit
      {"PidsLimit", limits.pids},
      {"Ulimits", ulimits(limits)},
      {"CapDrop", {"ALL"}},
      {"CapAdd", policy.capabilities},
      {"SecurityOpt",
       {"no-new-privileges", "seccomp=" + seccomp::docker_profile(policy.seccomp).dump()}},
      {"ReadonlyRootfs", true},
      {"Mounts", mounts},
      {"ShmSize", limits.tmpfs_bytes},
      // PID 1 is Docker's init (tini): it reaps orphans and forwards SIGTERM to the payload.
      // Without it (a policy mounting /sbin) the payload is PID 1: the wall timeout still ends
      // the whole container, by SIGKILL after the grace if it ignores SIGTERM.
      {"Init", init_fits},
      {"IpcMode", namespaces.ipc ? "private" : "host"},
      {"PidMode", namespaces.pid ? "" : "host"},
      {"UTSMode", namespaces.uts ? "" : "host"},
      {"CgroupnsMode", namespaces.cgroup ? "private" : "host"},
      {"UsernsMode", namespaces.user ? "" : "host"},
      // The output is read through an attach; nothing is kept on the daemon's disk.
      {"LogConfig", {{"Type", "none"}, {"Config", nlohmann::json::object()}}},
      {"AutoRemove", false},  // removed by us, after its exit code and OOM flag are read
  };

  nlohmann::json body = {
      {"Image", policy.docker.image},
      {"Entrypoint", nlohmann::json::array()},  // the command runs as given, like elsewhere
      {"Cmd", plan.command},
      {"Env", plan.environment},
      {"User", std::to_string(policy.user.uid) + ":" + std::to_string(policy.user.gid)},
      {"WorkingDir", policy.filesystem.workdir.empty() ? "/" : policy.filesystem.workdir},
      {"Labels",
       {{std::string(kManagedLabel), "1"},
        {std::string(kSessionLabel), plan.session},
        {std::string(kOwnerLabel), plan.owner},
        {std::string(kBootLabel), boot_id()}}},
      {"AttachStdin", plan.open_stdin},
      {"AttachStdout", true},
      {"AttachStderr", true},
      {"OpenStdin", plan.open_stdin},
      {"StdinOnce", plan.open_stdin},  // the payload sees EOF when the attach's stdin ends
      {"Tty", false},
      {"HostConfig", std::move(host_config)},
  };
  if (namespaces.uts) body["Hostname"] = policy.hostname;
  // CPU bandwidth of the whole container, in billionths of a CPU (docker run --cpus).
  if (limits.cpus)
    body["HostConfig"]["NanoCpus"] = static_cast<std::int64_t>(std::llround(*limits.cpus * 1e9));
  return body;
}

}  // namespace rlm::docker
