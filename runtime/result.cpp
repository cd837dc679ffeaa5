#include "rlm_sandbox/result.hpp"

#include <array>
#include <utility>

namespace rlm {
namespace {

constexpr std::array<std::pair<Status, std::string_view>, 10> kStatusNames{{
    {Status::ok, "ok"},
    {Status::exit_nonzero, "exit_nonzero"},
    {Status::signaled, "signaled"},
    {Status::timeout, "timeout"},
    {Status::cpu_limit, "cpu_limit"},
    {Status::memory_limit, "memory_limit"},
    {Status::pids_limit, "pids_limit"},
    {Status::output_limit, "output_limit"},
    {Status::seccomp_violation, "seccomp_violation"},
    {Status::sandbox_error, "sandbox_error"},
}};

// Length of the valid UTF-8 sequence starting at text[i], or 0 when it is not valid (overlong
// forms, surrogates and code points past U+10FFFF are invalid too).
std::size_t utf8_sequence_length(std::string_view text, std::size_t i) {
  const auto byte = [&](std::size_t k) { return static_cast<unsigned char>(text[k]); };
  const unsigned char lead = byte(i);
  if (lead < 0x80) return 1;
  std::size_t length;
  std::uint32_t code_point;
  if ((lead & 0xE0) == 0xC0) {
    length = 2, code_point = lead & 0x1F;
  } else if ((lead & 0xF0) == 0xE0) {
    length = 3, code_point = lead & 0x0F;
  } else if ((lead & 0xF8) == 0xF0) {
    length = 4, code_point = lead & 0x07;
  } else {
    return 0;
  }
  if (i + length > text.size()) return 0;
  for (std::size_t k = 1; k < length; ++k) {
    if ((byte(i + k) & 0xC0) != 0x80) return 0;
    code_point = (code_point << 6) | (byte(i + k) & 0x3F);
  }
  static constexpr std::uint32_t kMinimum[] = {0, 0, 0x80, 0x800, 0x10000};
  if (code_point < kMinimum[length] || code_point > 0x10FFFF ||
      (code_point >= 0xD800 && code_point <= 0xDFFF))
    return 0;
  return length;
}

std::string valid_utf8(std::string_view text) {
  std::string out;
  out.reserve(text.size());
  for (std::size_t i = 0; i < text.size();) {
    if (std::size_t n = utf8_sequence_length(text, i)) {
      out.append(text.substr(i, n));
      i += n;
    } else {
      out.append("\xEF\xBF\xBD");  // U+FFFD REPLACEMENT CHARACTER
      ++i;
    }
  }
  return out;
}

double to_ms(std::chrono::microseconds duration) {
  return static_cast<double>(duration.count()) / 1000.0;
}

}  // namespace

std::string_view to_string(Status status) {
  for (const auto& [value, name] : kStatusNames)
    if (value == status) return name;
  return "sandbox_error";
}

std::optional<Status> status_from_string(std::string_view text) {
  for (const auto& [value, name] : kStatusNames)
    if (name == text) return value;
  return std::nullopt;
}

nlohmann::json Result::to_json() const {
  return {
      {"status", to_string(status)},
      {"exit_code", exit_code},
      {"signal", signal},
      {"detail", valid_utf8(detail)},
      {"wall_ms", to_ms(wall)},
      {"cpu_ms", to_ms(cpu)},
      {"peak_memory_bytes", peak_memory_bytes},
      {"stdout", valid_utf8(stdout_data)},
      {"stderr", valid_utf8(stderr_data)},
      {"stdout_truncated", stdout_truncated},
      {"stderr_truncated", stderr_truncated},
      {"backend", backend},
      {"policy", policy},
      {"unenforced", unenforced},
  };
}

}  // namespace rlm
