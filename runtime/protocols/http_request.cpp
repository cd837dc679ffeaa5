#include "protocols/http_request.hpp"

#include <arpa/inet.h>

#include <algorithm>
#include <array>
#include <string_view>

#include "protocols/host_name.hpp"

namespace rlm::protocols {
namespace {

constexpr int kMaxChunkSizeDigits = 16;  // 16 hex digits fill a uint64_t: no overflow possible
// Chunk extensions and trailers are skipped, not relayed as meaning; bounded so a body cannot be
// an endless line.
constexpr std::size_t kMaxChunkExtension = 4096;
constexpr std::size_t kMaxTrailerBytes = 8192;
constexpr std::size_t kMaxContentLengthDigits = 19;  // < 2^63: no overflow possible

std::string_view as_text(std::span<const std::uint8_t> bytes) {
  return {reinterpret_cast<const char*>(bytes.data()), bytes.size()};
}

char lower(char c) {
  return c >= 'A' && c <= 'Z' ? static_cast<char>(c - 'A' + 'a') : c;
}

bool equals_ignoring_case(std::string_view a, std::string_view b) {
  return a.size() == b.size() && std::equal(a.begin(), a.end(), b.begin(),
                                            [](char x, char y) { return lower(x) == lower(y); });
}

bool is_digit(char c) {
  return c >= '0' && c <= '9';
}

// RFC 9110 5.6.2 tchar.
bool is_token_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || is_digit(c) ||
         std::string_view("!#$%&'*+-.^_`|~").find(c) != std::string_view::npos;
}

bool is_token(std::string_view text) {
  return !text.empty() && std::all_of(text.begin(), text.end(), is_token_char);
}

bool is_visible(char c) {
  return c > 0x20 && c < 0x7f;
}  // VCHAR

// RFC 9110 5.5: VCHAR, obs-text, SP, HTAB; no NUL, no other control character.
bool is_field_value_char(char c) {
  const auto byte = static_cast<unsigned char>(c);
  return byte == '\t' || (byte >= 0x20 && byte != 0x7f);
}

std::string_view trim_whitespace(std::string_view text) {
  while (!text.empty() && (text.front() == ' ' || text.front() == '\t')) text.remove_prefix(1);
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t')) text.remove_suffix(1);
  return text;
}

// Calls `each` with every element of a comma-separated list, whitespace trimmed (empty ones
// too: RFC 9110 5.6.1 lets a list hold them). False as soon as `each` is.
template <typename Each>
bool for_each_list_element(std::string_view list, Each each) {
  for (;;) {
    const std::size_t comma = list.find(',');
    if (!each(trim_whitespace(list.substr(0, comma)))) return false;
    if (comma == std::string_view::npos) return true;
    list.remove_prefix(comma + 1);
  }
}

struct Authority {
  std::string host;
  std::optional<std::uint16_t> port;
};

// "name", "name:port", "[v6]" or "[v6]:port" (RFC 3986 authority without userinfo): the name
// normalized as an SNI is, a v6 literal's text lowercased without its brackets.
std::optional<Authority> parse_authority(std::string_view text) {
  Authority authority;
  std::string_view rest;
  if (!text.empty() && text.front() == '[') {
    const std::size_t close = text.find(']');
    if (close == std::string_view::npos) return std::nullopt;
    const std::string_view literal = text.substr(1, close - 1);
    std::array<char, 64> terminated{};
    std::array<unsigned char, 16> address{};
    if (literal.empty() || literal.size() >= terminated.size()) return std::nullopt;
    std::copy(literal.begin(), literal.end(), terminated.begin());
    if (inet_pton(AF_INET6, terminated.data(), address.data()) != 1) return std::nullopt;
    for (char c : literal) authority.host.push_back(lower(c));
    rest = text.substr(close + 1);
  } else {
    const std::size_t colon = text.find(':');
    auto name = normalize_host_name(text.substr(0, colon));
    if (!name) return std::nullopt;
    authority.host = std::move(*name);
    if (colon != std::string_view::npos) rest = text.substr(colon);
  }
  if (rest.empty()) return authority;
  const std::string_view digits = rest.substr(1);
  if (rest.front() != ':' || digits.empty() || digits.size() > 5 ||
      !std::all_of(digits.begin(), digits.end(), is_digit))
    return std::nullopt;
  unsigned port = 0;
  for (char digit : digits) port = port * 10 + static_cast<unsigned>(digit - '0');
  if (port > 65535) return std::nullopt;
  authority.port = static_cast<std::uint16_t>(port);
  return authority;
}

// The request-target (RFC 9112 3.2) checked against its method: origin-form, asterisk-form,
// absolute-form for http (its name noted), authority-form for CONNECT. Anything else would be
// read by the upstream in a way the proxy did not check.
bool check_target(HttpRequestHead& head, std::string& why) {
  const std::string_view target = head.target;
  if (head.method == "CONNECT") {
    const auto authority = parse_authority(target);
    if (!authority || !authority->port) {
      why = "a CONNECT target that is not name:port";
      return false;
    }
    return true;
  }
  if (target.front() == '/' || target == "*") return true;
  constexpr std::string_view kHttpScheme = "http://";
  if (target.size() >= kHttpScheme.size() &&
      equals_ignoring_case(target.substr(0, kHttpScheme.size()), kHttpScheme)) {
    const std::string_view rest = target.substr(kHttpScheme.size());
    const auto authority = parse_authority(rest.substr(0, rest.find_first_of("/?#")));
    if (!authority) {
      why = "an absolute-form target whose authority is not name[:port]";
      return false;
    }
    head.absolute_form = true;
    head.absolute_host = authority->host;
    return true;
  }
  why = "a request-target that is neither a path nor an http:// URL";
  return false;
}

bool parse_request_line(std::string_view line, HttpRequestHead& head, std::string& why) {
  const std::size_t method_end = line.find(' ');
  const std::size_t target_end =
      method_end == std::string_view::npos ? method_end : line.find(' ', method_end + 1);
  if (target_end == std::string_view::npos) {
    why = "a request line that is not METHOD SP TARGET SP VERSION";
    return false;
  }
  const std::string_view method = line.substr(0, method_end);
  const std::string_view target = line.substr(method_end + 1, target_end - method_end - 1);
  const std::string_view version = line.substr(target_end + 1);
  if (!is_token(method)) {
    why = "a method that is not a token";
    return false;
  }
  if (target.empty() || !std::all_of(target.begin(), target.end(), is_visible)) {
    why = "a request-target that is empty or holds spaces, control or non-ASCII bytes";
    return false;
  }
  if (version == "HTTP/1.1") {
    head.version_minor = 1;
  } else if (version == "HTTP/1.0") {
    head.version_minor = 0;
  } else {
    why = "a version other than HTTP/1.0 or HTTP/1.1";
    return false;
  }
  head.method = method;
  head.target = target;
  return check_target(head, why);
}

// What the head's framing headers said, checked together once they are all in.
struct Framing {
  int hosts = 0;
  bool content_length = false;
  bool transfer_encoding = false;
};

bool parse_content_length(std::string_view value, HttpRequestHead& head, Framing& framing,
                          std::string& why) {
  return for_each_list_element(value, [&](std::string_view element) {
    if (element.empty() || element.size() > kMaxContentLengthDigits ||
        !std::all_of(element.begin(), element.end(), is_digit)) {
      why = "a Content-Length that is not a number";
      return false;
    }
    std::uint64_t length = 0;
    for (char digit : element) length = length * 10 + static_cast<std::uint64_t>(digit - '0');
    if (framing.content_length && length != head.content_length) {
      why = "Content-Lengths that differ";
      return false;
    }
    framing.content_length = true;
    head.content_length = length;
    return true;
  });
}

bool parse_header(std::string_view line, HttpRequestHead& head, Framing& framing,
                  std::string& why) {
  if (line.front() == ' ' || line.front() == '\t') {
    why = "a folded header line (obs-fold)";
    return false;
  }
  const std::size_t colon = line.find(':');
  const std::string_view name = line.substr(0, colon);
  if (colon == std::string_view::npos || !is_token(name)) {
    why = "a header line that is not NAME: VALUE";
    return false;
  }
  const std::string_view value = trim_whitespace(line.substr(colon + 1));
  if (!std::all_of(value.begin(), value.end(), is_field_value_char)) {
    why = "a control character in the value of " + std::string(name);
    return false;
  }
  if (equals_ignoring_case(name, "host")) {
    if (++framing.hosts > 1) {
      why = "several Host headers";
      return false;
    }
    if (value.empty()) return true;  // no host named: the caller refuses it
    auto authority = parse_authority(value);
    if (!authority) {
      why = "a Host that is not name[:port]";
      return false;
    }
    head.host = std::move(authority->host);
    head.host_port = authority->port;
  } else if (equals_ignoring_case(name, "content-length")) {
    return parse_content_length(value, head, framing, why);
  } else if (equals_ignoring_case(name, "transfer-encoding")) {
    // One coding, chunked: anything else leaves the body's end to the upstream's reading.
    if (framing.transfer_encoding || !equals_ignoring_case(value, "chunked")) {
      why = "a Transfer-Encoding other than one chunked";
      return false;
    }
    framing.transfer_encoding = true;
  } else if (equals_ignoring_case(name, "connection")) {
    for_each_list_element(value, [&](std::string_view option) {
      if (equals_ignoring_case(option, "close")) head.connection_close = true;
      if (equals_ignoring_case(option, "upgrade")) head.upgrade = true;
      return true;
    });
  } else if (equals_ignoring_case(name, "upgrade")) {
    head.upgrade = true;
  }
  return true;
}

}  // namespace

