#include "server/slurm_hostlist.hpp"

#include <charconv>

#include "rlm_sandbox/error.hpp"

namespace rlm::server {
namespace {

constexpr std::size_t kMaxHostBytes = 253;  // a DNS name's longest

struct Range {
  unsigned long long first = 0;
  unsigned long long last = 0;
  std::size_t width = 0;  // digits of the lower bound: zero-padded to it
};

Error malformed(std::string_view list, const std::string& why) {
  return Error("the Slurm node list '" + std::string(list.substr(0, 200)) + "': " + why);
}

// Splits `text` at commas outside brackets.
std::vector<std::string_view> split_outside_brackets(std::string_view text) {
  std::vector<std::string_view> parts;
  std::size_t start = 0;
  bool inside = false;
  for (std::size_t i = 0; i < text.size(); ++i) {
    if (text[i] == '[') inside = true;
    if (text[i] == ']') inside = false;
    if (text[i] == ',' && !inside) {
      parts.push_back(text.substr(start, i - start));
      start = i + 1;
    }
  }
  parts.push_back(text.substr(start));
  return parts;
}

bool all_digits(std::string_view text) {
  if (text.empty() || text.size() > 18) return false;  // 18 digits fit, with room to count
  for (char c : text)
    if (c < '0' || c > '9') return false;
  return true;
}

unsigned long long number_of(std::string_view digits) {
  unsigned long long value = 0;
  std::from_chars(digits.data(), digits.data() + digits.size(), value);
  return value;
}

// "01-03,7" into its ranges.
std::vector<Range> ranges_of(std::string_view list, std::string_view body) {
  std::vector<Range> ranges;
  for (std::string_view part : split_outside_brackets(body)) {
    const auto dash = part.find('-');
    const std::string_view low = part.substr(0, dash);
    const std::string_view high = dash == std::string_view::npos ? low : part.substr(dash + 1);
    if (!all_digits(low) || !all_digits(high))
      throw malformed(list, "'[" + std::string(body) + "]' is not numbers and ranges of them");
    Range range{number_of(low), number_of(high), low.size()};
    if (range.last < range.first)
      throw malformed(list, "the range " + std::string(part) + " runs backwards");
    ranges.push_back(range);
  }
  return ranges;
}

std::string padded(unsigned long long value, std::size_t width) {
  std::string digits = std::to_string(value);
  if (digits.size() < width) digits.insert(0, width - digits.size(), '0');
  return digits;
}

// One comma-free item ("rack[1-2]-n[01-02]") into its hosts, appended to `hosts`.
void expand_item(std::string_view list, std::string_view item, std::vector<std::string>& hosts,
                 std::size_t max_hosts) {
  // The item as literal pieces between bracket groups, and the groups' ranges.
  std::vector<std::string_view> pieces;
  std::vector<std::vector<Range>> groups;
  std::size_t at = 0;
  while (true) {
    const auto open = item.find('[', at);
    if (open == std::string_view::npos) {
      pieces.push_back(item.substr(at));
      break;
    }
    const auto close = item.find(']', open);
    if (close == std::string_view::npos) throw malformed(list, "a '[' is not closed");
    pieces.push_back(item.substr(at, open - at));
    groups.push_back(ranges_of(list, item.substr(open + 1, close - open - 1)));
    at = close + 1;
  }
  for (std::string_view piece : pieces)
    for (char c : piece)
      if (!((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
            c == '-' || c == '.' || c == '_'))  // ASCII, whatever the locale
        throw malformed(list, "'" + std::string(item) + "' is not a host name");
  // How many hosts this item makes, before making any.
  std::size_t count = 1;
  for (const auto& ranges : groups) {
    std::size_t in_group = 0;
    for (const Range& range : ranges) {
      const unsigned long long span = range.last - range.first + 1;
      if (span > max_hosts || in_group + span > max_hosts)
        in_group = max_hosts + 1;
      else
        in_group += span;
    }
    if (in_group > max_hosts || count * in_group > max_hosts ||
        hosts.size() + count * in_group > max_hosts)
      throw malformed(list, "more than " + std::to_string(max_hosts) + " hosts");
    count *= in_group;
  }
  if (hosts.size() + count > max_hosts)  // a name without brackets is one more
    throw malformed(list, "more than " + std::to_string(max_hosts) + " hosts");
  // Odometer over the groups, the last group turning fastest (Slurm's order).
  std::vector<std::size_t> range_at(groups.size(), 0);
  std::vector<unsigned long long> value(groups.size());
  for (std::size_t g = 0; g < groups.size(); ++g) value[g] = groups[g][0].first;
  for (std::size_t made = 0; made < count; ++made) {
    std::string host(pieces[0]);
    for (std::size_t g = 0; g < groups.size(); ++g) {
      host += padded(value[g], groups[g][range_at[g]].width);
      host += pieces[g + 1];
    }
    if (host.empty() || host.size() > kMaxHostBytes)
      throw malformed(list, "a host name of " + std::to_string(host.size()) + " bytes");
    hosts.push_back(std::move(host));
    for (std::size_t g = groups.size(); g-- > 0;) {
      if (value[g] < groups[g][range_at[g]].last) {
        ++value[g];
        break;
      }
      range_at[g] = (range_at[g] + 1) % groups[g].size();
      value[g] = groups[g][range_at[g]].first;
      if (range_at[g] != 0) break;
    }
  }
}

}  // namespace

std::vector<std::string> expand_slurm_hostlist(std::string_view list, std::size_t max_hosts) {
  std::vector<std::string> hosts;
  for (std::string_view item : split_outside_brackets(list)) {
    while (!item.empty() && (item.front() == ' ' || item.front() == '\n')) item.remove_prefix(1);
    while (!item.empty() && (item.back() == ' ' || item.back() == '\n')) item.remove_suffix(1);
    if (item.empty()) continue;
    expand_item(list, item, hosts, max_hosts);
  }
  if (hosts.empty()) throw malformed(list, "no hosts in it");
  return hosts;
}

}  // namespace rlm::server
