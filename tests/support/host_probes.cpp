#include "support/host_probes.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <sched.h>
#include <sys/mount.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "rlm_sys/sys.hpp"

namespace rlm::test {
namespace {

// Calls visit(pid, "<pid>") for every process in /proc.
template <typename Visit>
void for_each_process(Visit visit) {
  DIR* dir = opendir("/proc");
  while (const dirent* entry = readdir(dir)) {
    char* end = nullptr;
    const long pid = std::strtol(entry->d_name, &end, 10);
    if (pid <= 0 || *end) continue;
    visit(static_cast<pid_t>(pid), std::string(entry->d_name));
  }
  closedir(dir);
}

// All of /proc/<pid>/<file>, "" for a process that is gone. Plain read(2): a process exiting
// mid-read fails with ESRCH, which libstdc++'s filebuf turns into an exception; here it is just a
// process that no longer matches.
std::string read_proc_file(const std::string& pid, const char* file) {
  std::string text;
  const int fd = open(("/proc/" + pid + "/" + file).c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return text;
  char buffer[4096];
  ssize_t count;
  while ((count = read(fd, buffer, sizeof buffer)) > 0)
    text.append(buffer, static_cast<std::size_t>(count));
  close(fd);
  return text;
}

// Pids of processes whose /proc/<pid>/<file> (NUL-separated strings) contains `needle`, with the
// NULs read as spaces.
std::vector<pid_t> processes_whose(const char* file, const std::string& needle) {
  std::vector<pid_t> found;
  for_each_process([&](pid_t pid, const std::string& name) {
    std::string text = read_proc_file(name, file);
    for (auto& c : text)
      if (c == '\0') c = ' ';
    if (text.find(needle) != std::string::npos) found.push_back(pid);
  });
  return found;
}

}  // namespace

std::size_t open_fd_count() {
  std::size_t count = 0;
  DIR* dir = opendir("/proc/self/fd");
  while (const dirent* entry = readdir(dir))
    if (entry->d_name[0] != '.') ++count;
  closedir(dir);
  return count - 1;  // the directory stream's own fd
}

std::vector<pid_t> children_of_this_process() {
  std::vector<pid_t> children;
  for_each_process([&](pid_t pid, const std::string& name) {
    std::ifstream stat("/proc/" + name + "/stat");
    std::string line;
    if (!std::getline(stat, line)) return;
    // The parent is the second field after the command, which is in parentheses and may hold
    // anything.
    const auto paren = line.rfind(')');
    if (paren == std::string::npos || paren + 4 > line.size()) return;
    if (std::atol(line.c_str() + paren + 4) == getpid()) children.push_back(pid);
  });
  return children;
}

std::vector<pid_t> processes_with_cmdline(const std::string& needle) {
  return processes_whose("cmdline", needle);
}

std::vector<pid_t> processes_with_environment(const std::string& needle) {
  return processes_whose("environ", needle);
}

std::vector<std::string> directories_below(const std::string& root, int max_depth) {
  std::vector<std::string> found;
  if (max_depth < 1) return found;
  DIR* dir = opendir(root.c_str());
  if (!dir) return found;  // gone, or not a directory
  std::vector<std::string> here;
  while (const dirent* entry = readdir(dir)) {
    const std::string name = entry->d_name;
    if (name == "." || name == "..") continue;
    struct stat info {};
    const std::string path = root + "/" + name;
    if (lstat(path.c_str(), &info) == 0 && S_ISDIR(info.st_mode)) here.push_back(path);
  }
  closedir(dir);
  for (const auto& path : here) {
    found.push_back(path);
    for (auto& below : directories_below(path, max_depth - 1)) found.push_back(std::move(below));
  }
  return found;
}

std::vector<std::string> own_cgroup_dirs() {
  const std::string prefix = std::to_string(getpid()) + "-";
  std::vector<std::string> found;
  for (auto& dir : directories_below("/sys/fs/cgroup", 5))
    if (std::filesystem::path(dir).filename().string().starts_with(prefix))
      found.push_back(std::move(dir));
  return found;
}

std::string mountinfo() {
  std::ifstream in("/proc/self/mountinfo");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

bool isolate_mount_table() {
  static const bool isolated = [] {
    std::size_t threads = 0;
    for (const auto& entry : std::filesystem::directory_iterator("/proc/self/task")) {
      (void)entry;
      ++threads;
    }
    if (threads != 1 || unshare(CLONE_NEWNS) != 0) return false;
    // The copy's mounts are still peers of the machine's: cut them off, then make them shared
    // among this namespace and those cloned from it only.
    return mount(nullptr, "/", nullptr, MS_REC | MS_PRIVATE, nullptr) == 0 &&
           mount(nullptr, "/", nullptr, MS_REC | MS_SHARED, nullptr) == 0;
  }();
  return isolated;
}

std::set<std::string> mount_table() {
  std::set<std::string> lines;
  std::istringstream in(mountinfo());
  for (std::string line; std::getline(in, line);) lines.insert(line);
  return lines;
}

std::set<std::string> mount_table_since(const std::set<std::string>& before) {
  std::set<std::string> lines = mount_table();
  for (const auto& line : before) {
    if (lines.count(line)) continue;
    const auto parsed = sys::parse_mountinfo(line);
    struct stat info {};
    if (parsed.size() == 1 && lstat(parsed.front().mount_point.c_str(), &info) != 0)
      lines.insert(line);  // detached with its mount point, by whoever removed that
  }
  return lines;
}

}  // namespace rlm::test
