#include "host/container.hpp"

#include <unistd.h>

#include <cstdlib>

#include "rlm_sys/self_readings.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::host {
namespace {

// The first line of `text` containing `needle`, trimmed for an evidence string.
std::string line_with(std::string_view text, std::string_view needle) {
  const auto at = text.find(needle);
  if (at == std::string_view::npos) return "";
  const auto start = text.rfind('\n', at);
  const auto begin = start == std::string_view::npos ? 0 : start + 1;
  const auto end = text.find('\n', at);
  std::string line(
      text.substr(begin, end == std::string_view::npos ? text.size() - begin : end - begin));
  if (line.size() > 120) line = line.substr(0, 117) + "...";
  return line;
}

}  // namespace

const char* container_name(ContainerKind::Kind kind) {
  switch (kind) {
    case ContainerKind::docker:
      return "docker";
    case ContainerKind::kubernetes:
      return "kubernetes";
    case ContainerKind::podman:
      return "podman";
    case ContainerKind::other:
      return "container";
    case ContainerKind::none:
      break;
  }
  return "none";
}

ContainerKind classify_container(const ContainerHints& hints) {
  const auto live = [](ContainerKind::Kind kind, std::string evidence) {
    return ContainerKind{kind, std::move(evidence), true};
  };
  // A pod's containers also look like containerd's or Docker's: Kubernetes first.
  if (hints.kubernetes_service_host && *hints.kubernetes_service_host)
    return live(ContainerKind::kubernetes, "KUBERNETES_SERVICE_HOST is set");
  if (const auto line = line_with(hints.cgroup, "kubepods"); !line.empty())
    return live(ContainerKind::kubernetes, "/proc/self/cgroup: " + line);
  // The runtime binds files of its own over these; a host never does.
  for (const auto& mount : sys::parse_mountinfo(hints.mountinfo)) {
    if (mount.mount_point != "/etc/hostname" && mount.mount_point != "/etc/hosts" &&
        mount.mount_point != "/etc/resolv.conf")
      continue;
    const std::string evidence = mount.mount_point + " bound from " + mount.root;
    if (mount.root.find("/kubelet/pods/") != std::string::npos)
      return live(ContainerKind::kubernetes, evidence);
    if (mount.root.find("/docker/containers/") != std::string::npos)
      return live(ContainerKind::docker, evidence);
    if (mount.root.find("/containers/storage/") != std::string::npos ||
        mount.root.find("/userdata/") != std::string::npos)
      return live(ContainerKind::podman, evidence);
    return live(hints.dockerenv ? ContainerKind::docker : ContainerKind::other, evidence);
  }
  if (hints.containerenv) return live(ContainerKind::podman, "/run/.containerenv exists");
  for (const char* needle : {"/docker/", "/docker-"})
    if (const auto line = line_with(hints.cgroup, needle); !line.empty())
      return live(ContainerKind::docker, "/proc/self/cgroup: " + line);
  if (const auto line = line_with(hints.cgroup, "libpod"); !line.empty())
    return live(ContainerKind::podman, "/proc/self/cgroup: " + line);
  if (const auto line = line_with(hints.cgroup, "/lxc"); !line.empty())
    return live(ContainerKind::other, "/proc/self/cgroup: " + line);
  if (hints.container_variable && *hints.container_variable)
    return live(ContainerKind::other, std::string("container=") + hints.container_variable);
  if (hints.dockerenv)
    return {ContainerKind::docker,
            "/.dockerenv exists, but no mount or cgroup of this process says so (the file may "
            "come from an exported container image)",
            false};
  return {};
}

ContainerKind detect_container() {
  static const ContainerKind detected = [] {
    const std::string cgroup = sys::self_cgroup().value_or("");
    const std::string mountinfo = sys::self_mountinfo().value_or("");
    ContainerHints hints;
    hints.dockerenv = access("/.dockerenv", F_OK) == 0;
    hints.containerenv = access("/run/.containerenv", F_OK) == 0;
    hints.kubernetes_service_host = std::getenv("KUBERNETES_SERVICE_HOST");
    hints.container_variable = std::getenv("container");
    hints.cgroup = cgroup;
    hints.mountinfo = mountinfo;
    return classify_container(hints);
  }();
  return detected;
}

}  // namespace rlm::host
