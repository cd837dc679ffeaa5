#include "namespace/payload_filter.hpp"

#include <fcntl.h>
#include <sys/mman.h>
#include <unistd.h>

#include <cerrno>
#include <system_error>

#include "seccomp/seccomp.hpp"

namespace rlm::ns {
namespace {

// A memfd holding `program`, sealed so neither init nor anything else can change it afterwards.
// Close-on-exec here; the child clears that flag on the copy init inherits.
common::UniqueFd sealed_memfd(const seccomp::Program& program) {
  common::UniqueFd fd(memfd_create("rlm-sandbox-seccomp", MFD_CLOEXEC | MFD_ALLOW_SEALING));
  if (!fd) throw std::system_error(errno, std::generic_category(), "memfd_create");
  const auto* bytes = reinterpret_cast<const char*>(program.instructions.data());
  const std::size_t size = program.instructions.size() * sizeof(sock_filter);
  for (std::size_t done = 0; done < size;) {
    const ssize_t n = write(fd.get(), bytes + done, size - done);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) throw std::system_error(errno, std::generic_category(), "write (seccomp memfd)");
    done += static_cast<std::size_t>(n);
  }
  if (fcntl(fd.get(), F_ADD_SEALS, F_SEAL_SHRINK | F_SEAL_GROW | F_SEAL_WRITE | F_SEAL_SEAL) != 0)
    throw std::system_error(errno, std::generic_category(), "F_ADD_SEALS (seccomp memfd)");
  return fd;
}

// What the payload calls between installing the notify filter and running its own code; if the
// policy denied one of them, the payload would wait on a listener init does not have yet.
bool handover_allowed(const Seccomp& rules) {
  for (const char* name : {"sendmsg", "execve", "write", "exit_group"})
    if (!seccomp::allows_every_call(rules, name)) return false;
  return true;
}

bool kills(const std::string& action) {
  return action.starts_with("SCMP_ACT_KILL");
}

// Whether the policy has a kill action for the notify program to replace (the preamble has none).
bool has_kill_actions(const Seccomp& rules) {
  if (kills(rules.default_action)) return true;
  for (const auto& rule : rules.syscalls)
    if (kills(rule.action)) return true;
  return false;
}

}  // namespace

PayloadFilter prepare_payload_filter(const Seccomp& rules) {
  PayloadFilter filter;
  filter.kill = sealed_memfd(seccomp::compile(rules));
  if (!has_kill_actions(rules) || !handover_allowed(rules)) return filter;
  seccomp::Program notify;
  try {
    notify = seccomp::compile(rules, {.kill_as_notify = true});
  } catch (const Error&) {
    return filter;  // a libseccomp or kernel without SCMP_ACT_NOTIFY: kills stay anonymous
  }
  if (notify.notifies) filter.notify = sealed_memfd(notify);
  return filter;
}

}  // namespace rlm::ns
