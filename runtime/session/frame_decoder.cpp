#include "session/frame_decoder.hpp"

#ifdef __GLIBC__
#include <malloc.h>
#endif

#include <algorithm>
#include <cassert>
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

}  // namespace

std::size_t FrameDecoder::want() const {
  if (partial_.size() < kHeader) return kHeader - partial_.size();
  const std::uint32_t length = header_length(partial_);
  if (length > max_frame_) return 0;
  return kHeader + length - partial_.size();
}

void FrameDecoder::append(const char* data, std::size_t size) {
  assert(size <= want());
  const bool had_header = partial_.size() >= kHeader;
  partial_.append(data, size);
  buffered_ += size;
  if (partial_.size() < kHeader) return;
  const std::uint32_t length = header_length(partial_);
  if (length > max_frame_) return;  // next() refuses it; want() stops the reads
  // The body's room is taken once, at its declared size (capped above): no doubling while it
  // fills. Pages not yet written cost no memory.
  if (!had_header) partial_.reserve(kHeader + length);
  if (partial_.size() < kHeader + length) return;
  complete_.push_back(std::move(partial_));
  partial_ = std::string();
}

std::optional<json> FrameDecoder::next() {
  if (complete_.empty()) {
    if (partial_.size() >= kHeader && header_length(partial_) > max_frame_) {
      ++taken_;
      throw Error("the sandbox sent a frame of " + format_size(header_length(partial_)) +
                  ", over the limit of " + format_size(max_frame_));
    }
    return std::nullopt;
  }
  std::string whole = std::move(complete_.front());
  complete_.pop_front();
  buffered_ -= whole.size();
  ++taken_;
  auto frame = parse_frame_body(std::string_view(whole).substr(kHeader));
  if (whole.size() >= kLargeFrame) {
    // The frame and the parser's buffers were large: give their pages back now, so that a
    // sandbox sending large frames does not leave the host's heap fragmented and resident.
    std::string().swap(whole);
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
