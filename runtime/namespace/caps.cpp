// PrivilegePlan: what the sandbox may still do as far as capabilities go. Names are resolved
// with libcap in the parent; the child only calls prctl and capget/capset.
#include <linux/securebits.h>
#include <sys/capability.h>
#include <sys/prctl.h>
#include <sys/syscall.h>
#include <unistd.h>

#include <cctype>
#include <fstream>

#include "namespace/child_setup.hpp"
#include "rlm_sandbox/error.hpp"

namespace rlm::ns {

namespace {

// The highest capability number the running kernel knows; every one up to it is dropped from
// the bounding set unless kept (a newer kernel's extra capabilities included).
int read_last_cap() {
  std::ifstream in("/proc/sys/kernel/cap_last_cap");
  int last = -1;
  if (!(in >> last) || last < 0 || last > 63)
    throw Error("cannot read /proc/sys/kernel/cap_last_cap (is /proc mounted?)");
  return last;
}

}  // namespace

PrivilegePlan PrivilegePlan::prepare(const Policy& policy) {
  const int last_cap = read_last_cap();
  PrivilegePlan plan;
  for (std::size_t i = 0; i < policy.capabilities.size(); ++i) {
    const std::string& name = policy.capabilities[i];
    const std::string where = "capabilities[" + std::to_string(i) + "]";
    if (!name.starts_with("CAP_"))
      throw Error(where + ": expected a name such as CAP_NET_BIND_SERVICE, got \"" + name + "\"");
    std::string lower = name;
    for (char& c : lower) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
    cap_value_t value = -1;
    if (cap_from_name(lower.c_str(), &value) != 0 || value < 0)
      throw Error(where + ": unknown capability " + name);
    if (value > last_cap)
      throw Error(where + ": " + name +
                  " is not supported by this kernel (its last capability is " +
                  std::to_string(last_cap) + ")");
    plan.kept_ |= std::uint64_t{1} << value;
  }
  for (int cap = 0; cap <= last_cap; ++cap) {
    if (plan.kept_ & (std::uint64_t{1} << cap))
      plan.ambient_.push_back(cap);
    else
      plan.drop_from_bounding_.push_back(cap);
  }
  // No root magic on exec, no capability changes on uid changes, keep-caps off; all locked, so
  // the payload cannot undo them. Ambient raising is locked off after apply() has raised the
  // kept capabilities: those stay ambient, nothing else can join them.
  plan.securebits_ = SECBIT_NOROOT | SECBIT_NOROOT_LOCKED | SECBIT_NO_SETUID_FIXUP |
                     SECBIT_NO_SETUID_FIXUP_LOCKED | SECBIT_KEEP_CAPS_LOCKED |
                     SECBIT_NO_CAP_AMBIENT_RAISE | SECBIT_NO_CAP_AMBIENT_RAISE_LOCKED;
  return plan;
}

bool PrivilegePlan::apply(process::ChildFailure& failure) const noexcept {
  auto fail = [&](const char* step) {
    failure.set(step, errno);
    return false;
  };
  if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0) != 0)
    return fail("clear the ambient capabilities");
  for (const int cap : drop_from_bounding_)
    if (::prctl(PR_CAPBSET_DROP, cap, 0, 0, 0) != 0)
      return fail("drop a capability from the bounding set");

  // Inheritable = kept: with ambient, that is what carries them across exec for a non-root uid.
  // Permitted and effective stay as they are for the steps before exec.
  __user_cap_header_struct header{_LINUX_CAPABILITY_VERSION_3, 0};
  __user_cap_data_struct data[_LINUX_CAPABILITY_U32S_3] = {};
  if (::syscall(SYS_capget, &header, data) != 0) return fail("read the capability sets");
  data[0].inheritable = static_cast<std::uint32_t>(kept_);
  data[1].inheritable = static_cast<std::uint32_t>(kept_ >> 32);
  if (::syscall(SYS_capset, &header, data) != 0) return fail("set the inheritable capabilities");
  for (const int cap : ambient_)
    if (::prctl(PR_CAP_AMBIENT, PR_CAP_AMBIENT_RAISE, cap, 0, 0) != 0)
      return fail("raise a kept capability as ambient");

  if (::prctl(PR_SET_SECUREBITS, securebits_, 0, 0, 0) != 0) return fail("lock the securebits");
  if (::prctl(PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0) != 0) return fail("set no_new_privs");
  return true;
}

}  // namespace rlm::ns
