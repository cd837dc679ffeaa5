#include "local/rlimits.hpp"

#include <algorithm>
#include <cstdint>

namespace rlm::local {
namespace {

std::string limit(const char* name, std::uint64_t soft, std::uint64_t hard) {
  return std::string(name) + "=" + std::to_string(soft) + ":" + std::to_string(hard);
}

}  // namespace

std::vector<std::string> rlimit_arguments(const Limits& limits) {
  // RLIMIT_CPU counts whole seconds; a budget under one second still gets one.
  const auto cpu_ms =
      static_cast<std::uint64_t>(std::max<std::int64_t>(limits.cpu_time.count(), 0));
  const std::uint64_t cpu_seconds = std::max<std::uint64_t>(1, (cpu_ms + 999) / 1000);
  return {
      limit("cpu", cpu_seconds, cpu_seconds + 1),
      limit("as", limits.memory_bytes, limits.memory_bytes),
      limit("fsize", limits.file_size_bytes, limits.file_size_bytes),
      limit("nofile", limits.open_files, limits.open_files),
      limit("core", 0, 0),
  };
}

}  // namespace rlm::local
