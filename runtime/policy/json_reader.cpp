#include "policy/json_reader.hpp"

#include <algorithm>
#include <cmath>
#include <sstream>

#include "policy/did_you_mean.hpp"
#include "policy/json_text.hpp"
#include "rlm_sandbox/units.hpp"

namespace rlm::policy {
namespace {

using nlohmann::json;

std::string join(std::span<const std::string_view> items) {
  std::string text;
  for (auto item : items) text += (text.empty() ? "" : ", ") + std::string(item);
  return text;
}

// What a JSON number is, for messages that say exactly what is wrong with it. Integers beyond
// 64 bits arrive from the parser as doubles.
struct Number {
  enum class Kind { whole, negative, fraction, too_large } kind;
  std::uint64_t value = 0;  // when whole
};

Number classify(const json& value) {
  if (value.is_number_unsigned()) return {Number::Kind::whole, value.get<std::uint64_t>()};
  if (value.is_number_integer()) {
    const auto signed_value = value.get<std::int64_t>();
    if (signed_value < 0) return {Number::Kind::negative};
    return {Number::Kind::whole, static_cast<std::uint64_t>(signed_value)};
  }
  const double real = value.get<double>();
  if (real < 0) return {Number::Kind::negative};
  if (real != std::floor(real)) return {Number::Kind::fraction};
  if (real >= 18446744073709551616.0) return {Number::Kind::too_large};
  return {Number::Kind::whole, static_cast<std::uint64_t>(real)};
}

}  // namespace

std::string describe(const json& value) {
  // Containers are named, never printed: they may be large or deeply nested.
  if (value.is_array()) return "an array";
  if (value.is_object()) return "an object";
  if (value.is_null()) return "null";
  auto shown = value.dump();
  if (shown.size() > 40) {
    // Cut before a whole character: half of one would make the message invalid UTF-8.
    std::size_t cut = 37;
    while (cut > 0 && (static_cast<unsigned char>(shown[cut]) & 0xC0) == 0x80) --cut;
    shown = shown.substr(0, cut) + "...";
  }
  if (value.is_boolean()) return "a boolean (" + shown + ")";
  if (value.is_string()) return "a string (" + shown + ")";
  return "a number (" + shown + ")";
}

std::string describe_type(const json& value) {
  if (value.is_array()) return "an array";
  if (value.is_object()) return "an object";
  if (value.is_null()) return "null";
  if (value.is_boolean()) return "a boolean";
  if (value.is_string()) return "a string";
  return "a number";
}

void JsonReader::error(std::string path, std::string message) {
  diagnostics_.push_back({std::move(path), std::move(message)});
}

void JsonReader::wrong_type(const json& value, const std::string& path, std::string_view expected) {
  error(path, "expected " + std::string(expected) + ", got " + describe(value));
}

bool JsonReader::object(const json& value, const std::string& path,
                        std::span<const std::string_view> allowed, const KeyHint& hint) {
  if (!value.is_object()) {
    wrong_type(value, path, "an object");
    return false;
  }
  for (const auto& [key, member] : value.items()) {
    if (std::find(allowed.begin(), allowed.end(), key) != allowed.end()) continue;
    auto suggestion = closest_match(key, allowed);
    if (!suggestion && hint) suggestion = hint(key);
    error(key_path(path, key), suggestion ? "unknown key; did you mean " + *suggestion + "?"
                                          : "unknown key; expected one of: " + join(allowed));
  }
  return true;
}

bool JsonReader::free_form_object(const json& value, const std::string& path) {
  if (value.is_object()) return true;
  wrong_type(value, path, "an object");
  return false;
}

bool JsonReader::array(const json& value, const std::string& path) {
  if (value.is_array()) return true;
  wrong_type(value, path, "an array");
  return false;
}

std::optional<bool> JsonReader::boolean(const json& value, const std::string& path) {
  if (value.is_boolean()) return value.get<bool>();
  wrong_type(value, path, "true or false");
  return std::nullopt;
}

std::optional<std::string> JsonReader::string(const json& value, const std::string& path) {
  if (!value.is_string()) {
    wrong_type(value, path, "a string");
    return std::nullopt;
  }
  auto text = value.get<std::string>();
  // Paths, names and values all end up in C strings; a NUL would silently cut them short.
  if (text.find('\0') != std::string::npos) {
    error(path, "must not contain a NUL character");
    return std::nullopt;
  }
  return text;
}

std::optional<std::uint64_t> JsonReader::integer(const json& value, const std::string& path,
                                                 std::uint64_t min, std::uint64_t max) {
  if (!value.is_number()) {
    wrong_type(value, path, "an integer");
    return std::nullopt;
  }
  const Number number = classify(value);
  if (number.kind == Number::Kind::fraction) {
    wrong_type(value, path, "a whole number");
    return std::nullopt;
  }
  if (number.kind != Number::Kind::whole || number.value < min || number.value > max) {
    error(path, "must be between " + std::to_string(min) + " and " + std::to_string(max) +
                    ", got " + value.dump());
    return std::nullopt;
  }
  return number.value;
}

std::optional<double> JsonReader::number(const json& value, const std::string& path, double min,
                                         double max) {
  if (!value.is_number()) {
    wrong_type(value, path, "a number");
    return std::nullopt;
  }
  const double number = value.get<double>();
  if (!(number >= min && number <= max)) {
    std::ostringstream range;
    range << "must be between " << min << " and " << max << ", got " << value.dump();
    error(path, range.str());
    return std::nullopt;
  }
  return number;
}

std::optional<std::uint64_t> JsonReader::size(const json& value, const std::string& path) {
  constexpr std::string_view kExpected = "a size such as 268435456, \"256M\" or \"1.5G\"";
  std::optional<std::uint64_t> bytes;
  if (value.is_string()) {
    bytes = parse_size(value.get<std::string>());
    if (!bytes) {
      wrong_type(value, path, kExpected);
      return std::nullopt;
    }
  } else if (value.is_number()) {
    const Number number = classify(value);
    if (number.kind == Number::Kind::fraction) {
      wrong_type(value, path, "a whole number of bytes");
      return std::nullopt;
    }
    if (number.kind == Number::Kind::too_large) {
      error(path, "is too large: sizes go up to 2^64-1 bytes, got " + value.dump());
      return std::nullopt;
    }
    if (number.kind == Number::Kind::whole) bytes = number.value;
  } else {
    wrong_type(value, path, kExpected);
    return std::nullopt;
  }
  if (!bytes || *bytes == 0) {
    error(path, "must be greater than 0, got " + value.dump());
    return std::nullopt;
  }
  return bytes;
}

std::optional<std::chrono::milliseconds> JsonReader::duration(const json& value,
                                                              const std::string& path,
                                                              std::chrono::milliseconds min,
                                                              std::chrono::milliseconds max) {
  constexpr std::string_view kExpected =
      "a duration such as 1500 (milliseconds), \"250ms\", \"10s\", \"1.5s\", \"2m\" or \"1h\"";
  const auto out_of_range = [&] {
    error(path, "must be between " + format_duration(min) + " and " + format_duration(max) +
                    ", got " + value.dump());
    return std::nullopt;
  };
  std::chrono::milliseconds millis;
  if (value.is_string()) {
    auto parsed = parse_duration(value.get<std::string>());
    if (!parsed) {
      wrong_type(value, path, kExpected);
      return std::nullopt;
    }
    millis = *parsed;
  } else if (value.is_number()) {
    const Number number = classify(value);
    if (number.kind == Number::Kind::fraction) {
      wrong_type(value, path, "a whole number of milliseconds");
      return std::nullopt;
    }
    if (number.kind != Number::Kind::whole ||
        number.value > static_cast<std::uint64_t>(max.count()))
      return out_of_range();
    millis = std::chrono::milliseconds(static_cast<std::int64_t>(number.value));
  } else {
    wrong_type(value, path, kExpected);
    return std::nullopt;
  }
  if (millis < min || millis > max) return out_of_range();
  return millis;
}

const json* member(const json& object, std::string_view key) {
  const auto found = object.find(std::string(key));
  return found == object.end() ? nullptr : &*found;
}

std::string as_json_string(std::string_view text) {
  return json(std::string(text)).dump();
}

}  // namespace rlm::policy
