#include "proc_stat.hpp"

#include <fcntl.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace rlm::init {

// "pid (comm) state ppid pgrp session tty tpgid flags minflt cminflt majflt cmajflt utime stime
// cutime cstime priority nice threads itrealvalue starttime ..."
bool read_proc_stat(pid_t pid, ProcStat& stat) {
  char path[32];
  std::snprintf(path, sizeof path, "/proc/%d/stat", pid);
  const int fd = open(path, O_RDONLY | O_CLOEXEC);
  if (fd < 0) return false;
  char buffer[1024];
  const ssize_t length = read(fd, buffer, sizeof buffer - 1);
  close(fd);
  if (length <= 0) return false;
  buffer[length] = '\0';
  const char* cursor = std::strrchr(buffer, ')');
  if (!cursor || cursor[1] != ' ' || cursor[2] == '\0') return false;
  stat.state = cursor[2];
  cursor += 3;
  unsigned long long fields[18] = {};  // ppid .. starttime
  for (auto& field : fields) {
    char* end = nullptr;
    field = std::strtoull(cursor, &end, 10);
    if (end == cursor) return false;
    cursor = end;
  }
  stat.parent = static_cast<pid_t>(fields[0]);
  stat.pgrp = static_cast<pid_t>(fields[1]);
  stat.session = static_cast<pid_t>(fields[2]);
  stat.start = fields[17];
  return true;
}

}  // namespace rlm::init
