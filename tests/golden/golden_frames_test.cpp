// The golden-frame corpus (tests/golden/README.md) through the C++ ends of the three protocols:
// the host's control channel (FrameDecoder, encode_frame), the server wire (receive_frame,
// encode_frame) and the repl's request lines (parse_repl_request). The same files go through the
// Python ends in test_golden_frames.py.
#include <gtest/gtest.h>
#include <sys/socket.h>

#include <chrono>
#include <cstddef>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <variant>

#include <nlohmann/json.hpp>

#include "host/unique_fd.hpp"
#include "repl/request.hpp"
#include "rlm_sandbox/error.hpp"
#include "server/remote_wire.hpp"
#include "server/wire.hpp"
#include "session/frame_decoder.hpp"
#include "support/subprocess.hpp"

namespace rlm::test {
namespace {

using nlohmann::json;

json corpus(const std::string& name) {
  std::ifstream in(source_path("tests/golden/" + name + ".json"));
  EXPECT_TRUE(in) << name;
  std::stringstream text;
  text << in.rdbuf();
  return json::parse(text.str());
}

// Whether the entry lists `side` in `list` (absent: both sides).
bool lists(const json& entry, const char* list, const char* side) {
  if (!entry.contains(list)) return true;
  for (const auto& item : entry[list])
    if (item == side) return true;
  return false;
}

std::string from_hex(const std::string& hex) {
  std::string bytes;
  for (std::size_t i = 0; i + 1 < hex.size(); i += 2)
    bytes.push_back(static_cast<char>(std::stoi(hex.substr(i, 2), nullptr, 16)));
  return bytes;
}

// A wire's segments joined: {"hex": ...} or {"utf8": ...}, each `times` times (default once).
std::string wire_bytes(const json& segments) {
  std::string bytes;
  for (const auto& segment : segments) {
    const std::string piece = segment.contains("hex") ? from_hex(segment["hex"].get<std::string>())
                                                      : segment["utf8"].get<std::string>();
    const std::size_t times = segment.value("times", std::size_t{1});
    for (std::size_t i = 0; i < times; ++i) bytes += piece;
  }
  return bytes;
}

// The message with each {"$repeat": text, "times": n} replaced by text repeated n times.
json expanded(const json& value) {
  if (value.is_object() && value.contains("$repeat")) {
    std::string text;
    for (std::size_t i = 0; i < value["times"].get<std::size_t>(); ++i)
      text += value["$repeat"].get<std::string>();
    return text;
  }
  if (!value.is_structured()) return value;
  json copy = value;
  for (auto& item : copy) item = expanded(item);
  return copy;
}

// The bytes through a FrameDecoder as a channel feeds it (never past want()); throws as next()
// does.
std::optional<json> decode_control(const std::string& bytes, std::uint64_t max_frame,
                                   std::size_t& frames) {
  session::FrameDecoder decoder(max_frame);
  std::optional<json> first;
  frames = 0;
  for (std::size_t at = 0; at < bytes.size();) {
    const std::size_t take = std::min(decoder.want(), bytes.size() - at);
    if (take == 0) break;  // broken: next() says why
    decoder.append(bytes.data() + at, take);
    at += take;
  }
  while (auto frame = decoder.next()) {
    if (frames++ == 0) first = std::move(frame);
  }
  return first;
}

// Each valid frame of a corpus through one side: decode(wire) gives its message, encode(message)
// gives its wire, each where the entry lists C++.
template <typename Decode, typename Encode>
void round_trip_valid_frames(const json& doc, const Decode& decode, const Encode& encode) {
  for (const auto& entry : doc["valid"]) {
    SCOPED_TRACE(entry["name"].get<std::string>());
    const std::string wire = wire_bytes(entry["wire"]);
    const json message = expanded(entry["message"]);
    if (lists(entry, "decoded_by", "cpp")) {
      const std::optional<json> decoded = decode(wire);
      ASSERT_TRUE(decoded.has_value());
      EXPECT_EQ(*decoded, message);
    }
    if (lists(entry, "encoded_by", "cpp")) {
      EXPECT_EQ(encode(message), wire);
    }
  }
}

TEST(GoldenFrames, ControlChannelValidFramesRoundTrip) {
  const json doc = corpus("control_channel");
  const auto max_frame = doc["max_frame"].get<std::uint64_t>();
  round_trip_valid_frames(
      doc,
      [&](const std::string& wire) {
        std::size_t frames = 0;
        auto decoded = decode_control(wire, max_frame, frames);
        EXPECT_EQ(frames, 1u);
        return decoded;
      },
      [](const json& message) {
        const auto encoded = session::encode_frame(message);
        return encoded.header + encoded.body;
      });
}

TEST(GoldenFrames, ControlChannelInvalidFramesAreRefused) {
  const json doc = corpus("control_channel");
  for (const auto& entry : doc["invalid"]) {
    if (!lists(entry, "refused_by", "cpp")) continue;
    SCOPED_TRACE(entry["name"].get<std::string>());
    std::size_t frames = 0;
    EXPECT_THROW(
        decode_control(wire_bytes(entry["wire"]), doc["max_frame"].get<std::uint64_t>(), frames),
        Error);
  }
}

// The wire's bytes written into one end of a socket pair (by a thread: a frame may be larger
// than the socket's buffer), then the end closed; receive_frame reads the other.
std::optional<server::Frame> receive_server(const std::string& wire, std::uint64_t max_frame) {
  int ends[2];
  if (socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, ends) != 0) throw Error("socketpair");
  host::UniqueFd reader(ends[0]), writer(ends[1]);
  std::thread writing([&] {
    std::size_t sent = 0;
    while (sent < wire.size()) {
      const ssize_t count =
          send(writer.get(), wire.data() + sent, wire.size() - sent, MSG_NOSIGNAL);
      if (count <= 0) break;  // the reader refused the frame and closed
      sent += static_cast<std::size_t>(count);
    }
    shutdown(writer.get(), SHUT_WR);
  });
  std::optional<server::Frame> frame;
  try {
    frame = server::receive_frame(reader.get(), server::Clock::now() + std::chrono::seconds(10),
                                  std::chrono::seconds(10), max_frame);
  } catch (...) {
    reader.reset();
    writing.join();
    throw;
  }
  reader.reset();
  writing.join();
  return frame;
}

TEST(GoldenFrames, ServerWireValidFramesRoundTrip) {
  const json doc = corpus("server_wire");
  const auto max_frame = doc["max_frame"].get<std::uint64_t>();
  round_trip_valid_frames(
      doc,
      [&](const std::string& wire) -> std::optional<json> {
        auto frame = receive_server(wire, max_frame);
        if (!frame) return std::nullopt;
        return std::move(frame->message);
      },
      [](const json& message) { return server::encode_frame(message); });
}

// The wire over TLS (remote_wire.hpp): a data frame's bytes decode to what the corpus says, and
// those bytes encode to the very frame; each "streams" entry names a kind.
TEST(GoldenFrames, ServerWireStreamFramesCarryTheirBytes) {
  const json doc = corpus("server_wire");
  std::size_t data_frames = 0, stream_lists = 0;
  for (const auto& entry : doc["valid"]) {
    const json& message = entry["message"];
    if (entry.contains("stream_bytes_hex")) {
      ++data_frames;
      const std::string bytes = from_hex(entry["stream_bytes_hex"].get<std::string>());
      EXPECT_EQ(server::data_of(message), bytes) << entry["name"];
      EXPECT_EQ(server::data_frame(server::stream_of(message), bytes), message) << entry["name"];
    }
    if (message.contains("streams")) {
      ++stream_lists;
      const auto kinds =
          server::stream_kinds_of(message["op"].get<std::string>(), message["streams"].size());
      ASSERT_TRUE(kinds) << entry["name"];
      for (std::size_t i = 0; i < kinds->size(); ++i)
        EXPECT_EQ(message["streams"][i]["kind"], std::string(server::to_string((*kinds)[i])))
            << entry["name"];
    }
  }
  EXPECT_GE(data_frames, 2u);
  EXPECT_GE(stream_lists, 2u);
}

TEST(GoldenFrames, ServerWireInvalidFramesAreRefused) {
  const json doc = corpus("server_wire");
  for (const auto& entry : doc["invalid"]) {
    if (!lists(entry, "refused_by", "cpp")) continue;
    SCOPED_TRACE(entry["name"].get<std::string>());
    EXPECT_THROW(receive_server(wire_bytes(entry["wire"]), doc["max_frame"].get<std::uint64_t>()),
                 server::WireError);
  }
}

const char* op_name(repl::ReplOp op) {
  // Indexed by ReplOp, in its order; the last is the last enumerator.
  static constexpr const char* kNames[] = {
      "execute",     "llm_result",  "snapshot",       "restore", "close", "context",
      "add_context", "add_history", "narrow_network", "save",    "load"};
  static_assert(std::size(kNames) == static_cast<std::size_t>(repl::ReplOp::load) + 1);
  const auto index = static_cast<std::size_t>(op);
  return index < std::size(kNames) ? kNames[index] : "?";
}

// A checked request as the line that states it: the fields the op took, defaults left out.
json as_line(const repl::ReplRequest& request) {
  json line = json::object();
  if (!request.id.is_null()) line["id"] = request.id;
  line["op"] = op_name(request.op);
  switch (request.op) {
    case repl::ReplOp::execute:
      line["code"] = request.code;
      if (request.timeout) line["timeout_ms"] = request.timeout->count();
      if (request.locals) line["locals"] = true;
      if (request.fetch) line["fetch"] = *request.fetch;
      break;
    case repl::ReplOp::llm_result:
      line["query_id"] = request.query_id;
      if (request.text) line["text"] = *request.text;
      if (request.error) line["error"] = *request.error;
      if (request.value) line["value"] = *request.value;
      break;
    case repl::ReplOp::add_context:
      if (request.context_file.empty())
        line["context"] = request.context;
      else
        line["context_file"] = request.context_file;
      if (request.context_json) line["json"] = true;
      if (request.index) line["index"] = *request.index;
      break;
    case repl::ReplOp::add_history:
      if (request.context_file.empty())
        line["history"] = request.context;
      else
        line["history_file"] = request.context_file;  // its JSON: context_json is implied
      if (request.index) line["index"] = *request.index;
      break;
    case repl::ReplOp::restore:
      line["snapshot"] = request.snapshot;
      break;
    case repl::ReplOp::narrow_network:
      line["allow"] = request.allow;
      break;
    case repl::ReplOp::save:
    case repl::ReplOp::load:
      line["path"] = request.path;
      break;
    case repl::ReplOp::context:
      line["context"] = request.context;
      break;
    case repl::ReplOp::snapshot:
    case repl::ReplOp::close:
      break;
  }
  return line;
}

repl::ReplInputLimits repl_limits(const json& doc) {
  repl::ReplInputLimits limits;
  limits.max_timeout = std::chrono::milliseconds(doc["max_timeout_ms"].get<std::int64_t>());
  return limits;
}

TEST(GoldenFrames, ReplLinesParseToTheirRequests) {
  const json doc = corpus("repl_lines");
  for (const auto& entry : doc["valid"]) {
    SCOPED_TRACE(entry["name"].get<std::string>());
    const auto parsed =
        repl::parse_repl_request(entry["line"].get<std::string>(), repl_limits(doc));
    const auto* request = std::get_if<repl::ReplRequest>(&parsed);
    ASSERT_NE(request, nullptr) << std::get<repl::ReplRequestError>(parsed).message;
    EXPECT_EQ(as_line(*request), entry["request"]);
  }
}

TEST(GoldenFrames, ReplInvalidLinesAreRefusedWithTheirId) {
  const json doc = corpus("repl_lines");
  for (const auto& entry : doc["invalid"]) {
    if (!lists(entry, "refused_by", "cpp")) continue;
    SCOPED_TRACE(entry["name"].get<std::string>());
    const auto parsed =
        repl::parse_repl_request(entry["line"].get<std::string>(), repl_limits(doc));
    const auto* error = std::get_if<repl::ReplRequestError>(&parsed);
    ASSERT_NE(error, nullptr);
    EXPECT_EQ(error->id, entry["error_id"]);
    EXPECT_FALSE(error->message.empty());
  }
}

}  // namespace
}  // namespace rlm::test
