// /proc/self/mountinfo and /proc/self/cgroup, read once per step of the runtime.
//
// Several modules consult them within one step -- a backend's selection, a sandbox's preparation:
// the cgroup hierarchies (twice), the host mounts under the root filesystem's binds, the setup
// signals, container detection -- and each reading of mountinfo costs the kernel ~35 us (the text
// is generated from the mount tree on every read). A SelfReadingScope on the stack makes those
// reads on its thread share one reading, taken when first asked for; outside a scope every call
// reads afresh. Nothing outlives the scope: no fd is kept (an embedding host may close fds it does
// not know), and the next step sees the tables as they are then.
#pragma once

#include <optional>
#include <string>

namespace rlm::sys {

class SelfReadingScope {
 public:
  // An inner scope on a thread that has one already is inert: the outer's readings serve both.
  SelfReadingScope() noexcept;
  ~SelfReadingScope();
  SelfReadingScope(const SelfReadingScope&) = delete;
  SelfReadingScope& operator=(const SelfReadingScope&) = delete;

 private:
  friend struct SelfReadings;  // self_readings.cpp: the reads
  bool active_ = false;
  std::optional<std::string> mountinfo_, cgroup_;
};

// The text of /proc/self/mountinfo (/proc/self/cgroup): the current scope's reading on this
// thread, or a fresh one. nullopt, with errno set, when the file cannot be read (no /proc); a
// failed read is not kept. At most 16 MiB (a mount table far larger than any real host's).
std::optional<std::string> self_mountinfo();
std::optional<std::string> self_cgroup();

}  // namespace rlm::sys
