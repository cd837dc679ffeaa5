// Starting the payload: init starts a child that shares init's memory until its exec (as
// posix_spawn does: CLONE_VM | CLONE_VFORK, on a stack of its own), which applies the limits and
// working directory, installs the filter and execs.
#pragma once

#include <sys/types.h>

#include <string>

#include "options.hpp"
#include "seccomp_filter.hpp"

namespace rlm::init {

// Why the payload never reached its own code; errno == 0 when it did.
struct StartFailure {
  int error = 0;     // errno
  std::string step;  // "exec", "chdir", "setrlimit", "seccomp", "guard"
  std::string path;  // argv[0], the directory, or the resource name
};

// The child's stack, mapped once with a guard page below it (an overflow faults instead of
// writing init's memory). Call it before the payload is awaited, to keep the mapping off a
// warm run's path; start_payload() maps it itself otherwise. False when it cannot be mapped.
bool prepare_payload_stack();

// Starts the payload. Returns its pid (or -1 with errno set when the clone failed). A failure
// between the clone and the exec is filled into `failure`; the child then exits and is reaped like
// any other. The child installs `filters` last; `listener` receives the notify listener it sent (-1
// when none). Returns only once the child has exec'd or failed, so `failure` is final.
pid_t start_payload(const Options& options, const Filters& filters, StartFailure& failure,
                    int& listener);

}  // namespace rlm::init
