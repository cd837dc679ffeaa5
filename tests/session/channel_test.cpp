// The control channel's host end on its own: the frame decoder (caps, depth, errors that never
// quote the sandbox) and the Channel over a real socketpair (fds, non-blocking writes).
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <string>
#include <vector>

#include "host/unique_fd.hpp"
#include "rlm_sandbox/error.hpp"
#include "rlm_sys/sys.hpp"
#include "session/channel.hpp"
#include "session/frame_decoder.hpp"
#include "support/host_probes.hpp"

namespace rlm::session {
namespace {

using host::UniqueFd;
using nlohmann::json;

std::string framed(const std::string& body) {
  std::string frame(4, '\0');
  const auto length = static_cast<std::uint32_t>(body.size());
  for (int i = 0; i < 4; ++i) frame[i] = static_cast<char>((length >> (8 * (3 - i))) & 0xff);
  return frame + body;
}

// Feeds `bytes` the way Channel::receive does: never more than want() at a time.
void feed(FrameDecoder& decoder, const std::string& bytes, std::size_t step = 1 << 20) {
  for (std::size_t at = 0; at < bytes.size();) {
    const std::size_t size = std::min({decoder.want(), step, bytes.size() - at});
    ASSERT_GT(size, 0u);
    decoder.append(bytes.data() + at, size);
    at += size;
  }
}

std::string nested(std::size_t depth) {
  return "{\"type\": \"x\", \"v\": " + std::string(depth - 1, '[') + std::string(depth - 1, ']') +
         "}";
}

// What the decoder says of `bytes` (a stream of frames), or "" when it takes them.
std::string stream_error_of(const std::string& bytes, std::uint64_t max_frame = 1 << 20) {
  FrameDecoder decoder(max_frame);
  feed(decoder, bytes);
  try {
    decoder.next();
  } catch (const Error& error) {
    return error.what();
  }
  return "";
}

std::string error_of(const std::string& body, std::uint64_t max_frame = 1 << 20) {
  return stream_error_of(framed(body), max_frame);
}

TEST(FrameDecoder, FramesSplitAnywhereComeOutWhole) {
  FrameDecoder decoder(1 << 20);
  const std::string stream = framed(R"({"type": "a", "n": 1})") + framed(R"({"type": "b"})");
  feed(decoder, stream, 1);
  auto first = decoder.next();
  ASSERT_TRUE(first);
  EXPECT_EQ((*first)["n"], 1);
  auto second = decoder.next();
  ASSERT_TRUE(second);
  EXPECT_EQ((*second)["type"], "b");
  EXPECT_FALSE(decoder.next());
  EXPECT_EQ(decoder.buffered(), 0u);
  EXPECT_EQ(decoder.frames_taken(), 2u);
}

TEST(FrameDecoder, NoReadCrossesAFrameBoundary) {
  FrameDecoder decoder(1 << 20);
  EXPECT_EQ(decoder.want(), 4u);
  feed(decoder, framed(R"({"type": "a"})").substr(0, 4));
  EXPECT_EQ(decoder.want(), std::string(R"({"type": "a"})").size());
}

TEST(FrameDecoder, NestingIsBoundedAt64Levels) {
  EXPECT_EQ(error_of(nested(64)), "");
  EXPECT_NE(error_of(nested(65)).find("nested deeper than 64 levels"), std::string::npos);
  // Two million levels: refused as soon as level 65 opens, without recursion.
  const std::string deep = std::string(2'000'000, '[') + std::string(2'000'000, ']');
  const auto error = error_of("{\"type\": \"x\", \"v\": " + deep + "}", 16 << 20);
  EXPECT_NE(error.find("nested deeper than"), std::string::npos);
  EXPECT_LT(error.size(), 200u);
  // Brackets inside strings are text.
  EXPECT_EQ(error_of("{\"type\": \"" + std::string(1000, '[') + "\"}"), "");
}

// A frame's parsed value costs the host up to ~100 bytes per value however few bytes the value
// took (`{}`): the count is bounded while parsing, like the depth.
TEST(FrameDecoder, ValuesAreBoundedAt100000) {
  const auto holding = [](std::size_t values, const std::string& each) {
    std::string body = "{\"type\": \"x\", \"v\": [";  // the object, "x" and the array: 3
    for (std::size_t i = 3; i < values; ++i) body += (i > 3 ? "," : "") + each;
    return body + "]}";
  };
  for (const std::string each : {"{}", "[]", "0", "\"\"", "null"}) {
    EXPECT_EQ(error_of(holding(kMaxFrameValues, each), 16 << 20), "") << each;
    const auto error = error_of(holding(kMaxFrameValues + 1, each), 16 << 20);
    EXPECT_NE(error.find("more than 100000 JSON values"), std::string::npos) << each << error;
  }
  // Five million empty objects in a 15 MiB frame: refused at the 100,001st.
  std::string body = "{\"type\": \"x\", \"v\": [{}";
  for (int i = 1; i < 5'000'000; ++i) body += ",{}";
  EXPECT_NE(error_of(body + "]}", 16 << 20).find("JSON values"), std::string::npos);
}

TEST(FrameDecoder, ErrorsSayWhatWasWrongWithoutQuotingIt) {
  const std::string secret = "SECRET-CONTENT";
  EXPECT_NE(error_of("{\"" + secret).find("not valid JSON"), std::string::npos);
  EXPECT_EQ(error_of("{\"" + secret).find(secret), std::string::npos);
  EXPECT_NE(error_of("[\"" + secret + "\"]").find("not a JSON object"), std::string::npos);
  EXPECT_NE(error_of("\xff\xfe").find("not valid JSON"), std::string::npos);
  EXPECT_NE(error_of("{\"a\": \"\xc3\"}").find("not valid JSON"), std::string::npos);
}

// The decoder's stream is broken by an oversize frame: next() says so.
void expect_over_the_limit(FrameDecoder& decoder) {
  try {
    decoder.next();
    ADD_FAILURE() << "an oversize frame was taken";
  } catch (const Error& error) {
    EXPECT_NE(std::string(error.what()).find("over the limit"), std::string::npos);
  }
}

TEST(FrameDecoder, AnOversizeLengthStopsTheStream) {
  FrameDecoder decoder(1000);
  feed(decoder, std::string("\x00\x00\x03\xe9", 4));  // 1001
  EXPECT_EQ(decoder.want(), 0u);
  expect_over_the_limit(decoder);
}

std::string bulk_framed(const std::string& bytes) {
  std::string frame = framed(bytes);
  frame[0] = static_cast<char>(static_cast<unsigned char>(frame[0]) | 0x80);
  return frame;
}

TEST(FrameDecoder, BulkFramesTakeTheirPlaceholdersInTheFrameAfterThem) {
  FrameDecoder decoder(1 << 20);
  const std::string big(100'000, 'p');
  const std::string accented = "caf\xc3\xa9 \xf0\x9f\x99\x82";
  feed(decoder, bulk_framed(big) + bulk_framed(accented) +
                    framed(R"({"type": "llm_query_batched", "bulk": 2,)"
                           R"( "prompts": ["small", {"$bulk": 1}, {"$bulk": 0}],)"
                           R"( "model": {"$bulk": 7, "other": 1}})"));
  EXPECT_EQ(decoder.frames_started(), 3u);
  const auto frame = decoder.next();
  ASSERT_TRUE(frame);
  EXPECT_EQ(decoder.frames_taken(), 3u);
  EXPECT_FALSE(frame->contains("bulk"));
  EXPECT_EQ((*frame)["prompts"], json::array({"small", accented, big}));
  EXPECT_EQ((*frame)["model"], (json{{"$bulk", 7}, {"other", 1}}));  // not a placeholder
  EXPECT_EQ(decoder.buffered(), 0u);
}

TEST(FrameDecoder, AFrameWithItsBulkFramesIsOneFrameForTheBuffer) {
  FrameDecoder decoder(1 << 20);
  const std::string first = bulk_framed(std::string(5000, 'a'));
  feed(decoder, first);
  EXPECT_FALSE(decoder.next());                      // waits for the JSON frame
  EXPECT_EQ(decoder.partial_bytes(), first.size());  // the frame being received
  EXPECT_EQ(decoder.frame_wants(), 4u);              // it needs at least the next header
  feed(decoder, framed(R"({"type": "llm_query", "bulk": 1, "prompt": {"$bulk": 0}})"));
  EXPECT_EQ(decoder.partial_bytes(), 0u);
  EXPECT_EQ(decoder.frame_wants(), 0u);
  const auto frame = decoder.next();
  ASSERT_TRUE(frame);
  EXPECT_EQ((*frame)["prompt"], std::string(5000, 'a'));
}

TEST(FrameDecoder, BulkFramesThatDoNotMatchTheirFrameEndTheStream) {
  const std::string announce = R"({"type": "llm_query", "bulk": 1, "prompt": {"$bulk": 0}})";
  // Not announced, announced wrong, a placeholder past the frames, one frame used twice or never.
  EXPECT_NE(stream_error_of(bulk_framed("x") + framed(R"({"type": "llm_query", "prompt": "y"})"))
                .find("does not announce"),
            std::string::npos);
  EXPECT_NE(stream_error_of(bulk_framed("x") +
                            framed(R"({"type": "a", "bulk": 2, "prompt": {"$bulk": 0}})"))
                .find("does not announce"),
            std::string::npos);
  EXPECT_NE(stream_error_of(bulk_framed("x") +
                            framed(R"({"type": "a", "bulk": 1, "prompt": {"$bulk": 1}})"))
                .find("do not match"),
            std::string::npos);
  EXPECT_NE(
      stream_error_of(bulk_framed("x") + bulk_framed("y") +
                      framed(R"({"type": "a", "bulk": 2, "p": [{"$bulk": 0}, {"$bulk": 0}]})"))
          .find("do not match"),
      std::string::npos);
  EXPECT_NE(stream_error_of(bulk_framed("x") + bulk_framed("y") +
                            framed(R"({"type": "a", "bulk": 2, "p": [{"$bulk": 1}]})"))
                .find("do not match"),
            std::string::npos);
  // Bulk bytes are checked as strictly as the JSON parser checks a string's.
  for (const std::string bad : {"\xc3", "\xed\xa0\x80", "\xc0\xaf", "\xf4\x90\x80\x80", "\xff"})
    EXPECT_NE(stream_error_of(bulk_framed(std::string(40, 'a') + bad) + framed(announce))
                  .find("not UTF-8"),
              std::string::npos);
  EXPECT_EQ(stream_error_of(bulk_framed("ok") + framed(announce)), "");
}

TEST(FrameDecoder, TheCapCountsAFrameAndItsBulkFramesTogether) {
  FrameDecoder decoder(1000);
  feed(decoder, bulk_framed(std::string(600, 'a')));
  feed(decoder, std::string("\x80\x00\x01\x90", 4));  // a second bulk frame of 400: 1000 in all
  EXPECT_GT(decoder.want(), 0u);
  feed(decoder, std::string(400, 'b'));
  feed(decoder, std::string("\x00\x00\x00\x01", 4));  // and a JSON frame of 1 byte: 1001
  EXPECT_EQ(decoder.want(), 0u);
  expect_over_the_limit(decoder);
}

TEST(FrameDecoder, BulkFramesBeforeOneFrameAreCounted) {
  FrameDecoder decoder(1 << 20);
  std::string empties;
  for (std::size_t i = 0; i < kMaxBulkFrames; ++i) empties += bulk_framed("");
  feed(decoder, empties);
  EXPECT_GT(decoder.want(), 0u);
  feed(decoder, std::string("\x80\x00\x00\x00", 4));
  EXPECT_EQ(decoder.want(), 0u);
  EXPECT_THROW(decoder.next(), Error);
}

TEST(FrameDecoder, DescribeFrameNamesTheTypeOnlyWhenItIsShortAndPlain) {
  EXPECT_EQ(describe_frame(json{{"type", "hello"}, {"x", 1}}), "\"hello\" (an object of 2 fields)");
  EXPECT_EQ(describe_frame(json{{"type", std::string(100, 'a')}}),
            "an object of 1 fields whose type is a string of 100 bytes");
  EXPECT_EQ(describe_frame(json{{"type", "a\"b"}}),
            "an object of 1 fields whose type is a string of 3 bytes");
  EXPECT_EQ(describe_frame(json{{"type", 5}}), "an object of 1 fields without a type");
  EXPECT_EQ(describe_frame(json::array()), "a array");
}

class ChannelTest : public ::testing::Test {
 protected:
  void SetUp() override {
    int pair[2];
    ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
    host_ = Channel(UniqueFd(pair[0]), 1 << 20);
    sandbox_.reset(pair[1]);
  }

  // Sends `bytes` from the sandbox's end, with `fds` attached.
  void send_with_fds(const std::string& bytes, const std::vector<int>& fds) {
    iovec io{const_cast<char*>(bytes.data()), bytes.size()};
    std::vector<char> control(CMSG_SPACE(sizeof(int) * fds.size()));
    msghdr message{};
    message.msg_iov = &io;
    message.msg_iovlen = 1;
    if (!fds.empty()) {
      message.msg_control = control.data();
      message.msg_controllen = control.size();
      cmsghdr* header = CMSG_FIRSTHDR(&message);
      header->cmsg_level = SOL_SOCKET;
      header->cmsg_type = SCM_RIGHTS;
      header->cmsg_len = CMSG_LEN(sizeof(int) * fds.size());
      std::memcpy(CMSG_DATA(header), fds.data(), sizeof(int) * fds.size());
    }
    ASSERT_EQ(sendmsg(sandbox_.get(), &message, 0), static_cast<ssize_t>(bytes.size()));
  }

  std::optional<json> receive_frame() {
    for (int i = 0; i < 100; ++i) {
      EXPECT_TRUE(host_.receive());
      if (auto frame = host_.next_frame()) return frame;
    }
    return std::nullopt;
  }

  Channel host_;
  UniqueFd sandbox_;
};

TEST_F(ChannelTest, AForkFramesOneFdOnItsFirstByteIsKept) {
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  UniqueFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  const std::string frame = framed(R"({"type": "fork", "id": 0})");
  send_with_fds(frame.substr(0, 4), {read_end.get()});
  send_with_fds(frame.substr(4), {});
  auto received = receive_frame();
  ASSERT_TRUE(received);
  auto fd = host_.take_fd();
  ASSERT_TRUE(fd);
  EXPECT_NE(fd.get(), read_end.get());
  EXPECT_FALSE(host_.take_fd()) << "one fd, taken once";
}

TEST_F(ChannelTest, FdsAnywhereElseAreClosedOnArrival) {
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  UniqueFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  const auto fds_before = rlm::test::open_fd_count();
  const int fd = read_end.get();
  // Two on the first byte; one on a body byte; one on each byte of a whole frame.
  const std::string one = framed(R"({"type": "fork", "id": 1})");
  send_with_fds(one.substr(0, 4), {fd, fd});
  send_with_fds(one.substr(4), {});
  auto first = receive_frame();
  ASSERT_TRUE(first);
  EXPECT_FALSE(host_.take_fd());
  const std::string two = framed(R"({"type": "fork", "id": 2})");
  send_with_fds(two.substr(0, 6), {});
  send_with_fds(two.substr(6), {fd});
  ASSERT_TRUE(receive_frame());
  EXPECT_FALSE(host_.take_fd());
  const std::string three = framed(R"({"type": "llm_query", "id": 3, "prompt": "p"})");
  for (std::size_t i = 0; i < three.size(); ++i) {
    send_with_fds(three.substr(i, 1), {fd, fd, fd, fd});
    host_.receive();
    EXPECT_LE(rlm::test::open_fd_count(), fds_before + 1) << "at byte " << i;
  }
  ASSERT_TRUE(receive_frame());
  EXPECT_FALSE(host_.take_fd()) << "only a frame's first byte may carry its fd, alone";
  EXPECT_EQ(rlm::test::open_fd_count(), fds_before);
}

// One fd, alone, on the first byte of each of many frames that all arrive before any is taken:
// the host holds only a few of them (a fork frame's fd waits at most behind a superseded one), and
// closes the rest on arrival.
TEST_F(ChannelTest, FdsOnTheFirstByteOfManyFramesAreNotAllHeld) {
  int pipe_fds[2];
  ASSERT_EQ(pipe2(pipe_fds, O_CLOEXEC), 0);
  UniqueFd read_end(pipe_fds[0]), write_end(pipe_fds[1]);
  const auto fds_before = rlm::test::open_fd_count();
  const std::string frame = framed(R"({"type": "llm_query", "id": 3, "prompt": "p"})");
  for (int i = 0; i < 64; ++i) {
    send_with_fds(frame.substr(0, 4), {read_end.get()});
    send_with_fds(frame.substr(4), {});
  }
  std::size_t most = 0;
  for (int i = 0; i < 10; ++i) {
    ASSERT_TRUE(host_.receive());
    most = std::max(most, rlm::test::open_fd_count() - fds_before);
  }
  EXPECT_LE(most, 4u) << "fds held for frames not taken yet";
  int frames = 0;
  while (host_.next_frame()) ++frames;
  EXPECT_EQ(frames, 64);
  (void)host_.take_fd();  // the last frame's, if it kept one
  EXPECT_EQ(rlm::test::open_fd_count(), fds_before);
}

TEST_F(ChannelTest, SendNeverBlocksOnAPeerThatDoesNotRead) {
  const json big = {{"op", "llm_result"}, {"id", 1}, {"text", std::string(1 << 20, 'a')}};
  const auto start = std::chrono::steady_clock::now();
  for (int i = 0; i < 20; ++i) ASSERT_TRUE(host_.send(big));
  EXPECT_LT(std::chrono::steady_clock::now() - start, std::chrono::seconds(2));
  EXPECT_GT(host_.unsent(), 0u);
  // The peer reads: the queue drains through flush().
  std::string got;
  char buffer[1 << 16];
  while (host_.unsent() > 0 || got.size() < 20 * (4 + big.dump().size())) {
    ASSERT_TRUE(host_.flush());
    const ssize_t count = recv(sandbox_.get(), buffer, sizeof buffer, MSG_DONTWAIT);
    if (count > 0) got.append(buffer, static_cast<std::size_t>(count));
  }
  EXPECT_EQ(got.size(), 20 * (4 + big.dump().size()));
}

// The hand-over's context: the fd rides on the frame's first byte, and the frame arrives whole.
TEST_F(ChannelTest, AnFdSentWithAFrameArrivesOnItsFirstByte) {
  UniqueFd memfd(memfd_create("context", MFD_CLOEXEC));
  ASSERT_TRUE(memfd);
  ASSERT_EQ(write(memfd.get(), "ctx", 3), 3);
  const json message = {{"op", "handover"}, {"id", 0}, {"context", "text"}};
  ASSERT_TRUE(host_.send(message, memfd.get()));
  EXPECT_EQ(host_.unsent(), 0u);
  char header[4];
  int fd = -1;
  const auto got =
      sys::receive_with_fds(sandbox_.get(), std::span<char>(header, 1), std::span<int>(&fd, 1), 0);
  ASSERT_EQ(got.bytes, 1);
  ASSERT_EQ(got.fds, 1u) << "the fd is on the first byte";
  UniqueFd received(fd);
  struct stat ours, theirs;
  ASSERT_EQ(fstat(memfd.get(), &ours), 0);
  ASSERT_EQ(fstat(received.get(), &theirs), 0);
  EXPECT_EQ(ours.st_ino, theirs.st_ino);
  std::string rest(4 + message.dump().size() - 1, '\0');
  ASSERT_EQ(recv(sandbox_.get(), rest.data(), rest.size(), MSG_WAITALL),
            static_cast<ssize_t>(rest.size()));
  EXPECT_EQ(std::string(1, header[0]) + rest, framed(message.dump()));
}

TEST_F(ChannelTest, AnFdIsNotSentBehindQueuedBytes) {
  const json big = {{"op", "llm_result"}, {"id", 1}, {"text", std::string(4 << 20, 'a')}};
  ASSERT_TRUE(host_.send(big));
  ASSERT_GT(host_.unsent(), 0u);
  EXPECT_FALSE(host_.send(json{{"op", "handover"}}, sandbox_.get()))
      << "the fd would ride on another frame's byte";
}

TEST_F(ChannelTest, TheFrameLimitChangesBetweenFramesOnly) {
  send_with_fds(framed(R"({"type": "hello"})"), {});
  ASSERT_TRUE(receive_frame());
  host_.set_max_frame(64);
  send_with_fds(framed(R"({"type": "x", "pad": ")" + std::string(100, 'p') + "\"}"), {});
  EXPECT_THROW(receive_frame(), Error) << "a frame over the new, smaller limit";
}

TEST_F(ChannelTest, TheFrameLimitCannotChangeWithBytesBuffered) {
  send_with_fds(std::string("\0\0", 2), {});  // half a header
  ASSERT_TRUE(host_.receive());
  ASSERT_GT(host_.unread(), 0u);
  EXPECT_THROW(host_.set_max_frame(64), Error);
}

TEST_F(ChannelTest, APeerGoneIsReportedBySendAndReceive) {
  sandbox_.reset();
  EXPECT_FALSE(host_.send(json{{"op", "discard"}}));
  EXPECT_FALSE(host_.receive());
}

}  // namespace
}  // namespace rlm::session

