#include "session/frame_decoder.hpp"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <cassert>
#include <cstring>
#include <vector>

#include "rlm_sandbox/error.hpp"
#include "rlm_sandbox/units.hpp"

namespace rlm::session {
namespace {

using nlohmann::json;

constexpr std::size_t kLargeFrame = 1u << 20;

// Builds the DOM from nlohmann's SAX events (its parser keeps its own state on a heap stack, never
// recursing), counting the depth and the values as it goes: the parse stops at the first object or
// array past the depth bound, or the first value past the count, so nothing deeper or larger is
// ever built. Strings are moved out of the lexer, not copied: a frame
// holding one large prompt costs the frame and the prompt, not a third copy.
class BoundedDomBuilder {
 public:
  BoundedDomBuilder(json& root, std::size_t max_depth, std::size_t max_values)
      : root_(root), max_(max_depth), max_values_(max_values) {}

  bool null() { return place(json(nullptr)); }
  bool boolean(bool value) { return place(json(value)); }
  bool number_integer(json::number_integer_t value) { return place(json(value)); }
  bool number_unsigned(json::number_unsigned_t value) { return place(json(value)); }
  bool number_float(json::number_float_t value, const json::string_t&) {
    return place(json(value));
  }
  bool string(json::string_t& value) { return place(json(std::move(value))); }
  bool binary(json::binary_t& value) { return place(json::binary(std::move(value))); }
  bool start_object(std::size_t) { return open(json::object()); }
  bool key(json::string_t& name) {
    slot_ = &stack_.back()->get_ref<json::object_t&>()[std::move(name)];  // the last one wins
    return true;
  }
  bool end_object() {
    stack_.pop_back();
    return true;
  }
  bool start_array(std::size_t) { return open(json::array()); }
  bool end_array() {
    stack_.pop_back();
    return true;
  }
  bool parse_error(std::size_t, const std::string&, const nlohmann::detail::exception&) {
    invalid_ = true;
    return false;
  }

  bool too_deep() const { return too_deep_; }
  bool too_many() const { return too_many_; }
  bool invalid() const { return invalid_; }

 private:
  // Puts `value` where the next value goes; its address (stable until its container grows,
  // which happens only after it is closed) in `last_`.
  bool place(json&& value) {
    if (++values_ > max_values_) {
      too_many_ = true;
      return false;
    }
    if (stack_.empty()) {
      root_ = std::move(value);
      last_ = &root_;
    } else if (auto& top = *stack_.back(); top.is_array()) {
      auto& items = top.get_ref<json::array_t&>();
      items.push_back(std::move(value));
      last_ = &items.back();
    } else {
      *slot_ = std::move(value);
      last_ = slot_;
    }
    return true;
  }
  bool open(json&& container) {
    if (stack_.size() >= max_) {
      too_deep_ = true;
      return false;
    }
    if (!place(std::move(container))) return false;
    stack_.push_back(last_);
    return true;
  }

