#include "cgroup/files.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <charconv>
#include <thread>

#include "host/unique_fd.hpp"

namespace rlm::cgroup::cgfs {
namespace {

using host::UniqueFd;
using Clock = std::chrono::steady_clock;

// True when a /proc/<pid>/cgroup line's path names the group or one of its descendants.
bool line_in_group(std::string_view line, std::string_view suffix) {
  auto colon = line.find(':');
  if (colon == std::string_view::npos) return false;
  colon = line.find(':', colon + 1);
  if (colon == std::string_view::npos) return false;
  std::string_view path = line.substr(colon + 1);
  for (auto at = path.find(suffix); at != std::string_view::npos; at = path.find(suffix, at + 1)) {
    auto after = at + suffix.size();
    if (after == path.size() || path[after] == '/') return true;
  }
  return false;
}

bool still_member(pid_t pid, std::string_view suffix) {
  auto text = read_file("/proc/" + std::to_string(pid) + "/cgroup");
  if (!text) return false;
  std::string_view rest = *text;
  while (!rest.empty()) {
    auto nl = rest.find('\n');
    if (line_in_group(rest.substr(0, nl), suffix)) return true;
    if (nl == std::string_view::npos) break;
    rest.remove_prefix(nl + 1);
  }
  return false;
}

// Pins `pid`, checks it still belongs to the group, SIGKILLs it. True when signalled.
bool kill_member(pid_t pid, std::string_view suffix) {
  UniqueFd pidfd(static_cast<int>(::syscall(SYS_pidfd_open, pid, 0)));
  if (!pidfd) {
    if (errno != ENOSYS) return false;  // ESRCH: already gone
    // Kernels before 5.3: no pinning; the window is a few microseconds.
    return still_member(pid, suffix) && ::kill(pid, SIGKILL) == 0;
  }
  if (!still_member(pid, suffix)) return false;
  return ::syscall(SYS_pidfd_send_signal, pidfd.get(), SIGKILL, nullptr, 0) == 0;
}

std::vector<std::string> child_dirs(const std::string& dir) {
  std::vector<std::string> out;
  DIR* d = ::opendir(dir.c_str());
  if (d == nullptr) return out;
  while (dirent* e = ::readdir(d)) {
    if (e->d_type != DT_DIR) continue;
    std::string_view name = e->d_name;
    if (name == "." || name == "..") continue;
    out.emplace_back(dir + "/" + e->d_name);
  }
  ::closedir(d);
  return out;
}

void pause_briefly(int round) {
  // 1 ms, doubling up to 20 ms: quick for the usual case, cheap while a slow exit drags on.
  std::this_thread::sleep_for(std::chrono::milliseconds(std::min(20, 1 << std::min(round, 5))));
}

}  // namespace

std::optional<std::string> read_file(const std::string& path) {
  UniqueFd fd(::open(path.c_str(), O_RDONLY | O_CLOEXEC));
  if (!fd) return std::nullopt;
  std::string out;
  char buf[4096];
  for (;;) {
    ssize_t n = ::read(fd.get(), buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return std::nullopt;
    if (n == 0) break;
    out.append(buf, static_cast<std::size_t>(n));
  }
  return out;
}

int write_file(const std::string& path, std::string_view value) {
  UniqueFd fd(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (!fd) return errno;
  for (;;) {
    ssize_t n = ::write(fd.get(), value.data(), value.size());
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) return errno;
    return static_cast<std::size_t>(n) == value.size() ? 0 : EIO;
  }
}

bool exists(const std::string& path) {
  return ::access(path.c_str(), F_OK) == 0;
}

std::optional<std::uint64_t> read_key(const std::string& path, std::string_view key) {
  auto text = read_file(path);
  if (!text) return std::nullopt;
  return key_value(*text, key);
}

std::optional<std::uint64_t> parse_number(std::string_view text) {
  while (!text.empty() && (text.back() == '\n' || text.back() == ' ')) text.remove_suffix(1);
  std::uint64_t value = 0;
  auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc{} || end != text.data() + text.size()) return std::nullopt;
  return value;
}

std::optional<std::uint64_t> key_value(std::string_view text, std::string_view key) {
  std::string_view rest = text;
  while (!rest.empty()) {
    auto nl = rest.find('\n');
    std::string_view line = rest.substr(0, nl);
    if (line.size() > key.size() && line.substr(0, key.size()) == key && line[key.size()] == ' ') {
      return parse_number(line.substr(key.size() + 1));
    }
    if (nl == std::string_view::npos) break;
    rest.remove_prefix(nl + 1);
  }
  return std::nullopt;
}

std::optional<std::uint64_t> read_number(const std::string& path) {
  auto text = read_file(path);
  if (!text) return std::nullopt;
  return parse_number(*text);
}

std::vector<std::string> read_words(const std::string& path) {
  std::vector<std::string> out;
  auto text = read_file(path);
  if (!text) return out;
  std::size_t i = 0;
  while (i < text->size()) {
    while (i < text->size() && std::isspace(static_cast<unsigned char>((*text)[i]))) ++i;
    std::size_t start = i;
    while (i < text->size() && !std::isspace(static_cast<unsigned char>((*text)[i]))) ++i;
    if (i > start) out.push_back(text->substr(start, i - start));
  }
  return out;
}

bool contains(const std::vector<std::string>& words, std::string_view word) {
  for (const auto& w : words)
    if (w == word) return true;
  return false;
}

std::vector<pid_t> members(const std::string& group) {
  std::vector<pid_t> out;
  for (const auto& word : read_words(group + "/cgroup.procs")) {
    if (auto v = parse_number(word); v && *v > 0) out.push_back(static_cast<pid_t>(*v));
  }
  return out;
}

int kill_members_once(const std::vector<std::string>& groups, std::string_view group_suffix) {
  int signalled = 0;
  for (const auto& group : groups)
    for (pid_t pid : members(group))
      if (kill_member(pid, group_suffix)) ++signalled;
  return signalled;
}

bool kill_until_empty(const std::vector<std::string>& groups, std::string_view group_suffix,
                      std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (int round = 0;; ++round) {
    // A group found empty stays empty: only a member's fork or the host can put a process in it.
    // So a first read that finds nobody ends it (the common case: init took everything along).
    bool empty = true;
    for (const auto& group : groups)
      for (pid_t pid : members(group)) {
        empty = false;
        kill_member(pid, group_suffix);
      }
    if (empty) return true;
    empty = true;
    for (const auto& group : groups) empty = empty && members(group).empty();
    if (empty) return true;
    if (Clock::now() >= deadline) return false;
    pause_briefly(round);
  }
}

bool remove_group(const std::string& group, std::string_view group_suffix,
                  std::chrono::milliseconds timeout) {
  const auto deadline = Clock::now() + timeout;
  for (int round = 0;; ++round) {
    // Most groups are empty and childless by now: the removal is tried before any listing.
    if (::rmdir(group.c_str()) == 0 || errno == ENOENT) return true;
    if (errno != EBUSY && errno != ENOTEMPTY) return false;
    // Descendants first (a payload could only have made them with delegated access, but a
    // leftover child must not make the whole group unremovable).
    for (const auto& child : child_dirs(group)) {
      auto left = deadline - Clock::now();
      if (left < std::chrono::milliseconds(0)) left = std::chrono::milliseconds(0);
      remove_group(child, group_suffix,
                   std::chrono::duration_cast<std::chrono::milliseconds>(left));
    }
    if (::rmdir(group.c_str()) == 0 || errno == ENOENT) return true;
    if (errno != EBUSY && errno != ENOTEMPTY) return false;
    kill_members_once({group}, group_suffix);
    if (Clock::now() >= deadline) return false;
    pause_briefly(round);
  }
}

int make_dir(const std::string& path) {
  if (::mkdir(path.c_str(), 0755) == 0 || errno == EEXIST) return 0;
  return errno;
}

}  // namespace rlm::cgroup::cgfs
