// One reader of /proc/<pid>/stat for init: the process-tree walk and the signal guard both need
// a process's state, parent, group, session and start time.
#pragma once

#include <sys/types.h>

namespace rlm::init {

struct ProcStat {
  char state = '?';  // 'Z' for a zombie, 'X' for a dead one
  pid_t parent = 0;
  pid_t pgrp = 0;
  pid_t session = 0;
  unsigned long long start = 0;  // start time after boot, in clock ticks
};

// False when the process is gone or its line cannot be parsed. comm may itself hold ") ", so the
// fields are taken after the last ')'.
bool read_proc_stat(pid_t pid, ProcStat& stat);

}  // namespace rlm::init
