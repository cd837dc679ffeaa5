// The 8-byte frame headers of Docker's multiplexed stream, however the bytes are cut.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "docker/attached_stream.hpp"

namespace rlm::docker {
namespace {

std::string frame(StreamKind kind, const std::string& payload) {
  const auto size = static_cast<std::uint32_t>(payload.size());
  std::string header = {static_cast<char>(kind),
                        0,
                        0,
                        0,
                        static_cast<char>(size >> 24),
                        static_cast<char>((size >> 16) & 0xff),
                        static_cast<char>((size >> 8) & 0xff),
                        static_cast<char>(size & 0xff)};
  return header + payload;
}

struct Collected {
  std::string out, err;
  FrameDemuxer demuxer{[this](StreamKind kind, std::string_view data) {
    (kind == StreamKind::stderr_stream ? err : out).append(data);
    return true;
  }};
};

TEST(DockerFrameDemuxer, SplitsStdoutAndStderrFramesInOneRead) {
  Collected c;
  EXPECT_TRUE(c.demuxer.feed(frame(StreamKind::stdout_stream, "hello\n") +
                             frame(StreamKind::stderr_stream, "oops\n") +
                             frame(StreamKind::stdout_stream, "world\n")));
  EXPECT_EQ(c.out, "hello\nworld\n");
  EXPECT_EQ(c.err, "oops\n");
  EXPECT_TRUE(c.demuxer.at_frame_boundary());
}

TEST(DockerFrameDemuxer, ReassemblesAStreamFedOneByteAtATime) {
  const std::string big(70'000, 'x');  // a length that needs three header bytes
  const std::string wire = frame(StreamKind::stderr_stream, "e") +
                           frame(StreamKind::stdout_stream, big) +
                           frame(StreamKind::stdout_stream, "") +  // empty frames are legal
                           frame(StreamKind::stdout_stream, "tail");
  Collected c;
  for (char byte : wire) ASSERT_TRUE(c.demuxer.feed(std::string_view(&byte, 1)));
  EXPECT_EQ(c.out, big + "tail");
  EXPECT_EQ(c.err, "e");
  EXPECT_TRUE(c.demuxer.at_frame_boundary());
}

TEST(DockerFrameDemuxer, ReportsACutOffFrame) {
  Collected c;
  const std::string wire = frame(StreamKind::stdout_stream, "abcdef");
  EXPECT_TRUE(c.demuxer.feed(wire.substr(0, 10)));
  EXPECT_EQ(c.out, "ab");
  EXPECT_FALSE(c.demuxer.at_frame_boundary());
}

TEST(DockerFrameDemuxer, RejectsBytesThatAreNotFrames) {
  Collected c;
  EXPECT_FALSE(c.demuxer.feed("HTTP/1.1 200 OK\r\n"));
  EXPECT_TRUE(c.demuxer.malformed());
  EXPECT_FALSE(c.demuxer.feed(frame(StreamKind::stdout_stream, "late")));
  EXPECT_EQ(c.out, "");
}

TEST(DockerFrameDemuxer, StopsDeliveringWhenTheSinkSaysSo) {
  std::vector<std::string> pieces;
  FrameDemuxer demuxer([&](StreamKind, std::string_view data) {
    pieces.emplace_back(data);
    return false;
  });
  EXPECT_FALSE(demuxer.feed(frame(StreamKind::stdout_stream, "one") +
                            frame(StreamKind::stdout_stream, "two")));
  EXPECT_FALSE(demuxer.malformed());
  EXPECT_EQ(pieces, std::vector<std::string>{"one"});
}

}  // namespace
}  // namespace rlm::docker