HttpVerdict parse_http_request_head(std::span<const std::uint8_t> bytes, std::size_t max_head_bytes,
                                    std::size_t max_headers, HttpRequestHead& head,
                                    std::string& why) {
  head = HttpRequestHead{};
  const std::string_view text = as_text(bytes);
  const std::string_view in_limit = text.substr(0, max_head_bytes);
  Framing framing;
  std::size_t at = 0, headers = 0;
  for (bool request_line = true;; request_line = false) {
    const std::size_t line_feed = in_limit.find('\n', at);
    if (line_feed == std::string_view::npos) {
      // A CR already followed by something other than LF is bare whatever comes next.
      for (std::size_t cr = text.find('\r', at); cr < in_limit.size() && cr + 1 < text.size();
           cr = text.find('\r', cr + 1)) {
        if (text[cr + 1] != '\n') {
          why = "a CR not followed by LF";
          return HttpVerdict::malformed;
        }
      }
      return text.size() >= max_head_bytes ? HttpVerdict::too_large : HttpVerdict::need_more;
    }
    std::string_view line = text.substr(at, line_feed - at);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    at = line_feed + 1;
    if (line.find('\r') != std::string_view::npos) {
      why = "a CR not followed by LF";
      return HttpVerdict::malformed;
    }
    if (request_line) {
      if (!parse_request_line(line, head, why)) return HttpVerdict::malformed;
      continue;
    }
    if (line.empty()) break;
    if (++headers > max_headers) return HttpVerdict::too_large;
    if (!parse_header(line, head, framing, why)) return HttpVerdict::malformed;
  }
  head.head_bytes = at;
  if (framing.content_length && framing.transfer_encoding) {
    why = "both Content-Length and Transfer-Encoding";
    return HttpVerdict::malformed;
  }
  if (framing.transfer_encoding && head.version_minor == 0) {
    why = "Transfer-Encoding in an HTTP/1.0 request";  // RFC 9112 6.1: faulty framing
    return HttpVerdict::malformed;
  }
  head.chunked = framing.transfer_encoding;
  return HttpVerdict::complete;
}

