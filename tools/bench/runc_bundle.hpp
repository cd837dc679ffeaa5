// The runc baseline: an OCI bundle whose container has the default policy's isolation -- every
// namespace (user, with uid 1000 inside as the policy's), /usr read-only, /proc, /dev, a private
// /tmp tmpfs of the policy's size, a memory and a pids cgroup at the policy's limits, the policy's
// own seccomp rules (exported as `rlm-sandbox policy export --docker-seccomp default`, which runc
// reads as an OCI profile), no capabilities and no_new_privs -- run with `runc run`, so the cold
// path can be compared with a container runtime at equal isolation.
//
// The bundle and runc's state directory live in one private directory that the destructor removes;
// `runc run` in the foreground deletes its container when the payload exits, so one container id
// serves every sample.
#pragma once

#include <sys/stat.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <utility>
#include <vector>

namespace rlm::bench {

class RuncBundle {
 public:
  // Builds the bundle for `policy`'s seccomp rules; nullopt (with `why`) when it cannot.
  static std::optional<RuncBundle> make(const std::string& rlm_sandbox, const std::string& runc,
                                        std::string& why) {
    RuncBundle bundle;
    char dir[] = "/tmp/rlm-bench-runc.XXXXXX";
    if (!::mkdtemp(dir)) {
      why = "mkdtemp failed";
      return std::nullopt;
    }
    bundle.dir_ = dir;
    bundle.runc_ = runc;
    // The container's root (uid 100000 on the host) must traverse the bundle to its rootfs.
    ::chmod(dir, 0755);
    namespace fs = std::filesystem;
    const fs::path root = bundle.dir_ / "rootfs";
    for (const char* sub : {"usr", "proc", "dev", "tmp", "etc"}) fs::create_directories(root / sub);
    fs::create_directory_symlink("usr/lib", root / "lib");
    fs::create_directory_symlink("usr/lib64", root / "lib64");
    fs::create_directory_symlink("usr/bin", root / "bin");

    auto seccomp = exported_seccomp(rlm_sandbox);
    if (!seccomp) {
      why = "`rlm-sandbox policy export --docker-seccomp default` failed";
      return std::nullopt;
    }
    std::ofstream(bundle.dir_ / "config.json") << config(*seccomp).dump(1);
    return bundle;
  }

  RuncBundle(RuncBundle&& other) noexcept
      : dir_(std::move(other.dir_)), runc_(std::move(other.runc_)) {
    other.dir_.clear();
  }
  RuncBundle& operator=(RuncBundle&& other) noexcept {
    std::swap(dir_, other.dir_);
    std::swap(runc_, other.runc_);
    return *this;
  }
  ~RuncBundle() {
    std::error_code ec;
    if (!dir_.empty()) std::filesystem::remove_all(dir_, ec);
  }

  const std::filesystem::path& dir() const { return dir_; }

  // The command line that runs /bin/true in a new container of this bundle.
  std::vector<std::string> command() const {
    return {runc_,
            "--root",
            (dir_ / "state").string(),
            "run",
            "--bundle",
            dir_.string(),
            "rlm-bench-" + std::to_string(::getpid())};
  }

 private:
  RuncBundle() = default;

  static std::optional<nlohmann::json> exported_seccomp(const std::string& rlm_sandbox) {
    const std::string command = rlm_sandbox + " policy export --docker-seccomp default";
    FILE* out = ::popen(command.c_str(), "r");
    if (!out) return std::nullopt;
    std::string text;
    char buf[4096];
    for (size_t n; (n = std::fread(buf, 1, sizeof buf, out)) > 0;) text.append(buf, n);
    if (::pclose(out) != 0) return std::nullopt;
    auto profile = nlohmann::json::parse(text, nullptr, false);
    if (profile.is_discarded()) return std::nullopt;
    return profile;
  }

  static nlohmann::json config(const nlohmann::json& seccomp) {
    using nlohmann::json;
    const json no_capabilities = json::array();
    const json mapping = json::array({{{"containerID", 0}, {"hostID", 100000}, {"size", 65536}}});
    return {{"ociVersion", "1.0.2"},
            {"process",
             {{"terminal", false},
              {"user", {{"uid", 1000}, {"gid", 1000}}},
              {"args", {"/bin/true"}},
              {"env", {"PATH=/usr/local/bin:/usr/bin:/bin", "HOME=/tmp", "LANG=C.UTF-8"}},
              {"cwd", "/tmp"},
              {"capabilities",
               {{"bounding", no_capabilities},
                {"effective", no_capabilities},
                {"permitted", no_capabilities},
                {"inheritable", no_capabilities},
                {"ambient", no_capabilities}}},
              {"rlimits", {{{"type", "RLIMIT_NOFILE"}, {"hard", 256}, {"soft", 256}}}},
              {"noNewPrivileges", true}}},
            {"root", {{"path", "rootfs"}, {"readonly", true}}},
            {"hostname", "sandbox"},
            {"mounts",
             {{{"destination", "/proc"}, {"type", "proc"}, {"source", "proc"}},
              {{"destination", "/dev"},
               {"type", "tmpfs"},
               {"source", "tmpfs"},
               {"options", {"nosuid", "strictatime", "mode=755", "size=65536k"}}},
              {{"destination", "/dev/pts"},
               {"type", "devpts"},
               {"source", "devpts"},
               {"options", {"nosuid", "noexec", "newinstance", "ptmxmode=0666", "mode=0620"}}},
              {{"destination", "/dev/shm"},
               {"type", "tmpfs"},
               {"source", "shm"},
               {"options", {"nosuid", "noexec", "nodev", "mode=1777", "size=65536k"}}},
              {{"destination", "/usr"},
               {"type", "bind"},
               {"source", "/usr"},
               {"options", {"rbind", "ro", "nosuid", "nodev"}}},
              {{"destination", "/tmp"},
               {"type", "tmpfs"},
               {"source", "tmpfs"},
               {"options", {"nosuid", "nodev", "mode=1777", "size=67108864"}}}}},
            {"linux",
             {{"namespaces",
               {{{"type", "pid"}},
                {{"type", "network"}},
                {{"type", "ipc"}},
                {{"type", "uts"}},
                {{"type", "mount"}},
                {{"type", "cgroup"}},
                {{"type", "user"}}}},
              {"uidMappings", mapping},
              {"gidMappings", mapping},
              {"resources",
               {{"memory", {{"limit", 268435456}, {"swap", 268435456}}},
                {"pids", {{"limit", 64}}},
                {"devices", {{{"allow", false}, {"access", "rwm"}}}}}},
              {"seccomp", seccomp},
              {"maskedPaths",
               {"/proc/acpi", "/proc/asound", "/proc/kcore", "/proc/keys", "/proc/latency_stats",
                "/proc/timer_list", "/proc/timer_stats", "/proc/sched_debug", "/proc/scsi",
                "/sys/firmware"}},
              {"readonlyPaths",
               {"/proc/bus", "/proc/fs", "/proc/irq", "/proc/sys", "/proc/sysrq-trigger"}}}}};
  }

  std::filesystem::path dir_;
  std::string runc_;
};

}  // namespace rlm::bench
