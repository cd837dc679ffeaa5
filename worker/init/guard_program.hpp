// The signal guard's half in the kernel: the payload's seccomp program, rewritten so that every
// call the policy allows and that could signal another process (or change its limits) is held
// for init to decide (SECCOMP_RET_USER_NOTIF), instead of running at once. Init then lets it
// continue or fails it with EPERM (signal_guard.hpp). Used for sessions, where the processes the
// payload must not touch (its checkpoints) run as the same user inside the same sandbox.
//
// The rewrite works on the compiled program (init does not link libseccomp): every
// `return ALLOW` (and `return LOG`) becomes a jump to a tail that re-reads the syscall number and
// returns USER_NOTIF for the guarded calls -- or EPERM outright for the ones whose target init
// cannot read (pidfd_send_signal's fd, F_SETOWN_EX's struct, FIOSETOWN's pointer) -- and the
// original verdict for everything else. Every `return USER_NOTIF` the policy's kill actions
// compiled to becomes a jump to a tail that turns it into KILL_PROCESS for the guarded syscall
// numbers, so a notification for one of those always comes from the guard, never from a policy
// kill. Jumps in the original program keep their offsets: instructions are replaced one for one
// and the tails are appended.
#pragma once

#include <linux/filter.h>

#include <string>
#include <vector>

namespace rlm::init {

// Builds `guarded` from `program` (the policy's notify program, or its kill program). Returns ""
// or why it cannot (an instruction it does not expect, the size limit, an architecture the guard
// does not know).
std::string add_signal_guard(const std::vector<sock_filter>& program,
                             std::vector<sock_filter>& guarded);

// Whether a notification for this syscall number is one the guard asked for (kill, tkill,
// tgkill, rt_sigqueueinfo, rt_tgsigqueueinfo, prlimit64 on another process, fcntl F_SETOWN).
bool is_guarded_syscall(int syscall);

}  // namespace rlm::init
