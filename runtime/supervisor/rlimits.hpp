// The resource limits (setrlimit) a policy asks for, typed. rlm-sandbox-init's --rlimit
// NAME=SOFT:HARD arguments and Docker's HostConfig.Ulimits are written from them, each where it
// is built; backends choose among them by resource.
#pragma once

#include <algorithm>
#include <array>
#include <cstddef>
#include <cstdint>
#include <string_view>
#include <vector>

#include "rlm_sandbox/policy.hpp"

namespace rlm::supervisor {

enum class Resource { cpu, as, fsize, nofile, core, nproc };  // resource_name() follows this order

struct ResourceLimit {
  Resource resource;
  std::uint64_t soft, hard;
};

// The name init's --rlimit and Docker's Ulimits both use: "cpu", "as", "fsize", ...
constexpr std::string_view resource_name(Resource resource) {
  constexpr std::array<std::string_view, 6> kNames = {"cpu",    "as",   "fsize",
                                                      "nofile", "core", "nproc"};
  return kNames[static_cast<std::size_t>(resource)];
}

// In this order: cpu: soft = the CPU time rounded up to whole seconds (SIGXCPU; a budget under
// one second still gets one), hard = soft + 1 (SIGKILL, for a payload that handles SIGXCPU);
// as = memory_bytes; fsize = file_size_bytes; nofile = open_files; core = 0.
inline std::vector<ResourceLimit> policy_rlimits(const Limits& limits) {
  const auto cpu_ms =
      static_cast<std::uint64_t>(std::max<std::int64_t>(limits.cpu_time.count(), 0));
  const std::uint64_t cpu_seconds = std::max<std::uint64_t>(1, (cpu_ms + 999) / 1000);
  return {
      {Resource::cpu, cpu_seconds, cpu_seconds + 1},
      {Resource::as, limits.memory_bytes, limits.memory_bytes},
      {Resource::fsize, limits.file_size_bytes, limits.file_size_bytes},
      {Resource::nofile, limits.open_files, limits.open_files},
      {Resource::core, 0, 0},
  };
}

}  // namespace rlm::supervisor
