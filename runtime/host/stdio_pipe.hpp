// A payload may open its stdio by path: /dev/stdin, /dev/stdout and /dev/stderr are
// /proc/self/fd/0-2, and opening one opens the pipe anew, checked against the pipe's own mode.
// The kernel makes an anonymous pipe 0600 for the process that created it, so a payload under
// another uid (a root runtime's sandbox uid, a server's client's sandbox) was refused
// (`echo p | rlm-sandbox run -- cat /dev/stdin`: Permission denied), though reading fd 0 works.
//
// Such a pipe has no path but /proc/PID/fd/N of a process that holds it, and only that process's
// owner (or root) may follow that link: a mode open to all gives the pipe to no one who does not
// hold it already. So the runtime opens the mode of the pipes it hands a payload as its stdio.
#pragma once

namespace rlm::host {

// Makes the pipe behind `fd` 0666 when it is an anonymous pipe (pipefs) this process may change;
// anything else -- a named FIFO on disk, a file, a terminal, another user's pipe -- is left as it
// is. Best effort; never throws.
void open_pipe_to_its_holders(int fd) noexcept;

}  // namespace rlm::host
