#include "cgroup/run_id.hpp"

#include <sys/stat.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <charconv>
#include <mutex>

#include "cgroup/files.hpp"

namespace rlm::cgroup {
namespace {

std::atomic<std::uint64_t> counter{0};

bool parse_field(std::string_view& rest, std::uint64_t& out, bool last) {
  auto dash = rest.find('-');
  if (last != (dash == std::string_view::npos)) return false;
  std::string_view field = rest.substr(0, dash);
  // Canonical decimal only: no sign, no leading zeros (so a name has exactly one spelling).
  if (field.empty() || (field.size() > 1 && field[0] == '0')) return false;
  auto [end, ec] = std::from_chars(field.data(), field.data() + field.size(), out);
  if (ec != std::errc{} || end != field.data() + field.size()) return false;
  rest.remove_prefix(last ? rest.size() : dash + 1);
  return true;
}

}  // namespace

std::string RunId::to_string() const {
  return std::to_string(pid) + "-" + std::to_string(start_time) + "-" + std::to_string(pid_ns) +
         "-" + std::to_string(counter);
}

std::optional<std::uint64_t> process_start_time(pid_t pid) {
  auto stat = cgfs::read_file("/proc/" + std::to_string(pid) + "/stat");
  if (!stat) return std::nullopt;
  // comm (field 2) may hold spaces and parentheses: fields after it start past the last ')'.
  auto close = stat->rfind(')');
  errno = EINVAL;  // for every parse failure below: "unreadable", not "gone"
  if (close == std::string::npos) return std::nullopt;
  std::string_view rest = std::string_view(*stat).substr(close + 1);
  // After ')' come fields 3, 4, ...; field 22 is the 20th of them.
  for (int field = 3; field < 22; ++field) {
    auto start = rest.find_first_not_of(' ');
    if (start == std::string_view::npos) return std::nullopt;
    auto end = rest.find(' ', start);
    if (end == std::string_view::npos) return std::nullopt;
    rest.remove_prefix(end);
  }
  auto start = rest.find_first_not_of(' ');
  if (start == std::string_view::npos) return std::nullopt;
  rest.remove_prefix(start);
  std::uint64_t value = 0;
  auto [end, ec] = std::from_chars(rest.data(), rest.data() + rest.size(), value);
  if (ec != std::errc{}) return std::nullopt;
  return value;
}

std::uint64_t own_pid_ns() {
  struct stat st {};
  if (::stat("/proc/self/ns/pid", &st) != 0) return 0;
  return st.st_ino;
}

RunId next_run_id() {
  // Cached per pid: a forked child must name itself, not the parent it was copied from (its
  // groups would look orphaned to every collector).
  static std::mutex mu;
  static RunId self;
  RunId id;
  {
    std::lock_guard lock(mu);
    if (self.pid != ::getpid()) {
      self.pid = ::getpid();
      self.start_time = process_start_time(self.pid).value_or(0);
      self.pid_ns = own_pid_ns();
    }
    id = self;
  }
  id.counter = ++counter;
  return id;
}

std::optional<RunId> parse_run_id(std::string_view name) {
  RunId id;
  std::uint64_t pid = 0;
  std::string_view rest = name;
  if (!parse_field(rest, pid, false) || !parse_field(rest, id.start_time, false) ||
      !parse_field(rest, id.pid_ns, false) || !parse_field(rest, id.counter, true)) {
    return std::nullopt;
  }
  if (pid == 0 || pid > 0x7fffffff) return std::nullopt;
  id.pid = static_cast<pid_t>(pid);
  return id;
}

Owner owner_state(const RunId& id) {
  const std::uint64_t ns = own_pid_ns();
  if (ns == 0 || id.pid_ns != ns) return Owner::unknown;
  auto start = process_start_time(id.pid);
  if (!start) {
    // Gone, unless /proc refused us (hidepid): then we cannot judge.
    return errno == ENOENT || errno == ESRCH ? Owner::dead : Owner::unknown;
  }
  return *start == id.start_time ? Owner::alive : Owner::dead;
}

}  // namespace rlm::cgroup