std::vector<std::uint8_t> rewrite_http_request_head(std::span<const std::uint8_t> head_bytes,
                                                    const std::vector<std::string>& extra,
                                                    const std::vector<std::string>& replaced) {
  constexpr std::array<std::string_view, 4> kDropped = {"connection", "keep-alive",
                                                        "proxy-connection", "upgrade"};
  const std::string_view text = as_text(head_bytes);
  std::vector<std::uint8_t> out;
  out.reserve(text.size() + 32);
  const auto emit = [&](std::string_view line) {
    out.insert(out.end(), line.begin(), line.end());
    out.push_back('\r');
    out.push_back('\n');
  };
  std::size_t at = 0;
  for (bool request_line = true; at < text.size(); request_line = false) {
    const std::size_t line_feed = std::min(text.find('\n', at), text.size());
    std::string_view line = text.substr(at, line_feed - at);
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    at = line_feed + 1;
    if (line.empty()) break;  // the blank line: added back below, after the new headers
    const std::string_view name = line.substr(0, line.find(':'));
    if (!request_line &&
        std::any_of(kDropped.begin(), kDropped.end(),
                    [&](std::string_view dropped) { return equals_ignoring_case(name, dropped); }))
      continue;
    if (!request_line &&
        std::any_of(replaced.begin(), replaced.end(),
                    [&](const std::string& header) { return equals_ignoring_case(name, header); }))
      continue;
    emit(line);
  }
  emit("Connection: close");
  for (const std::string& header : extra) emit(header);
  emit("");
  return out;
}

HttpBodyFramer::HttpBodyFramer(const HttpRequestHead& head) : chunked_(head.chunked) {
  if (chunked_) {
    state_ = State::chunk_size;
  } else {
    left_ = head.content_length;
    done_ = left_ == 0;
  }
}

