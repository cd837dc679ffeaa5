// Sizes and durations as people write them. Parsing is exact decimal arithmetic (no floating
// point), so "1.5G" is exactly 1610612736 and format_* output always parses back to the same value.
#include "rlm_sandbox/units.hpp"

#include <cctype>
#include <iomanip>
#include <limits>
#include <sstream>

namespace rlm {
namespace {

using Wide = unsigned __int128;

// A number written as digits with an optional fraction: "256", "1.5". Kept as an exact fraction.
struct Decimal {
  Wide whole = 0;
  Wide fraction = 0;        // the digits after the point, as an integer
  Wide fraction_scale = 1;  // 10^(number of fraction digits)
};

// Reads the leading number of `text`; the rest (the unit) is left in `text`. Rejects signs,
// missing digits on either side of the point, and numbers too long to be meaningful.
std::optional<Decimal> take_decimal(std::string_view& text) {
  constexpr std::size_t kMaxDigits = 24;  // keeps every product below inside 128 bits
  Decimal number;
  std::size_t i = 0;
  while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
    number.whole = number.whole * 10 + static_cast<unsigned>(text[i] - '0');
    if (++i > kMaxDigits) return std::nullopt;
  }
  if (i == 0) return std::nullopt;
  if (i < text.size() && text[i] == '.') {
    const std::size_t start = ++i;
    while (i < text.size() && std::isdigit(static_cast<unsigned char>(text[i]))) {
      number.fraction = number.fraction * 10 + static_cast<unsigned>(text[i] - '0');
      number.fraction_scale *= 10;
      if (++i - start > 12) return std::nullopt;  // finer than any unit can express
    }
    if (i == start) return std::nullopt;
  }
  text.remove_prefix(i);
  return number;
}

// number * multiplier, rounded down to a whole unit; nullopt when it exceeds `max`, or when a
// fraction is given in the base unit itself ("1.5" bytes or "1.5ms" mean nothing useful).
std::optional<std::uint64_t> scale(const Decimal& number, Wide multiplier, Wide max) {
  if (multiplier == 1 && number.fraction_scale != 1) return std::nullopt;
  const Wide value =
      number.whole * multiplier + number.fraction * multiplier / number.fraction_scale;
  if (value > max) return std::nullopt;
  return static_cast<std::uint64_t>(value);
}

bool equals_lowercase(std::string_view text, std::string_view lower) {
  if (text.size() != lower.size()) return false;
  for (std::size_t i = 0; i < text.size(); ++i)
    if (std::tolower(static_cast<unsigned char>(text[i])) != lower[i]) return false;
  return true;
}

// "1.5" with up to `max_decimals` decimals trimmed of trailing zeros, for value/unit; nullopt
// when that many decimals cannot represent it exactly.
std::optional<std::string> exact_decimal(std::uint64_t value, std::uint64_t unit,
                                         int max_decimals) {
  Wide scaled = static_cast<Wide>(value);
  int decimals = 0;
  while (scaled % unit != 0) {
    if (decimals == max_decimals) return std::nullopt;
    scaled *= 10;
    ++decimals;
  }
  std::string digits = std::to_string(static_cast<std::uint64_t>(scaled / unit));
  if (decimals == 0) return digits;
  const auto places = static_cast<std::size_t>(decimals);
  if (digits.size() <= places) digits.insert(0, places + 1 - digits.size(), '0');
  digits.insert(digits.size() - places, ".");
  return digits;
}

}  // namespace

std::optional<std::uint64_t> parse_size(std::string_view text) {
  auto number = take_decimal(text);
  if (!number) return std::nullopt;
  Wide multiplier = 1;
  if (!text.empty()) {
    // "512B" is plain bytes (the "b" is checked below); K, M, G, T are binary multiples.
    const char unit = static_cast<char>(std::tolower(static_cast<unsigned char>(text.front())));
    const std::string_view units = "kmgt";
    const std::size_t power = units.find(unit);
    if (power != std::string_view::npos) {
      multiplier = Wide{1} << (10 * (power + 1));
    } else if (unit != 'b') {
      return std::nullopt;
    }
    if (multiplier != 1) text.remove_prefix(1);
    // What may follow: nothing, "B" or "iB" ("iB" only after a multiple: "KiB", never "iB").
    if (!text.empty() && !equals_lowercase(text, "b") &&
        !(multiplier != 1 && equals_lowercase(text, "ib")))
      return std::nullopt;
  }
  return scale(*number, multiplier, std::numeric_limits<std::uint64_t>::max());
}

std::optional<std::chrono::milliseconds> parse_duration(std::string_view text) {
  auto number = take_decimal(text);
  if (!number) return std::nullopt;
  Wide multiplier;
  if (text.empty() || text == "ms")
    multiplier = 1;
  else if (text == "s")
    multiplier = 1000;
  else if (text == "m")
    multiplier = 60 * 1000;
  else if (text == "h")
    multiplier = 60 * 60 * 1000;
  else
    return std::nullopt;
  auto millis =
      scale(*number, multiplier, std::numeric_limits<std::chrono::milliseconds::rep>::max());
  if (!millis) return std::nullopt;
  return std::chrono::milliseconds(static_cast<std::chrono::milliseconds::rep>(*millis));
}

std::string format_size(std::uint64_t bytes) {
  // The largest unit that shows the value exactly with at most two decimals: "1.5G", "256M".
  static constexpr struct {
    char suffix;
    int shift;
  } kUnits[] = {{'T', 40}, {'G', 30}, {'M', 20}, {'K', 10}};
  for (const auto& unit : kUnits) {
    const std::uint64_t size = std::uint64_t{1} << unit.shift;
    if (bytes < size) continue;
    if (auto text = exact_decimal(bytes, size, 2)) return *text + unit.suffix;
  }
  return std::to_string(bytes) + "B";
}

std::string format_duration(std::chrono::milliseconds duration) {
  const auto millis = duration.count();
  // Negation in unsigned arithmetic, so even the most negative value has a magnitude.
  const auto value = millis < 0 ? std::uint64_t{0} - static_cast<std::uint64_t>(millis)
                                : static_cast<std::uint64_t>(millis);
  const std::string sign = millis < 0 ? "-" : "";
  constexpr std::uint64_t kSecond = 1000, kMinute = 60 * kSecond, kHour = 60 * kMinute;
  if (value >= kHour && value % kHour == 0) return sign + std::to_string(value / kHour) + "h";
  if (value >= kMinute && value % kMinute == 0) return sign + std::to_string(value / kMinute) + "m";
  if (value >= kSecond) return sign + *exact_decimal(value, kSecond, 3) + "s";
  return sign + std::to_string(value) + "ms";
}

std::string format_cpus(double cpus) {
  std::ostringstream text;
  text << std::setprecision(6) << cpus;
  return text.str();
}

}  // namespace rlm
