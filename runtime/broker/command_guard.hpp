// The command: handler's shell runs under a guard process, so that nothing the command starts
// outlives the call or the host process (issue 11, line 8): not when the shell exits, not when
// the host gives up on the call, not when the host dies, SIGKILL included.
//
// host thread ──fork──> guard (PR_SET_PDEATHSIG, child subreaper, no fds)
//                         └──fork──> /bin/sh -c CMD (own process group) ──> what it starts
//
// The guard waits for the shell to exit, or for SIGTERM (from the host giving up, or as its
// parent-death signal), then kills the shell's process group and, as the subreaper its orphans
// are handed to, every process left below it (those that left the group with setsid too), until
// it has no child left. Then it exits with the shell's own status (the same exit code, or killed
// by the same signal), or by SIGKILL when it was told to stop.
#pragma once

#include <sys/types.h>

#include <string>

namespace rlm::broker {

// Starts the guard from the calling thread, which must live until the guard is reaped: the
// parent-death signal fires when the thread that forked exits. `input`, `output` and `errors` are
// the shell's stdin, stdout and stderr, all numbered 3 or more; nothing else crosses. Returns the
// guard's pid; throws std::system_error when it cannot fork.
pid_t spawn_guarded_shell(const std::string& command, int input, int output, int errors);

}  // namespace rlm::broker
