#include "rlm_sandbox/result.hpp"

#include "rlm_sandbox/error.hpp"

#include <array>
#include <utility>

namespace rlm {
namespace {

constexpr std::array<std::pair<Status, std::string_view>, 12> kStatusNames{{
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
    {Status::interrupted, "interrupted"},
    {Status::node_drained, "node_drained"},
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

nlohmann::json NetworkAccount::to_json() const {
  auto allowed_entries = nlohmann::json::array();
  for (const auto& entry : allowed)
    allowed_entries.push_back({{"t_ms", entry.at.count()},
                               {"name", valid_utf8(entry.name)},
                               {"address", entry.address},
                               {"port", entry.port},
                               {"rule", entry.rule},
                               {"bytes_out", entry.bytes_out},
                               {"bytes_in", entry.bytes_in},
                               {"ms", entry.duration.count()}});
  auto denied_entries = nlohmann::json::array();
  for (const auto& entry : denied)
    denied_entries.push_back({{"kind", entry.kind},
                              {"name", valid_utf8(entry.name)},
                              {"destination", entry.destination},
                              {"port", entry.port},
                              {"count", entry.count}});
  return {{"allowed", std::move(allowed_entries)},
          {"denied", std::move(denied_entries)},
          {"dns", {{"answered", dns_answered}, {"refused", dns_refused}}},
          {"truncated", truncated}};
}

nlohmann::json Result::to_json() const {
  auto document = nlohmann::json{
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
  if (!node.empty()) document["node"] = node;
  if (network) document["network"] = network->to_json();
  return document;
}

}  // namespace rlm

namespace rlm {
namespace {

const nlohmann::json& field(const nlohmann::json& document, const char* key) {
  static const nlohmann::json kNull;
  const auto found = document.find(key);
  return found == document.end() ? kNull : *found;
}

std::chrono::microseconds from_ms(const nlohmann::json& value) {
  if (!value.is_number() || !(value.get<double>() >= 0) || value.get<double>() > 1e15)
    throw Error("a Result's times must be non-negative numbers of milliseconds");
  return std::chrono::microseconds(static_cast<std::int64_t>(value.get<double>() * 1000.0 + 0.5));
}

template <typename T>
T number_or(const nlohmann::json& value, T fallback, const char* key) {
  if (value.is_null()) return fallback;
  if (!value.is_number_integer())
    throw Error(std::string("a Result's \"") + key + "\" must be an integer");
  return value.get<T>();
}

std::string text_or_empty(const nlohmann::json& value, const char* key) {
  if (value.is_null()) return {};
  if (!value.is_string()) throw Error(std::string("a Result's \"") + key + "\" must be a string");
  return value.get<std::string>();
}

bool flag(const nlohmann::json& value, const char* key) {
  if (value.is_null()) return false;
  if (!value.is_boolean()) throw Error(std::string("a Result's \"") + key + "\" must be a boolean");
  return value.get<bool>();
}

}  // namespace

NetworkAccount network_account_from_json(const nlohmann::json& document) {
  if (!document.is_object()) throw Error("a Result's \"network\" must be an object");
  NetworkAccount account;
  auto entries = [&](const char* key) {
    const auto& list = field(document, key);
    if (!list.is_null() && !list.is_array())
      throw Error(std::string("a Result's \"network.") + key + "\" must be an array");
    for (const auto& entry : list)
      if (!entry.is_object())
        throw Error(std::string("a Result's \"network.") + key + "\" holds objects");
    return list.is_null() ? nlohmann::json::array() : list;
  };
  for (const auto& entry : entries("allowed")) {
    NetworkAllowed allowed;
    allowed.at =
        std::chrono::milliseconds(number_or<std::int64_t>(field(entry, "t_ms"), 0, "t_ms"));
    allowed.name = text_or_empty(field(entry, "name"), "name");
    allowed.address = text_or_empty(field(entry, "address"), "address");
    allowed.port = number_or<std::uint16_t>(field(entry, "port"), 0, "port");
    allowed.rule = text_or_empty(field(entry, "rule"), "rule");
    allowed.bytes_out = number_or<std::uint64_t>(field(entry, "bytes_out"), 0, "bytes_out");
    allowed.bytes_in = number_or<std::uint64_t>(field(entry, "bytes_in"), 0, "bytes_in");
    allowed.duration =
        std::chrono::milliseconds(number_or<std::int64_t>(field(entry, "ms"), 0, "ms"));
    account.allowed.push_back(std::move(allowed));
  }
  for (const auto& entry : entries("denied")) {
    NetworkDenied denied;
    denied.kind = text_or_empty(field(entry, "kind"), "kind");
    denied.name = text_or_empty(field(entry, "name"), "name");
    denied.destination = text_or_empty(field(entry, "destination"), "destination");
    denied.port = number_or<std::uint16_t>(field(entry, "port"), 0, "port");
    denied.count = number_or<std::uint64_t>(field(entry, "count"), 1, "count");
    account.denied.push_back(std::move(denied));
  }
  const auto& dns = field(document, "dns");
  if (!dns.is_null()) {
    if (!dns.is_object()) throw Error("a Result's \"network.dns\" must be an object");
    account.dns_answered = number_or<std::uint64_t>(field(dns, "answered"), 0, "answered");
    account.dns_refused = number_or<std::uint64_t>(field(dns, "refused"), 0, "refused");
  }
  account.truncated = flag(field(document, "truncated"), "truncated");
  return account;
}

NetworkAccount network_since(const NetworkAccount& before, const NetworkAccount& now) {
  NetworkAccount slice;
  if (now.allowed.size() > before.allowed.size())
    slice.allowed.assign(now.allowed.begin() + static_cast<std::ptrdiff_t>(before.allowed.size()),
                         now.allowed.end());
  for (const auto& entry : now.denied) {
    std::uint64_t earlier = 0;
    for (const auto& old : before.denied)
      if (old.kind == entry.kind && old.name == entry.name &&
          old.destination == entry.destination && old.port == entry.port)
        earlier = old.count;
    if (entry.count > earlier) {
      slice.denied.push_back(entry);
      slice.denied.back().count = entry.count - earlier;
    }
  }
  slice.dns_answered = now.dns_answered - std::min(now.dns_answered, before.dns_answered);
  slice.dns_refused = now.dns_refused - std::min(now.dns_refused, before.dns_refused);
  slice.truncated = now.truncated;
  return slice;
}

Result result_from_json(const nlohmann::json& document) {
  if (!document.is_object()) throw Error("a Result must be a JSON object");
  Result result;
  const auto status = status_from_string(text_or_empty(field(document, "status"), "status"));
  if (!status) throw Error("a Result's \"status\" is not one of the statuses");
  result.status = *status;
  result.exit_code = number_or<int>(field(document, "exit_code"), -1, "exit_code");
  result.signal = number_or<int>(field(document, "signal"), 0, "signal");
  result.detail = text_or_empty(field(document, "detail"), "detail");
  if (!field(document, "wall_ms").is_null()) result.wall = from_ms(field(document, "wall_ms"));
  if (!field(document, "cpu_ms").is_null()) result.cpu = from_ms(field(document, "cpu_ms"));
  result.peak_memory_bytes =
      number_or<std::uint64_t>(field(document, "peak_memory_bytes"), 0, "peak_memory_bytes");
  result.stdout_data = text_or_empty(field(document, "stdout"), "stdout");
  result.stderr_data = text_or_empty(field(document, "stderr"), "stderr");
  result.stdout_truncated = flag(field(document, "stdout_truncated"), "stdout_truncated");
  result.stderr_truncated = flag(field(document, "stderr_truncated"), "stderr_truncated");
  result.backend = text_or_empty(field(document, "backend"), "backend");
  result.policy = text_or_empty(field(document, "policy"), "policy");
  result.node = text_or_empty(field(document, "node"), "node");
  const auto& unenforced = field(document, "unenforced");
  if (!unenforced.is_null()) {
    if (!unenforced.is_array()) throw Error("a Result's \"unenforced\" must be an array");
    for (const auto& item : unenforced)
      result.unenforced.push_back(text_or_empty(item, "unenforced"));
  }
  if (const auto& network = field(document, "network"); !network.is_null())
    result.network = network_account_from_json(network);
  return result;
}

}  // namespace rlm
