#include "server/remote_wire.hpp"

#include <openssl/evp.h>

#include <algorithm>
#include <array>

#include "session/frame_decoder.hpp"

namespace rlm::server {

using nlohmann::json;

std::string_view to_string(StreamKind kind) {
  switch (kind) {
    case StreamKind::in:
      return "in";
    case StreamKind::out:
      return "out";
    case StreamKind::file_in:
      return "file_in";
    case StreamKind::file_out:
      return "file_out";
  }
  return "in";
}

std::optional<StreamKind> stream_kind_named(std::string_view name) {
  for (const StreamKind kind :
       {StreamKind::in, StreamKind::out, StreamKind::file_in, StreamKind::file_out})
    if (to_string(kind) == name) return kind;
  return std::nullopt;
}

std::optional<std::vector<StreamKind>> stream_kinds_of(std::string_view op, std::size_t count) {
  std::vector<StreamKind> kinds;
  if (op == "run")
    kinds = {StreamKind::in, StreamKind::out, StreamKind::out};
  else if (op == "session_open" || op == "add_context")
    kinds = {StreamKind::in};
  else if (op == "save")
    kinds = {StreamKind::file_out};
  else if (op == "load")
    kinds = {StreamKind::file_in};
  if (count == 0 && op != "run") return std::vector<StreamKind>{};
  if (kinds.size() != count) return std::nullopt;
  return kinds;
}

json data_frame(std::uint32_t stream, std::string_view bytes) {
  std::string text(4 * ((bytes.size() + 2) / 3), '\0');
  const int length = EVP_EncodeBlock(reinterpret_cast<unsigned char*>(text.data()),
                                     reinterpret_cast<const unsigned char*>(bytes.data()),
                                     static_cast<int>(bytes.size()));
  text.resize(static_cast<std::size_t>(length));
  return {{"op", "data"}, {"stream", stream}, {"data", std::move(text)}};
}

json eof_frame(std::uint32_t stream) {
  return {{"op", "eof"}, {"stream", stream}};
}

std::uint32_t stream_of(const json& frame) {
  const auto id = frame.find("stream");
  if (id == frame.end() || !id->is_number_unsigned() || id->get<std::uint64_t>() > 0x7fffffffu)
    throw WireError("a data or eof frame without a stream id");
  return static_cast<std::uint32_t>(id->get<std::uint64_t>());
}

std::string data_of(const json& frame) {
  const auto data = frame.find("data");
  if (data == frame.end() || !data->is_string())
    throw WireError("a data frame without \"data\" (base64)");
  const std::string& text = data->get_ref<const std::string&>();
  if (text.size() % 4 != 0 || text.size() > 4 * (kStreamChunk / 3 + 1))
    throw WireError("a data frame's \"data\" is not base64 of at most 48 KiB");
  std::string bytes(text.size() / 4 * 3, '\0');
  const int length = EVP_DecodeBlock(reinterpret_cast<unsigned char*>(bytes.data()),
                                     reinterpret_cast<const unsigned char*>(text.data()),
                                     static_cast<int>(text.size()));
  if (length < 0) throw WireError("a data frame's \"data\" is not base64");
  std::size_t padding = 0;  // EVP_DecodeBlock counts '=' padding as zero bytes
  if (!text.empty() && text.back() == '=') ++padding;
  if (text.size() > 1 && text[text.size() - 2] == '=') ++padding;
  bytes.resize(static_cast<std::size_t>(length) - padding);
  return bytes;
}

std::uint64_t TlsFrameReader::announced_length() const {
  const auto* header = reinterpret_cast<const unsigned char*>(buffer_.data() + start_);
  const std::uint64_t length =
      (std::uint64_t{header[0]} << 24) | (header[1] << 16) | (header[2] << 8) | header[3];
  if (length > max_bytes_)
    throw WireError("a frame of " + std::to_string(length) + " bytes is over the limit of " +
                    std::to_string(max_bytes_));
  return length;
}

bool TlsFrameReader::fill(TlsStream& stream, const std::function<void(std::string_view)>& pass) {
  compact();
  std::array<char, 64u << 10> chunk;
  for (;;) {
    if (passing_ == 0 && held() >= 4) {
      const std::uint64_t length = announced_length();
      if (pass && length > kMaxStreamFrame) {  // passed on as it comes, never held whole
        const auto have = static_cast<std::size_t>(std::min<std::uint64_t>(held(), 4 + length));
        pass(std::string_view(buffer_.data() + start_, have));
        start_ += have;
        passing_ = 4 + length - have;
        compact();
        continue;
      }
      if (!reserved_ && account_.budget && length > kUnbudgetedFrameBytes) {
        reservation_ = account_.budget->reserve(account_.uid, length);
        reserved_ = true;
      }
      if (held() >= 4 + length) return true;  // a whole frame is here: next() takes it
      if (buffer_.capacity() < start_ + 4 + length) buffer_.reserve(start_ + 4 + length);
    }
    const auto got = stream.read_some(chunk.data(), chunk.size());
    if (!got) {
      if (held() != 0 || passing_ != 0) throw WireError("the connection ended inside a frame");
      return false;
    }
    if (*got == 0) return true;
    std::string_view bytes(chunk.data(), *got);
    if (passing_ > 0) {
      const auto now = static_cast<std::size_t>(std::min<std::uint64_t>(passing_, bytes.size()));
      pass(bytes.substr(0, now));
      passing_ -= now;
      bytes.remove_prefix(now);
    }
    buffer_.append(bytes);
  }
}

std::optional<json> TlsFrameReader::next() {
  if (held() < 4) return std::nullopt;
  const std::uint64_t length = announced_length();
  if (held() < 4 + length) return std::nullopt;
  json message;
  try {
    message = session::parse_frame_body(std::string_view(buffer_.data() + start_ + 4, length));
  } catch (const Error& error) {
    throw WireError(error.what());
  }
  start_ += 4 + length;
  reservation_ = FrameBudget::Reservation();
  reserved_ = false;
  if (start_ == buffer_.size() && buffer_.capacity() > (1u << 20)) compact();  // its memory back
  const auto op = message.find("op");
  if (op == message.end() || !op->is_string()) throw WireError("a frame without a string \"op\"");
  return message;
}

void TlsFrameReader::compact() {
  if (start_ == 0) return;
  buffer_.erase(0, start_);
  start_ = 0;
  if (buffer_.empty() && buffer_.capacity() > (1u << 20)) {
    std::string().swap(buffer_);  // a large frame's memory back
  }
}

void send_tls_frame(TlsStream& stream, const json& message, Clock::time_point deadline) {
  stream.write_all(encode_frame(message), deadline);
}

}  // namespace rlm::server

namespace rlm::server {

void FrameOutbox::add(TlsStream& stream, const json& message, Clock::time_point deadline) {
  held_ += encode_frame(message);
  if (held_.size() > (256u << 10)) flush(stream, deadline);
}

void FrameOutbox::flush(TlsStream& stream, Clock::time_point deadline) {
  if (held_.empty()) return;
  std::string bytes;
  bytes.swap(held_);
  stream.write_all(bytes, deadline);
}

int poll_after_flush(std::vector<pollfd>& fds, int timeout_ms, FrameOutbox& outbox,
                     TlsStream& stream, Clock::time_point flush_deadline) {
  if (!outbox.empty()) {
    const int ready = poll(fds.data(), fds.size(), 0);
    if (ready != 0) return ready;
    outbox.flush(stream, flush_deadline);
  }
  return poll(fds.data(), fds.size(), timeout_ms);
}

}  // namespace rlm::server
