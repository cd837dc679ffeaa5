// The payload's seccomp filter: read from the memfds the runtime compiled it into, installed by
// the payload child as its last step before exec, and -- in notify mode -- watched by init through
// the filter's listener, so a denied syscall is named in the report instead of showing up as an
// anonymous SIGSYS. Init does not link libseccomp: the programs arrive compiled.
#pragma once

#include <linux/filter.h>
#include <sys/types.h>

#include <cstdint>
#include <string>
#include <vector>

#include "options.hpp"

namespace rlm::init {

struct Filters {
  std::vector<sock_filter> kill;     // the policy as written: a denied call kills (SIGSYS)
  std::vector<sock_filter> notify;   // its kill actions as SECCOMP_RET_USER_NOTIF; may be empty
  std::vector<sock_filter> guarded;  // --guard-signals: one of them plus the signal guard
  bool empty() const { return kill.empty() && notify.empty() && guarded.empty(); }
};

// Reads and closes the memfds named by --seccomp-fd and --seccomp-notify-fd. Returns "" or what
// is wrong.
std::string load_filters(const Options& options, Filters& filters);

// In the payload child, after every other step (it sets no_new_privs). Installs the notify program
// with a listener and sends the listener to init over `socket` (SCM_RIGHTS), or -- without a
// notify program, or when the kernel refuses a listener (no user notification support, or a
// listener already set up by an outer sandbox) -- the kill program. With a guarded program, that
// one with a listener, and no fallback: a payload whose signals cannot be guarded does not run.
// The policy must allow what runs after it: sendmsg, then execve. Async-signal-safe. Returns 0 or
// an errno.
int install_in_child(const Filters& filters, int socket) noexcept;

// In init: the listener the child sent, or -1 when it sent none (it fell back to the kill
// program, or failed before). Blocks until the child sends, execs or exits.
int receive_listener(int socket);

// The listener end in init: takes notifications, answers them.
class NotifyListener {
 public:
  explicit NotifyListener(int fd);  // takes ownership; -1 for none
  ~NotifyListener();
  NotifyListener(const NotifyListener&) = delete;
  NotifyListener& operator=(const NotifyListener&) = delete;

  int fd() const { return fd_; }
  struct Caught {
    std::uint64_t id = 0;
    pid_t pid = 0;  // the calling thread, in init's PID namespace
    int syscall = -1;
    std::uint64_t args[6] = {};
  };
  // Takes one pending notification. False when there was none (it was withdrawn because the
  // caller died, or no process uses the filter any more).
  bool receive(Caught& caught);
  // Fails the held call with EPERM (a no-op when the caller has died in the meantime).
  void deny(const Caught& caught);
  // Lets the held call run as the caller made it (SECCOMP_USER_NOTIF_FLAG_CONTINUE). False when
  // the kernel refused (the caller died, or a kernel before 5.5): the call is then denied.
  bool allow(const Caught& caught);
  // Whether the notification is still pending: its caller has not died (and so its thread id,
  // read before, still names it).
  bool valid(const Caught& caught);
  void close();

 private:
  int fd_;
  std::vector<unsigned char> notification_, response_;
};

}  // namespace rlm::init
