#include "namespace/setup_signals.hpp"

#include <linux/capability.h>
#include <unistd.h>

#include <cstdint>

#include "rlm_sys/self_readings.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::ns {
namespace {

// The value of "Name:\t..." in a /proc/PID/status text, trimmed; "" when missing.
std::string_view status_field(std::string_view status, std::string_view name) {
  std::size_t at = 0;
  while (at < status.size()) {
    const auto end = status.find('\n', at);
    std::string_view line =
        status.substr(at, end == std::string_view::npos ? std::string_view::npos : end - at);
    if (line.size() > name.size() && line.starts_with(name) && line[name.size()] == ':') {
      line.remove_prefix(name.size() + 1);
      while (!line.empty() && (line.front() == '\t' || line.front() == ' ')) line.remove_prefix(1);
      return line;
    }
    if (end == std::string_view::npos) break;
    at = end + 1;
  }
  return {};
}

// Mount points the kernel lets a new proc mount reveal: mounts on permanently empty directories
// (fs/namespace.c, mnt_already_visible()). binfmt_misc is the one hosts have.
bool on_empty_directory(std::string_view mount_point) {
  return mount_point == "/proc/sys/fs/binfmt_misc";
}

}  // namespace

bool status_has_seccomp_filter(std::string_view status) {
  const auto mode = status_field(status, "Seccomp");
  return !mode.empty() && mode != "0";
}

std::string first_masked_proc_path(std::string_view mountinfo) {
  for (const auto& mount : sys::parse_mountinfo(mountinfo))
    if (mount.mount_point.starts_with("/proc/") && !on_empty_directory(mount.mount_point))
      return mount.mount_point;
  return "";
}

std::string missing_root_caps(std::string_view status) {
  const std::string effective(status_field(status, "CapEff"));
  std::uint64_t caps = 0;
  try {
    caps = std::stoull(effective, nullptr, 16);
  } catch (const std::exception&) {
    return "CAP_SETUID, CAP_SETGID, CAP_SYS_ADMIN (no CapEff in /proc/self/status)";
  }
  std::string missing;
  for (const auto& [cap, name] :
       {std::pair{CAP_SETUID, "CAP_SETUID"}, std::pair{CAP_SETGID, "CAP_SETGID"},
        std::pair{CAP_SYS_ADMIN, "CAP_SYS_ADMIN"}})
    if ((caps & (std::uint64_t{1} << cap)) == 0)
      missing += (missing.empty() ? "" : ", ") + std::string(name);
  return missing;
}

std::string SetupSignals::describe() const {
  std::string parts;
  const auto add = [&parts](const std::string& part) {
    parts += (parts.empty() ? "" : ", ") + part;
  };
  if (seccomp_filter) add("a seccomp filter on the runtime (Seccomp: 2 in /proc/self/status)");
  if (masked_proc) add("/proc with masked paths (" + masked_example + ")");
  if (!root_missing_caps.empty()) add("root without " + root_missing_caps);
  if (!apparmor_profile.empty()) add("the AppArmor profile " + apparmor_profile);
  if (in_container())
    add(std::string("a ") + host::container_name(container.kind) + " container (" +
        container.evidence + ")");
  return parts;
}

SetupSignals read_setup_signals() {
  SetupSignals signals;
  const std::string status = sys::read_text_file("/proc/self/status");
  signals.seccomp_filter = status_has_seccomp_filter(status);
  signals.masked_example = first_masked_proc_path(sys::self_mountinfo().value_or(""));
  signals.masked_proc = !signals.masked_example.empty();
  if (geteuid() == 0) signals.root_missing_caps = missing_root_caps(status);
  std::string profile = sys::read_text_file("/proc/self/attr/apparmor/current", 4096);
  while (!profile.empty() && (profile.back() == '\n' || profile.back() == '\0')) profile.pop_back();
  if (!profile.empty() && profile != "unconfined")
    signals.apparmor_profile = profile.substr(0, 200);
  signals.container = host::detect_container();
  return signals;
}

}  // namespace rlm::ns
