#include "guard_program.hpp"

#include <fcntl.h>
#include <linux/audit.h>
#include <linux/seccomp.h>
#include <linux/sockios.h>
#include <sys/syscall.h>

#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdint>

namespace rlm::init {
namespace {

#if defined(__x86_64__)
constexpr std::uint32_t kNativeArch = AUDIT_ARCH_X86_64;
constexpr bool kHasX32 = true;  // x32 calls share the arch value, with this bit in the number
#elif defined(__aarch64__)
constexpr std::uint32_t kNativeArch = AUDIT_ARCH_AARCH64;
constexpr bool kHasX32 = false;
#else
constexpr std::uint32_t kNativeArch = 0;
constexpr bool kHasX32 = false;
#endif
constexpr std::uint32_t kX32Bit = 0x40000000u;

// Held for init: a signal to a pid, a process group or everyone, or the limits of another process.
constexpr int kNotified[] = {
    SYS_kill,      SYS_tkill, SYS_tgkill, SYS_rt_sigqueueinfo, SYS_rt_tgsigqueueinfo,
    SYS_prlimit64, SYS_fcntl};

constexpr std::uint32_t kNrOffset = offsetof(seccomp_data, nr);
constexpr std::uint32_t kArchOffset = offsetof(seccomp_data, arch);
// The low and high 32 bits of argument `index` (both architectures are little-endian).
constexpr std::uint32_t low_half(int index) {
  return static_cast<std::uint32_t>(offsetof(seccomp_data, args) + 8 * index);
}
constexpr std::uint32_t high_half(int index) {
  return low_half(index) + 4;
}

// A little assembler for forward jumps to labels.
class Tail {
 public:
  int label() {
    positions_.push_back(SIZE_MAX);
    return static_cast<int>(positions_.size() - 1);
  }
  void bind(int label) { positions_[static_cast<std::size_t>(label)] = code_.size(); }
  void load(std::uint32_t offset) { code_.push_back(BPF_STMT(BPF_LD | BPF_W | BPF_ABS, offset)); }
  void ret(std::uint32_t value) { code_.push_back(BPF_STMT(BPF_RET | BPF_K, value)); }
  void jump_if_equal(std::uint32_t value, int label) { jump(BPF_JEQ, value, label, true); }
  void jump_unless_equal(std::uint32_t value, int label) { jump(BPF_JEQ, value, label, false); }
  void jump_if_any_bit(std::uint32_t bits, int label) { jump(BPF_JSET, bits, label, true); }

  // The finished code, or empty when a jump does not fit in 8 bits (it always does here).
  std::vector<sock_filter> finish() {
    for (const auto& fixup : fixups_) {
      const std::size_t target = positions_[static_cast<std::size_t>(fixup.label)];
      if (target == SIZE_MAX || target <= fixup.at || target - fixup.at - 1 > UCHAR_MAX) return {};
      const auto offset = static_cast<unsigned char>(target - fixup.at - 1);
      (fixup.when_true ? code_[fixup.at].jt : code_[fixup.at].jf) = offset;
    }
    return code_;
  }