// The one sender of fds with bytes (the channel, the server's frames and init's payload message
// all use it): every fd arrives on the first bytes, and more than it can carry is refused whole.
TEST(SysFds, SendWithFdsCarriesItsFdsOnTheBytesAndRefusesTooMany) {
  int pair[2];
  ASSERT_EQ(socketpair(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0, pair), 0);
  const int sent_fds[3] = {0, 1, 2};
  ASSERT_EQ(rlm::sys::send_with_fds(pair[0], "abc", sent_fds), 3);
  char data[8] = {};
  int fds[4] = {-1, -1, -1, -1};
  const auto received =
      rlm::sys::receive_with_fds(pair[1], std::span<char>(data, sizeof data), fds);
  ASSERT_EQ(received.bytes, 3);
  ASSERT_EQ(received.fds, 3u);
  EXPECT_EQ(std::string(data, 3), "abc");
  for (int i = 0; i < 3; ++i) {
    struct stat ours {
    }, theirs{};
    ASSERT_EQ(fstat(sent_fds[i], &ours), 0);
    ASSERT_EQ(fstat(fds[i], &theirs), 0);
    EXPECT_EQ(ours.st_ino, theirs.st_ino);
    EXPECT_EQ(ours.st_dev, theirs.st_dev);
    close(fds[i]);
  }
  const std::vector<int> too_many(rlm::sys::kMaxSentFds + 1, 0);
  errno = 0;
  EXPECT_EQ(rlm::sys::send_with_fds(pair[0], "x", too_many), -1);
  EXPECT_EQ(errno, EINVAL);
  close(pair[0]);
  close(pair[1]);
}
