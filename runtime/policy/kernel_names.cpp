#include "policy/kernel_names.hpp"

#include <seccomp.h>
#include <sys/capability.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <memory>

namespace rlm::policy {
namespace {

std::string upper(std::string_view text) {
  std::string result(text);
  for (char& c : result) c = static_cast<char>(std::toupper(static_cast<unsigned char>(c)));
  return result;
}

std::string lower(std::string_view text) {
  std::string result(text);
  for (char& c : result) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return result;
}

bool all_digits(std::string_view text) {
  return !text.empty() &&
         std::all_of(text.begin(), text.end(), [](char c) { return c >= '0' && c <= '9'; });
}

}  // namespace

bool is_known_syscall(std::string_view name) {
  // libseccomp would parse neither numbers nor empty names as syscalls; rule them out plainly.
  if (name.empty() || all_digits(name)) return false;
  return seccomp_syscall_resolve_name(std::string(name).c_str()) != __NR_SCMP_ERROR;
}

const std::vector<std::string>& native_syscall_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> found;
    const std::uint32_t native = seccomp_arch_native();
    // Syscall numbers are dense from 0 on every architecture libseccomp supports; 1024 covers
    // them with room for years of new ones.
    for (int number = 0; number < 1024; ++number) {
      std::unique_ptr<char, decltype(&std::free)> name(
          seccomp_syscall_resolve_num_arch(native, number), &std::free);
      if (name) found.emplace_back(name.get());
    }
    return found;
  }();
  return names;
}

std::optional<std::string> canonical_capability(std::string_view name) {
  if (all_digits(name)) return std::nullopt;  // cap_from_name would take "12" as a number
  std::string spelled = lower(name);
  if (!spelled.starts_with("cap_")) spelled = "cap_" + spelled;
  cap_value_t value;
  if (cap_from_name(spelled.c_str(), &value) != 0) return std::nullopt;
  std::unique_ptr<char, decltype(&cap_free)> known(cap_to_name(value), &cap_free);
  if (!known) return std::nullopt;
  return upper(known.get());
}

const std::vector<std::string>& capability_names() {
  static const std::vector<std::string> names = [] {
    std::vector<std::string> found;
    for (cap_value_t value = 0; value < 64; ++value) {
      std::unique_ptr<char, decltype(&cap_free)> name(cap_to_name(value), &cap_free);
      // Values libcap has no name for come back as plain numbers.
      if (name && !all_digits(name.get())) found.push_back(upper(name.get()));
    }
    return found;
  }();
  return names;
}

}  // namespace rlm::policy
