// What a cgroup counted for the processes in it -- peak memory, OOM kills, the memory and pids
// limits reached, CPU time -- read from its control files. The one reader of those counters for
// every backend: the namespace backend's run groups (RunCgroup::usage()) and the docker backend's
// containers, whose cgroup is found from the container's PID 1 (UsageReader::of_process). Docker's
// stats endpoint would say the same but answers once a second at best; these files answer in
// microseconds. Reads only; a group that is gone (or a file the kernel lacks) answers nothing.
#pragma once

#include <sys/types.h>

#include <chrono>
#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <string_view>

#include "rlm_sandbox/request.hpp"

namespace rlm::cgroup {

// What the run consumed and which cgroup limit stopped it, read after the payload is gone.
struct CgroupUsage {
  std::optional<std::uint64_t> peak_memory_bytes;  // memory.peak / memory.max_usage_in_bytes
  std::optional<std::chrono::microseconds> cpu;    // cpu.stat usage_usec / cpuacct.usage
  bool oom_killed = false;        // memory.events oom_kill / memory.oom_control oom_kill
  std::uint64_t oom_kills = 0;    // how many
  bool memory_limit_hit = false;  // the limit was reached at all (failcnt / events max)
  bool pids_limit_hit = false;    // pids.events max
};

class UsageReader {
 public:
  // v2: the group's one directory.
  static UsageReader v2(std::string group);
  // v1: the group in each hierarchy ("" where there is none: its counters are not available).
  static UsageReader v1(std::string memory, std::string pids, std::string cpuacct);
  // The cgroup `pid` is in, as this process sees the hierarchies, trusted only when its path names
  // `name` (a container's id: a daemon in another PID namespace reports pids that mean something
  // else here). v1 reads its memory and cpuacct groups. nullopt when it cannot be found from here.
  static std::optional<UsageReader> of_process(pid_t pid, std::string_view name);

  // Every counter (a few file reads).
  CgroupUsage read() const;
  // One counter each, in one read: the OOM kills (v2 memory.events oom_kill, v1
  // memory.oom_control oom_kill), the peak memory (memory.peak, 5.19+; v1
  // memory.max_usage_in_bytes), the CPU time of every process in the group (cpu.stat usage_usec,
  // there without the cpu controller; v1 cpuacct.usage). nullopt where the file or key is missing.
  std::optional<std::uint64_t> oom_kills() const;
  std::optional<std::uint64_t> peak_memory_bytes() const;
  std::optional<std::chrono::microseconds> cpu_time() const;
  // A recycled group's next run (docs/pools-and-server.md#recycled-sandboxes): from now on every
  // counter above is the run's own -- the CPU time, OOM kills and limit events since this call,
  // and the peak memory reset (v2: memory.peak, 6.12+; v1: memory.max_usage_in_bytes) -- not the
  // group's since its creation. False (the reader unchanged) where a counter cannot be read or the
  // peak cannot be reset.
  bool begin_next_run();

  // oom_kills() and cpu_time(), as Request::on_started's probe hands them out.
  LiveCounters live() const;

  // Opens the counter files now (a group built ahead of its run), so that read() at the run's end
  // costs one pread a file instead of an open, two reads and a close. A file that does not open is
  // read by its path as before. close_counters() drops them (before the group is removed).
  void open_counters();
  void close_counters();

 private:
  UsageReader() = default;
  struct RunBaseline;
  std::optional<std::chrono::microseconds> total_cpu_time() const;
  std::optional<std::string> text_of(const std::string& dir, const char* file) const;
  std::optional<std::uint64_t> number_in(const std::string& dir, const char* file) const;
  std::optional<std::uint64_t> key_in(const std::string& dir, const char* file,
                                      const char* key) const;
  // path -> an fd open for reading (open_counters()); shared by copies of this reader.
  std::shared_ptr<const std::map<std::string, int>> open_;
  std::shared_ptr<const RunBaseline> baseline_;  // begin_next_run()
  bool v2_ = false;
  std::string memory_;   // v2: the group; v1: its memory group
  std::string pids_;     // v2: the group; v1: its pids group
  std::string cpuacct_;  // v2: the group; v1: its cpuacct group
};

}  // namespace rlm::cgroup
