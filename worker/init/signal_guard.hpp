// The signal guard's half in init: decides each call guard_program.hpp holds. The rule: a process
// may signal (or set the limits of, or route SIGIO to) itself, and any process started after it;
// never one started before it. In a session that protects everything the state lives in from the
// cell that runs in the newest process: its checkpoint (its parent), older snapshots, the worker's
// root and init are all older than it, while everything the cell starts -- and everything the
// checkpoint must kill on a rollback, the standby and the cell's reparented orphans -- is younger
// than the checkpoint. A broadcast or process-group signal is allowed only when every process it
// would reach is.
//
// "Started after" is exact where pidfds are pidfs inodes (Linux 6.9+: their inode numbers are
// handed out in the order the pids were allocated, never reused); elsewhere it is the start time
// in clock ticks, and the pid within a tick (pids only go down after a wrap, which takes tens of
// thousands of forks, never within one 10 ms tick).
//
// Races: the caller is held in the kernel, and its notification is checked to be still valid
// after init has read who it is (so its tid was not recycled). A target is pinned with a pidfd
// before its age is read. A pid the kernel resolves differently when the call continues can only
// belong to a process created after the decision -- younger than the caller, so allowed anyway.
// A process group is read from /proc: a process older than the caller could join the group
// between that read and the delivery only by moving itself, which the session's checkpoints never
// do.
#pragma once

#include <sys/types.h>

#include "seccomp_filter.hpp"

namespace rlm::init {

class SignalGuard {
 public:
  SignalGuard();

  // Whether the held call `call` (a guarded syscall, guard_program.hpp) may continue. Reads /proc
  // and opens pidfds; never blocks on the caller.
  bool allows(const NotifyListener::Caught& call) const;

 private:
  bool pidfs_;  // pidfds are pidfs inodes whose numbers give the creation order
};

}  // namespace rlm::init