std::optional<std::size_t> HttpBodyFramer::feed(std::span<const std::uint8_t> bytes,
                                                std::string& why) {
  if (failed_) {
    why = "the body's chunk framing is already broken";
    return std::nullopt;
  }
  const auto fail = [&](const char* reason) -> std::optional<std::size_t> {
    failed_ = true;
    why = reason;
    return std::nullopt;
  };
  // The size line ends: its chunk's data follows, or after the last chunk the trailers.
  const auto end_size_line = [&] {
    state_ = left_ == 0 ? State::trailer_start : State::chunk_data;
    size_digits_ = 0;
  };
  std::size_t used = 0;
  while (used < bytes.size() && !done_) {
    const std::size_t available = bytes.size() - used;
    if (state_ == State::length || state_ == State::chunk_data) {
      const auto taken = static_cast<std::size_t>(std::min<std::uint64_t>(left_, available));
      used += taken;
      left_ -= taken;
      if (left_ == 0) {
        if (state_ == State::length)
          done_ = true;
        else
          state_ = State::chunk_data_cr;
      }
      continue;
    }
    const auto c = static_cast<char>(bytes[used]);
    const bool in_trailers = state_ == State::trailer_start || state_ == State::trailer_line ||
                             state_ == State::trailer_lf || state_ == State::final_lf;
    const bool control = c != '\t' && (static_cast<unsigned char>(c) < 0x20 || c == 0x7f);
    // The head goes upstream rewritten with CRLF, the body as it came: a bare LF in its framing
    // is one the upstream could take for a line end or not, so it is refused, not guessed.
    if (c == '\n' && state_ != State::chunk_size_lf && state_ != State::chunk_data_lf &&
        state_ != State::trailer_lf && state_ != State::final_lf)
      return fail("a line of the chunked body ended by LF alone");
    switch (state_) {
      case State::chunk_size: {
        const char digit = lower(c);
        const bool hex = is_digit(digit) || (digit >= 'a' && digit <= 'f');
        if (hex) {
          if (size_digits_ == kMaxChunkSizeDigits)
            return fail("a chunk size of more than 16 hex digits");
          left_ = left_ << 4 |
                  static_cast<std::uint64_t>(is_digit(digit) ? digit - '0' : digit - 'a' + 10);
          ++size_digits_;
          break;
        }
        if (size_digits_ == 0) return fail("a chunk without a hex size");
        if (c == ';' || c == ' ' || c == '\t') {
          state_ = State::chunk_ext;
          extension_bytes_ = 0;
          continue;  // the extension state takes this byte
        }
        if (c == '\r') {
          state_ = State::chunk_size_lf;
        } else {
          return fail("a chunk size that is not hex");
        }
        break;
      }
      case State::chunk_ext:
        if (c == '\r') {
          state_ = State::chunk_size_lf;
        } else if (control) {
          return fail("a control character in a chunk extension");
        } else if (++extension_bytes_ > kMaxChunkExtension) {
          return fail("a chunk extension longer than 4096 bytes");
        }
        break;
      case State::chunk_size_lf:
        if (c != '\n') return fail("a CR not followed by LF after a chunk size");
        end_size_line();
        break;
      case State::chunk_data_cr:
        if (c == '\r') {
          state_ = State::chunk_data_lf;
        } else {
          return fail("chunk data longer than its size");
        }
        break;
      case State::chunk_data_lf:
        if (c != '\n') return fail("chunk data longer than its size");
        state_ = State::chunk_size;
        break;
      case State::trailer_start:
        if (c == '\r') {
          state_ = State::final_lf;
        } else if (c == ' ' || c == '\t') {
          return fail("a folded trailer line (obs-fold)");
        } else if (control) {
          return fail("a control character in the trailers");
        } else {
          state_ = State::trailer_line;
        }
        break;
      case State::trailer_line:
        if (c == '\r') {
          state_ = State::trailer_lf;
        } else if (control) {
          return fail("a control character in the trailers");
        }
        break;
      case State::trailer_lf:
      case State::final_lf:
        if (c != '\n') return fail("a CR not followed by LF in the trailers");
        if (state_ == State::final_lf) done_ = true;
        state_ = State::trailer_start;
        break;
      case State::length:
      case State::chunk_data:
        break;  // taken above
    }
    ++used;
    if (in_trailers && ++trailer_bytes_ > kMaxTrailerBytes)
      return fail("trailers longer than 8192 bytes");
  }
  return used;
}

}  // namespace rlm::protocols
