#include "docker/egress_holder.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>

#include "docker/ownership.hpp"
#include "docker/trust_store.hpp"
#include "host/unique_fd.hpp"
#include "netns/egress_capture.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"

namespace rlm::docker {
namespace {

// Room for the OCI runtime's own init (a Go program, its threads counted as pids and its memory
// charged to the container while it starts it) as well as `sleep`: tighter, a loaded machine's
// start fails now and then ("cannot start a stopped process").
constexpr std::int64_t kHolderMemory = 64ll << 20;
constexpr std::int64_t kHolderPids = 32;

// The inode of the network namespace at `path`, 0 when it cannot be read.
ino_t namespace_inode(const std::string& path) {
  struct stat info {};
  return stat(path.c_str(), &info) == 0 ? info.st_ino : 0;
}

}  // namespace

nlohmann::json holder_create_body(const Policy& policy, const std::string& run_id) {
  nlohmann::json host_config = {
      {"NetworkMode", "none"},
      {"Memory", kHolderMemory},
      {"MemorySwap", kHolderMemory},
      {"PidsLimit", kHolderPids},
      {"CapDrop", {"ALL"}},
      {"SecurityOpt", {"no-new-privileges"}},
      {"ReadonlyRootfs", true},
      {"LogConfig", {{"Type", "none"}, {"Config", nlohmann::json::object()}}},
      {"AutoRemove", false},
  };
  nlohmann::json body = {
      {"Image", policy.docker.image},
      {"Entrypoint", nlohmann::json::array()},
      // As PID 1 it dies only by SIGKILL, which the removal sends.
      {"Cmd", {"sleep", "2147483647"}},
      {"User", "65534:65534"},
      {"WorkingDir", "/"},
      {"Labels",
       {{std::string(kManagedLabel), "1"},
        {std::string(kSessionLabel), run_id},
        {std::string(kOwnerLabel), run_id},
        {std::string(kBootLabel), boot_id()}}},
      {"AttachStdin", false},
      {"AttachStdout", false},
      {"AttachStderr", false},
      {"Tty", false},
      {"HostConfig", std::move(host_config)},
  };
  // The payload's container takes its hostname from the network namespace's holder: Docker
  // refuses a hostname of its own with NetworkMode "container:".
  if (policy.namespaces.uts) body["Hostname"] = policy.hostname;
  return body;
}

EgressHolder::EgressHolder(const EngineApi& api, const Policy& policy, bool remaps_users,
                           const std::string& run_id,
                           std::chrono::steady_clock::time_point deadline)
    : remover_(api) {
  if (auto why = netns::capability_problem(policy, policy.namespaces.user && remaps_users);
      !why.empty())
    throw Error(why);
  auto plan = netns::EgressCapturePlan::prepare(policy.egress);
  auto upstream = egress::UpstreamSettings::from_environment();
  std::shared_ptr<const egress::Credentials> credentials;
  if (!policy.egress.inject.empty()) {
    credentials = std::make_shared<const egress::Credentials>(policy.egress, upstream);
    trust_file_.emplace(run_id, credentials->trust_bundle());
  }

  id_ = create_container(api, holder_create_body(policy, run_id), "rlm-sandbox-" + run_id + "-net");
  remover_.hold(id_);
  try {
    start_container(api, id_);
  } catch (const DaemonError& error) {
    const std::string what = error.what();
    const bool no_sleep = what.find("executable file not found") != std::string::npos ||
                          what.find("no such file or directory") != std::string::npos;
    throw Error(
        "network: the container that holds the allowlist's network namespace (the "
        "image's `sleep`, run as nobody) did not start: " +
        what + (no_sleep ? "; to fix: an image with `sleep` in its PATH" : ""));
  }
  const auto state = inspect_state(api, id_);
  const std::string path = "/proc/" + std::to_string(state.pid) + "/ns/net";
  host::UniqueFd namespace_fd(
      state.running && state.pid > 0 ? open(path.c_str(), O_RDONLY | O_CLOEXEC) : -1);
  const std::string cannot =
      "network: the docker backend enforces an allowlist from this process, joining the "
      "container's network namespace; ";
  if (!namespace_fd)
    throw Error(cannot + "its " + path + " cannot be opened (" + sys::errno_text(errno) +
                "): the Docker daemon must run on this host, in this PID namespace");
  // The pid read may have been reused before the open: the holder must still be that pid, and
  // its namespace must be one of its own (none: not this process's, not the host's).
  const auto again = inspect_state(api, id_);
  struct stat opened {};
  const ino_t joined = fstat(namespace_fd.get(), &opened) == 0 ? opened.st_ino : 0;
  if (!again.running || again.pid != state.pid || joined == 0 ||
      joined == namespace_inode("/proc/self/ns/net") || joined == namespace_inode("/proc/1/ns/net"))
    throw Error(cannot + "the holder's namespace could not be told apart from another's");
  try {
    proxy_ = std::make_unique<egress::EgressProxy>(plan.capture_in(namespace_fd.get(), deadline),
                                                   policy.egress, std::move(upstream),
                                                   std::move(credentials));
  } catch (const Error& error) {
    throw Error(
        cannot + error.what() +
        (geteuid() != 0 ? " (joining another process's network namespace needs root)" : ""));
  }
}

EgressHolder::~EgressHolder() {
  if (proxy_) proxy_->stop();
}

NetworkAccount EgressHolder::finish(std::string& removal) {
  proxy_->stop();
  auto account = proxy_->account();
  removal = remover_.remove();
  return account;
}

nlohmann::json EgressHolder::trust_mount() const {
  if (!trust_file_) return nullptr;
  return {{"Type", "bind"},
          {"Source", trust_file_->path()},
          {"Target", kInjectionTrustBundle},
          {"ReadOnly", true},
          {"BindOptions", {{"Propagation", "rprivate"}}}};
}

}  // namespace rlm::docker
