// Shared helpers for the namespace backend's functional tests: the shipped default policy with
// roomier limits, one-call runs, a host directory bound into the sandbox, and (from
// support/host_probes.hpp) what a run could leave behind in this process.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <chrono>
#include <string>
#include <vector>

#include "host/sandbox_uid.hpp"
#include "namespace/namespace_backend.hpp"
#include "rlm_sandbox/backend.hpp"
#include "rlm_sandbox/policy.hpp"
#include "rlm_sandbox/request.hpp"
#include "rlm_sandbox/result.hpp"
#include "support/host_probes.hpp"
#include "support/subprocess.hpp"

namespace rlm::test {

using namespace std::chrono_literals;

// The shipped default (read-only system binds, tmpfs /tmp, workdir /tmp, user 1000, no network)
// with limits that leave room for a loaded test machine.
inline Policy ns_policy() {
  Policy policy = load_policy("default");
  policy.limits.wall_time = 20s;
  policy.limits.cpu_time = 20s;
  return policy;
}

inline Result run_ns(const std::vector<std::string>& argv, const Policy& policy = ns_policy(),
                     Request request = {}) {
  request.argv = argv;
  return ns::make_namespace_backend()->run(request, policy);
}

inline Result run_sh(const std::string& script, const Policy& policy = ns_policy(),
                     Request request = {}) {
  return run_ns({"sh", "-c", script}, policy, std::move(request));
}

inline std::string describe(const Result& result) {
  return result.to_json().dump();
}

// A host directory the sandbox user can write (under a root runtime its host uid is one of the
// sandbox uid range, different for every live sandbox), bound read-write at `target`.
inline void bind_writable(Policy& policy, const TempDir& dir, const std::string& target) {
  chmod(dir.path().c_str(), 0777);
  Mount mount;
  mount.source = dir.path();
  mount.target = target;
  mount.type = Mount::Type::bind;
  mount.readonly = false;
  policy.filesystem.mounts.push_back(mount);
}

// Whether `uid` is a host uid the sandbox user may be mapped to: one of the sandbox uid range
// (root runtime; each live sandbox has its own), the caller's own uid (rootless).
inline bool is_sandbox_host_uid(uid_t uid) {
  if (geteuid() != 0) return uid == geteuid();
  const auto range = host::sandbox_uid_range();
  return range.first <= uid && uid <= range.last;
}

}  // namespace rlm::test
