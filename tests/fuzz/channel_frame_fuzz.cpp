// libFuzzer harness for the control channel's frame decoder (runtime/session/frame_decoder.hpp):
// the bytes a hostile sandbox could send on its channel, fed the way Channel::receive feeds them
// (never more than want() at a time, in reads of varying size), every frame taken, described and
// re-serialised as the session would. Any crash, leak, sanitizer report or recursion deeper than
// the frame depth bound is a finding. Seed corpus: tests/fuzz/corpus/channel_frame/.
#include <cstddef>
#include <cstdint>
#include <string>

#include "rlm_sandbox/error.hpp"
#include "session/frame_decoder.hpp"

namespace {

// The session's frame cap is 16 MiB; a smaller one here lets the fuzzer reach the oversize path
// with short inputs.
constexpr std::uint64_t kMaxFrame = 1 << 16;

void take_all(rlm::session::FrameDecoder& decoder) {
  for (;;) {
    try {
      auto frame = decoder.next();
      if (!frame) return;
      // What the session does with a frame it did not expect, and what it sends back.
      (void)rlm::session::describe_frame(*frame);
      (void)frame->dump(-1, ' ', false, nlohmann::json::error_handler_t::replace);
    } catch (const rlm::Error&) {
      return;  // the session ends here
    }
  }
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const std::uint8_t* data, std::size_t size) {
  if (size == 0) return 0;
  // The first byte picks the read size (1..256 bytes, or as much as wanted).
  const std::size_t step = data[0] == 0 ? SIZE_MAX : data[0];
  const char* bytes = reinterpret_cast<const char*>(data + 1);
  const std::size_t length = size - 1;

  rlm::session::FrameDecoder decoder(kMaxFrame);
  for (std::size_t at = 0; at < length;) {
    std::size_t want = decoder.want();
    if (want == 0) break;  // a broken stream: next() says why
    if (want > step) want = step;
    if (want > length - at) want = length - at;
    decoder.append(bytes + at, want);
    at += want;
    take_all(decoder);
  }
  take_all(decoder);

  // The body parser on its own, on the whole input.
  try {
    (void)rlm::session::parse_frame_body(std::string_view(bytes, length));
  } catch (const rlm::Error&) {
  }
  return 0;
}