 private:
  void jump(std::uint16_t op, std::uint32_t value, int label, bool when_true) {
    fixups_.push_back({code_.size(), label, when_true});
    code_.push_back(BPF_JUMP(BPF_JMP | op | BPF_K, value, 0, 0));
  }
  struct Fixup {
    std::size_t at;
    int label;
    bool when_true;
  };
  std::vector<sock_filter> code_;
  std::vector<std::size_t> positions_;
  std::vector<Fixup> fixups_;
};

// Where the policy said ALLOW (or LOG): hold the guarded calls, refuse the unreadable ones,
// otherwise give the policy's verdict.
std::vector<sock_filter> allowed_tail(std::uint32_t otherwise) {
  Tail t;
  const int give = t.label(), notify = t.label(), refuse = t.label(), kill = t.label();
  const int prlimit = t.label(), fcntl = t.label(), ioctl = t.label();
  t.load(kArchOffset);
  t.jump_unless_equal(kNativeArch, give);
  t.load(kNrOffset);
  if (kHasX32) t.jump_if_any_bit(kX32Bit, kill);
  for (const int nr : {SYS_kill, SYS_tkill, SYS_tgkill, SYS_rt_sigqueueinfo, SYS_rt_tgsigqueueinfo})
    t.jump_if_equal(static_cast<std::uint32_t>(nr), notify);
  t.jump_if_equal(SYS_pidfd_send_signal, refuse);
  t.jump_if_equal(SYS_prlimit64, prlimit);
  t.jump_if_equal(SYS_fcntl, fcntl);
  t.jump_if_equal(SYS_ioctl, ioctl);
  t.ret(otherwise);
  // prlimit64(pid, resource, new, old): only pid != 0 with a new limit reaches another process.
  t.bind(prlimit);
  t.load(low_half(0));
  t.jump_if_equal(0, give);
  t.load(low_half(2));
  t.jump_unless_equal(0, notify);
  t.load(high_half(2));
  t.jump_if_equal(0, give);
  t.ret(SECCOMP_RET_USER_NOTIF);
  // fcntl(fd, cmd, arg): F_SETOWN names a pid or group in arg; F_SETOWN_EX hides it in memory.
  t.bind(fcntl);
  t.load(low_half(1));
  t.jump_if_equal(F_SETOWN, notify);
  t.jump_if_equal(F_SETOWN_EX, refuse);
  t.ret(otherwise);
  // ioctl(fd, request, int*): the socket owner, behind a pointer.
  t.bind(ioctl);
  t.load(low_half(1));
  t.jump_if_equal(FIOSETOWN, refuse);
  t.jump_if_equal(SIOCSPGRP, refuse);
  t.ret(otherwise);
  t.bind(give);
  t.ret(otherwise);
  t.bind(notify);
  t.ret(SECCOMP_RET_USER_NOTIF);
  t.bind(refuse);
  t.ret(SECCOMP_RET_ERRNO | EPERM);
  t.bind(kill);
  t.ret(SECCOMP_RET_KILL_PROCESS);
  return t.finish();
}

// Where a policy kill action was compiled to USER_NOTIF: for the guarded numbers the plain kill.
std::vector<sock_filter> policy_notify_tail() {
  Tail t;
  const int notify = t.label(), kill = t.label();
  t.load(kArchOffset);
  t.jump_unless_equal(kNativeArch, notify);
  t.load(kNrOffset);
  for (const int nr : kNotified) t.jump_if_equal(static_cast<std::uint32_t>(nr), kill);
  t.bind(notify);
  t.ret(SECCOMP_RET_USER_NOTIF);
  t.bind(kill);
  t.ret(SECCOMP_RET_KILL_PROCESS);
  return t.finish();
}

}  // namespace

bool is_guarded_syscall(int syscall) {
  for (const int nr : kNotified)
    if (syscall == nr) return true;
  return false;
}

std::string add_signal_guard(const std::vector<sock_filter>& program,
                             std::vector<sock_filter>& guarded) {
  if (kNativeArch == 0) return "the signal guard does not know this architecture";
  if (program.empty()) return "the signal guard needs the payload's seccomp program";
  const std::vector<std::pair<std::uint32_t, std::vector<sock_filter>>> tails = {
      {SECCOMP_RET_ALLOW, allowed_tail(SECCOMP_RET_ALLOW)},
      {SECCOMP_RET_LOG, allowed_tail(SECCOMP_RET_LOG)},
      {SECCOMP_RET_USER_NOTIF, policy_notify_tail()},
  };
  guarded = program;
  std::size_t end = program.size();
  std::vector<std::size_t> starts;
  for (const auto& [action, code] : tails) {
    if (code.empty()) return "the signal guard's program does not assemble";
    starts.push_back(end);
    end += code.size();
  }
  if (end > BPF_MAXINSNS)
    return "the payload's seccomp program is too large to add the signal guard (" +
           std::to_string(end) + " instructions)";
  for (std::size_t i = 0; i < guarded.size(); ++i) {
    sock_filter& insn = guarded[i];
    if (BPF_CLASS(insn.code) != BPF_RET) continue;
    if (BPF_RVAL(insn.code) != BPF_K)
      return "the payload's seccomp program returns a computed value; the signal guard cannot "
             "rewrite it";
    for (std::size_t t = 0; t < tails.size(); ++t) {
      if ((insn.k & SECCOMP_RET_ACTION_FULL) != tails[t].first) continue;
      insn = BPF_STMT(BPF_JMP | BPF_JA, static_cast<std::uint32_t>(starts[t] - i - 1));
      break;
    }
  }
  for (const auto& [action, code] : tails) guarded.insert(guarded.end(), code.begin(), code.end());
  return "";
}

}  // namespace rlm::init
