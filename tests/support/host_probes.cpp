#include "support/host_probes.hpp"

#include <dirent.h>
#include <fcntl.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>

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

std::vector<std::string> own_cgroup_dirs() {
  namespace fs = std::filesystem;
  const std::string prefix = std::to_string(getpid()) + "-";
  std::vector<std::string> found;
  std::error_code error;
  fs::recursive_directory_iterator it("/sys/fs/cgroup",
                                      fs::directory_options::skip_permission_denied, error);
  for (; !error && it != fs::recursive_directory_iterator(); it.increment(error)) {
    if (it.depth() > 4) {
      it.disable_recursion_pending();
      continue;
    }
    if (!it->is_directory(error) || it->is_symlink(error)) continue;
    if (it->path().filename().string().starts_with(prefix)) found.push_back(it->path().string());
  }
  return found;
}

std::string mountinfo() {
  std::ifstream in("/proc/self/mountinfo");
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

}  // namespace rlm::test
