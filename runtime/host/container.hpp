// Whether this process runs inside a container, and which kind: the hints a container runtime
// leaves (KUBERNETES_SERVICE_HOST, /run/.containerenv, the cgroup paths of /proc/self/cgroup, the
// files Docker, Podman and the kubelet bind over /etc/hostname, /etc/hosts and /etc/resolv.conf,
// /.dockerenv). Used to word advice (the namespace backend's fixes, the docker backend's socket)
// and, when confirmed, as one of the signals that make backend selection run the namespace
// backend's real setup probe. Never a security decision.
#pragma once

#include <string>
#include <string_view>

namespace rlm::host {

struct ContainerKind {
  enum Kind { none, docker, kubernetes, podman, other } kind = none;
  std::string evidence;  // what gave it away, e.g. "/etc/hostname bound from ..."; "" for none
  // The evidence is the live process's (its environment, cgroups or mounts), not only /.dockerenv:
  // a file in the root filesystem that `docker export` carries into images and VMs built from a
  // container, so on its own it may be stale.
  bool confirmed = false;
};

// Detected once per process (the answer does not change while it runs).
ContainerKind detect_container();

// "docker", "kubernetes", "podman", "container", "none".
const char* container_name(ContainerKind::Kind kind);

// The classification from what detect_container() reads, so tests can give it text: whether the
// files exist, KUBERNETES_SERVICE_HOST's value (or nullptr), /proc/self/cgroup's and
// /proc/self/mountinfo's contents, $container's value (or nullptr).
struct ContainerHints {
  bool dockerenv = false, containerenv = false;
  const char* kubernetes_service_host = nullptr;
  const char* container_variable = nullptr;
  std::string_view cgroup, mountinfo;
};
ContainerKind classify_container(const ContainerHints& hints);

}  // namespace rlm::host