  json& root_;
  std::size_t max_;
  std::size_t max_values_;
  std::size_t values_ = 0;
  std::vector<json*> stack_;  // the open objects and arrays, outermost first
  json* slot_ = nullptr;      // the member the last key named
  json* last_ = nullptr;
  bool too_deep_ = false, too_many_ = false, invalid_ = false;
};

std::uint32_t header_length(const std::string& frame) {
  std::uint32_t length = 0;
  for (std::size_t i = 0; i < FrameDecoder::kHeader; ++i)
    length = (length << 8) | static_cast<unsigned char>(frame[i]);
  return length;
}

// Strict UTF-8 (no overlong forms, surrogates or code points past U+10FFFF), what the JSON parser
// takes in a string; 32 ASCII bytes at a time, so bulk text is checked at memory speed.
bool is_utf8(std::string_view text) {
  const auto* bytes = reinterpret_cast<const unsigned char*>(text.data());
  const std::size_t size = text.size();
  std::size_t i = 0;
  constexpr std::uint64_t kHighBits = 0x8080808080808080ull;
  while (i < size) {
    if (i + 32 <= size) {
      std::uint64_t words[4];
      std::memcpy(words, bytes + i, sizeof words);
      if (((words[0] | words[1] | words[2] | words[3]) & kHighBits) == 0) {
        i += 32;
        continue;
      }
    }
    const unsigned char lead = bytes[i];
    if (lead < 0x80) {
      ++i;
      continue;
    }
    std::size_t length;
    unsigned char low = 0x80, high = 0xbf;  // the second byte's range
    if (lead >= 0xc2 && lead <= 0xdf) {
      length = 2;
    } else if (lead >= 0xe0 && lead <= 0xef) {
      length = 3;
      if (lead == 0xe0) low = 0xa0;
      if (lead == 0xed) high = 0x9f;  // no surrogates
    } else if (lead >= 0xf0 && lead <= 0xf4) {
      length = 4;
      if (lead == 0xf0) low = 0x90;
      if (lead == 0xf4) high = 0x8f;
    } else {
      return false;
    }
    if (i + length > size || bytes[i + 1] < low || bytes[i + 1] > high) return false;
    for (std::size_t k = 2; k < length; ++k)
      if ((bytes[i + k] & 0xc0) != 0x80) return false;
    i += length;
  }
  return true;
}

bool is_placeholder(const json& value) {
  return value.is_object() && value.size() == 1 && value.begin().key() == "$bulk";
}

// Puts the bulk strings where the frame's placeholders are: each exactly once.
void take_bulk(json& frame, std::vector<std::string>& bulk) {
  const auto count = frame.find("bulk");
  if (count == frame.end() || !count->is_number_unsigned() ||
      count->get<std::uint64_t>() != bulk.size())
    throw Error("the sandbox sent " + std::to_string(bulk.size()) +
                " bulk frames before a frame that does not announce them");
  frame.erase(count);
  std::vector<bool> taken(bulk.size(), false);
  std::size_t placed = 0;
  const auto place = [&](json& value) {
    if (!is_placeholder(value)) return;
    const auto& index = value.begin().value();
    if (!index.is_number_unsigned() || index.get<std::uint64_t>() >= bulk.size() ||
        taken[index.get<std::size_t>()])
      throw Error("the sandbox sent a frame whose bulk placeholders do not match its bulk frames");
    const auto at = index.get<std::size_t>();
    taken[at] = true;
    ++placed;
    bulk[at].erase(0, FrameDecoder::kHeader);
    if (!is_utf8(bulk[at]))
      throw Error("the sandbox sent a bulk string of " + format_size(bulk[at].size()) +
                  " that is not UTF-8");
    value = std::move(bulk[at]);
  };
  for (auto& [name, value] : frame.items()) {
    if (value.is_array())
      for (auto& item : value) place(item);
    else
      place(value);
  }
  if (placed != bulk.size())
    throw Error("the sandbox sent a frame whose bulk placeholders do not match its bulk frames");
}

}  // namespace

std::uint32_t FrameDecoder::body_length() const {
  return header_length(partial_) & ~kBulkBit;
}

void FrameDecoder::refuse(std::string why) {
  if (broken_.empty()) broken_ = std::move(why);
}

std::size_t FrameDecoder::want() const {
  if (!broken_.empty()) return 0;
  if (partial_.size() < kHeader) return kHeader - partial_.size();
  return kHeader + body_length() - partial_.size();
}

std::size_t FrameDecoder::frame_wants() const {
  if (!partial_.empty()) return want();
  return bulk_.empty() || !broken_.empty() ? 0 : kHeader;
}

void FrameDecoder::append(const char* data, std::size_t size) {
  assert(size <= want());
  const bool had_header = partial_.size() >= kHeader;
  partial_.append(data, size);
  buffered_ += size;
  if (partial_.size() < kHeader) return;
  const bool bulk = (header_length(partial_) & kBulkBit) != 0;
  const std::uint32_t length = body_length();
  if (!had_header) {
    // The cap is on the JSON frame's body and its bulk frames' bodies together.
    if (bulk_body_bytes_ + length > max_frame_) {
      refuse("the sandbox sent a frame of " + format_size(bulk_body_bytes_ + length) +
             ", over the limit of " + format_size(max_frame_));
      return;  // want() stops the reads; next() says why
    }
    if (bulk && bulk_.size() >= kMaxBulkFrames) {
      refuse("the sandbox sent more than " + std::to_string(kMaxBulkFrames) +
             " bulk frames before one frame");
      return;
    }
    // The body's room is taken once, at its declared size (capped above): no doubling while it
    // fills. Pages not yet written cost no memory.
    partial_.reserve(kHeader + length);
  }
  if (partial_.size() < kHeader + length) return;
  if (bulk) {
    bulk_bytes_ += partial_.size();
    bulk_body_bytes_ += length;
    bulk_.push_back(std::move(partial_));
  } else {
    complete_frames_ += 1 + bulk_.size();
    complete_.push_back({std::move(bulk_), std::move(partial_)});
    bulk_ = {};
    bulk_bytes_ = bulk_body_bytes_ = 0;
  }
  partial_ = std::string();
}

std::optional<json> FrameDecoder::next() {
  if (complete_.empty()) {
    if (!broken_.empty()) {
      ++taken_;
      throw Error(broken_);
    }
    return std::nullopt;
  }
  Group group = std::move(complete_.front());
  complete_.pop_front();
  std::uint64_t bytes = group.frame.size();
  for (const auto& frame : group.bulk) bytes += frame.size();
  buffered_ -= bytes;
  complete_frames_ -= 1 + group.bulk.size();
  taken_ += 1 + group.bulk.size();
  auto frame = parse_frame_body(std::string_view(group.frame).substr(kHeader));
  if (!group.bulk.empty()) take_bulk(frame, group.bulk);
  if (bytes >= kLargeFrame) {
    // The frame and the parser's buffers were large: give their pages back now, so that a
    // sandbox sending large frames does not leave the host's heap fragmented and resident.
    std::string().swap(group.frame);
#ifdef __GLIBC__
    malloc_trim(0);
#endif
  }
  return frame;
}

json parse_frame_body(std::string_view body, std::size_t max_depth, std::size_t max_values) {
  json frame;
  BoundedDomBuilder parser(frame, max_depth, max_values);
  json::sax_parse(body.begin(), body.end(), &parser);
  if (parser.too_deep())
    throw Error("the sandbox sent a frame of " + format_size(body.size()) + " nested deeper than " +
                std::to_string(max_depth) + " levels");
  if (parser.too_many())
    throw Error("the sandbox sent a frame of " + format_size(body.size()) + " holding more than " +
                std::to_string(max_values) + " JSON values");
  if (parser.invalid())
    throw Error("the sandbox sent a frame of " + format_size(body.size()) +
                " that is not valid JSON");
  if (!frame.is_object())
    throw Error("the sandbox sent a frame of " + format_size(body.size()) +
                " that is not a JSON object");
  return frame;
}

EncodedFrame encode_frame(const json& message) {
  EncodedFrame frame{std::string(FrameDecoder::kHeader, '\0'),
                     message.dump(-1, ' ', false, json::error_handler_t::replace)};
  const auto length = static_cast<std::uint32_t>(frame.body.size());
  for (std::size_t i = 0; i < FrameDecoder::kHeader; ++i)
    frame.header[i] = static_cast<char>((length >> (8 * (FrameDecoder::kHeader - 1 - i))) & 0xff);
  return frame;
}

std::string describe_frame(const json& frame) {
  constexpr std::size_t kShown = 40;
  if (!frame.is_object()) return std::string("a ") + frame.type_name();
  std::string words = "an object of " + std::to_string(frame.size()) + " fields";
  const auto type = frame.find("type");
  if (type == frame.end() || !type->is_string()) return words + " without a type";
  const auto& name = type->get_ref<const std::string&>();
  const bool printable = std::all_of(name.begin(), name.end(), [](char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  });
  if (!printable || name.empty() || name.size() > kShown)
    return words + " whose type is a string of " + std::to_string(name.size()) + " bytes";
  return "\"" + name + "\" (" + words + ")";
}

}  // namespace rlm::session
