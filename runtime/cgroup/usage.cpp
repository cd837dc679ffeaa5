#include "cgroup/usage.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>

#include "cgroup/files.hpp"
#include "cgroup/host.hpp"
#include "rlm_sys/self_readings.hpp"

namespace rlm::cgroup {
namespace {

// What open_counters() holds: the fds, closed when the last copy of the reader lets go.
struct OpenFiles : std::map<std::string, int> {
  ~OpenFiles() {
    for (const auto& [path, fd] : *this) ::close(fd);
  }
};

// A counter file's whole text from offset 0 (a cgroup file makes its text anew for each read
// that starts there); nullopt on an error.
std::optional<std::string> pread_all(int fd) {
  std::string out;
  char buffer[4096];
  for (;;) {
    const ssize_t n = ::pread(fd, buffer, sizeof buffer, static_cast<off_t>(out.size()));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::nullopt;
    if (n == 0) return out;
    out.append(buffer, static_cast<std::size_t>(n));
    // Counter files are short: a read that did not fill the buffer had everything.
    if (static_cast<std::size_t>(n) < sizeof buffer) return out;
  }
}

// The directory of `path` in the v1 hierarchy mounted at `mount_point`; "" when not reachable.
std::string v1_directory(const std::vector<CgroupMount>& mounts, const std::string& mount_point,
                         const std::string& path) {
  if (mount_point.empty()) return "";
  for (const auto& mount : mounts)
    if (mount.mount_point == mount_point) return cgroup_dir(mount, path);
  return "";
}

}  // namespace

UsageReader UsageReader::v2(std::string group) {
  UsageReader reader;
  reader.v2_ = true;
  reader.memory_ = reader.pids_ = reader.cpuacct_ = std::move(group);
  return reader;
}

UsageReader UsageReader::v1(std::string memory, std::string pids, std::string cpuacct) {
  UsageReader reader;
  reader.memory_ = std::move(memory);
  reader.pids_ = std::move(pids);
  reader.cpuacct_ = std::move(cpuacct);
  return reader;
}

std::optional<UsageReader> UsageReader::of_process(pid_t pid, std::string_view name) {
  if (pid <= 0 || name.empty()) return std::nullopt;
  const auto text = cgfs::read_file("/proc/" + std::to_string(pid) + "/cgroup");
  if (!text) return std::nullopt;
  const auto groups = parse_proc_cgroup(*text);
  const auto names_it = [&](const std::string& path) {
    return path.find(name) != std::string::npos;
  };
  const auto host = detect_host_cgroups();

  UsageReader reader;
  const auto memory = groups.v1.find("memory");
  const auto cpuacct = groups.v1.find("cpuacct");
  if (memory != groups.v1.end() && cpuacct != groups.v1.end() && !host.v1_memory.empty()) {
    if (!names_it(memory->second) || !names_it(cpuacct->second)) return std::nullopt;
    const auto mountinfo = sys::self_mountinfo();
    if (!mountinfo) return std::nullopt;
    const auto mounts = cgroup_mounts(*mountinfo);
    reader.memory_ = v1_directory(mounts, host.v1_memory, memory->second);
    reader.cpuacct_ = v1_directory(mounts, host.v1_cpuacct, cpuacct->second);
  } else if (groups.unified && host.v2) {
    if (!names_it(*groups.unified)) return std::nullopt;
    reader = v2(cgroup_dir(*host.v2, *groups.unified));
  }
  if (reader.memory_.empty() && reader.cpuacct_.empty()) return std::nullopt;
  return reader;
}

// A recycled group's counters as they stood when its current run began (begin_next_run): what
// the reader reports is counted from there.
struct UsageReader::RunBaseline {
  std::uint64_t oom_kills = 0, memory_max = 0, memory_oom = 0, pids_max = 0;
  std::chrono::microseconds cpu{0};
  int peak_fd = -1;  // memory.peak, open for writing: its peak counts from the reset through it
  ~RunBaseline() {
    if (peak_fd >= 0) ::close(peak_fd);
  }
};

CgroupUsage UsageReader::read() const {
  CgroupUsage usage;
  usage.peak_memory_bytes = peak_memory_bytes();
  if (v2_) {
    // One read for all three: oom_kill (processes killed), max and oom (the limit was reached).
    const auto events = text_of(memory_, "memory.events").value_or("");
    const RunBaseline none;
    const RunBaseline& base = baseline_ ? *baseline_ : none;
    usage.oom_kills = cgfs::key_value(events, "oom_kill").value_or(0) - base.oom_kills;
    usage.oom_killed = usage.oom_kills > 0;
    usage.memory_limit_hit = usage.oom_killed ||
                             cgfs::key_value(events, "max").value_or(0) > base.memory_max ||
                             cgfs::key_value(events, "oom").value_or(0) > base.memory_oom;
  } else {
    usage.oom_kills = oom_kills().value_or(0);
    usage.oom_killed = usage.oom_kills > 0;
    usage.memory_limit_hit = usage.oom_killed || number_in(memory_, "memory.failcnt").value_or(0) >
                                                     (baseline_ ? baseline_->memory_max : 0);
  }
  usage.pids_limit_hit =
      key_in(pids_, "pids.events", "max").value_or(0) > (baseline_ ? baseline_->pids_max : 0);
  usage.cpu = cpu_time();
  return usage;
}

std::optional<std::string> UsageReader::text_of(const std::string& dir, const char* file) const {
  if (dir.empty()) return std::nullopt;
  const std::string path = dir + "/" + file;
  if (open_) {
    if (const auto it = open_->find(path); it != open_->end()) return pread_all(it->second);
  }
  return cgfs::read_file(path);
}

std::optional<std::uint64_t> UsageReader::number_in(const std::string& dir,
                                                    const char* file) const {
  const auto text = text_of(dir, file);
  if (!text) return std::nullopt;
  return cgfs::parse_number(*text);
}

std::optional<std::uint64_t> UsageReader::key_in(const std::string& dir, const char* file,
                                                 const char* key) const {
  const auto text = text_of(dir, file);
  if (!text) return std::nullopt;
  return cgfs::key_value(*text, key);
}

void UsageReader::open_counters() {
  auto files = std::make_shared<OpenFiles>();
  const auto open_one = [&](const std::string& dir, const char* file) {
    if (dir.empty()) return;
    const std::string path = dir + "/" + file;
    const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
    if (fd >= 0 && !files->emplace(path, fd).second) ::close(fd);
  };
  if (v2_) {
    for (const char* file : {"memory.peak", "memory.events"}) open_one(memory_, file);
    open_one(pids_, "pids.events");
    open_one(cpuacct_, "cpu.stat");
  } else {
    for (const char* file : {"memory.max_usage_in_bytes", "memory.oom_control", "memory.failcnt"})
      open_one(memory_, file);
    open_one(pids_, "pids.events");
    open_one(cpuacct_, "cpuacct.usage");
  }
  open_ = std::move(files);
}

void UsageReader::close_counters() {
  open_.reset();
}

std::optional<std::uint64_t> UsageReader::oom_kills() const {
  const auto kills = key_in(memory_, v2_ ? "memory.events" : "memory.oom_control", "oom_kill");
  if (!kills || !baseline_) return kills;
  return *kills - baseline_->oom_kills;
}

std::optional<std::uint64_t> UsageReader::peak_memory_bytes() const {
  if (baseline_ && baseline_->peak_fd >= 0) {
    const auto text = pread_all(baseline_->peak_fd);
    if (!text) return std::nullopt;
    return cgfs::parse_number(*text);
  }
  return number_in(memory_, v2_ ? "memory.peak" : "memory.max_usage_in_bytes");
}

std::optional<std::chrono::microseconds> UsageReader::cpu_time() const {
  const auto total = total_cpu_time();
  if (!total || !baseline_) return total;
  return *total - baseline_->cpu;
}

std::optional<std::chrono::microseconds> UsageReader::total_cpu_time() const {
  if (v2_) {
    const auto usec = key_in(cpuacct_, "cpu.stat", "usage_usec");
    if (!usec) return std::nullopt;
    return std::chrono::microseconds(*usec);
  }
  const auto ns = number_in(cpuacct_, "cpuacct.usage");
  if (!ns) return std::nullopt;
  return std::chrono::microseconds(*ns / 1000);
}

bool UsageReader::begin_next_run() {
  auto base = std::make_shared<RunBaseline>();
  const auto cpu = total_cpu_time();
  const auto pids = text_of(pids_, "pids.events");
  if (!cpu || !pids) return false;
  base->cpu = *cpu;
  base->pids_max = cgfs::key_value(*pids, "max").value_or(0);
  if (v2_) {
    const auto events = text_of(memory_, "memory.events");
    if (!events) return false;
    base->oom_kills = cgfs::key_value(*events, "oom_kill").value_or(0);
    base->memory_max = cgfs::key_value(*events, "max").value_or(0);
    base->memory_oom = cgfs::key_value(*events, "oom").value_or(0);
    // memory.peak restarts at the group's present usage for reads through the fd that wrote to
    // it (6.12+); without that the last run's peak would be the next one's.
    const std::string peak = memory_ + "/memory.peak";
    base->peak_fd = ::open(peak.c_str(), O_RDWR | O_CLOEXEC);
    if (base->peak_fd < 0) return false;
    static constexpr char kReset[] = "reset\n";
    if (::write(base->peak_fd, kReset, sizeof kReset - 1) !=
        static_cast<ssize_t>(sizeof kReset - 1))
      return false;
  } else {
    const auto kills = key_in(memory_, "memory.oom_control", "oom_kill");
    const auto failures = number_in(memory_, "memory.failcnt");
    if (!kills || !failures) return false;
    base->oom_kills = *kills;
    base->memory_max = *failures;
    // v1 resets its peak to the present usage on any write.
    if (cgfs::write_file(memory_ + "/memory.max_usage_in_bytes", "0") != 0) return false;
  }
  baseline_ = std::move(base);
  return true;
}

LiveCounters UsageReader::live() const {
  LiveCounters counters;
  counters.oom_kills = oom_kills();
  counters.cpu = cpu_time();
  return counters;
}

}  // namespace rlm::cgroup
