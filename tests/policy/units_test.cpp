#include <gtest/gtest.h>

#include <limits>

#include "rlm_sandbox/units.hpp"

namespace rlm {
namespace {

using std::chrono::milliseconds;

TEST(ParseSize, AcceptsBytesAndBinaryMultiples) {
  EXPECT_EQ(parse_size("0"), 0u);
  EXPECT_EQ(parse_size("1048576"), 1048576u);
  EXPECT_EQ(parse_size("512K"), 512u << 10);
  EXPECT_EQ(parse_size("256M"), 256u << 20);
  EXPECT_EQ(parse_size("1G"), 1ull << 30);
  EXPECT_EQ(parse_size("2T"), 2ull << 40);
  EXPECT_EQ(parse_size("256MiB"), 256u << 20);
  EXPECT_EQ(parse_size("64KB"), 64u << 10);
  EXPECT_EQ(parse_size("64kb"), 64u << 10);
  EXPECT_EQ(parse_size("512B"), 512u);
  EXPECT_EQ(parse_size("18446744073709551615"), std::numeric_limits<std::uint64_t>::max());
}

TEST(ParseSize, DecimalsAreExact) {
  EXPECT_EQ(parse_size("1.5G"), 1610612736u);
  EXPECT_EQ(parse_size("0.5K"), 512u);
  EXPECT_EQ(parse_size("1.25M"), 1310720u);
  EXPECT_EQ(parse_size("0.1K"), 102u) << "fractions of a byte are dropped";
}

TEST(ParseSize, RejectsGarbageNegativeAndOverflow) {
  for (const char* bad : {"",          "-1",
                          "+1",        "M",
                          "1.5",       "1.",
                          ".5G",       "1.5.5G",
                          "12X",       "1 G",
                          " 1G",       "1GG",
                          "1iB",       "1.5B",
                          "1Gi",       "1GiBs",
                          "one",       "1e3",
                          "0x10",      "18446744073709551616",
                          "16777216T", "99999999999999999999999999"})
    EXPECT_EQ(parse_size(bad), std::nullopt) << bad;
}

TEST(ParseDuration, AcceptsMillisecondsAndUnits) {
  EXPECT_EQ(parse_duration("1500"), milliseconds(1500));
  EXPECT_EQ(parse_duration("0"), milliseconds(0));
  EXPECT_EQ(parse_duration("250ms"), milliseconds(250));
  EXPECT_EQ(parse_duration("10s"), milliseconds(10'000));
  EXPECT_EQ(parse_duration("1.5s"), milliseconds(1'500));
  EXPECT_EQ(parse_duration("0.001s"), milliseconds(1));
  EXPECT_EQ(parse_duration("2m"), milliseconds(120'000));
  EXPECT_EQ(parse_duration("1h"), milliseconds(3'600'000));
  EXPECT_EQ(parse_duration("1.5h"), milliseconds(5'400'000));
}

TEST(ParseDuration, RejectsGarbageNegativeAndOverflow) {
  for (const char* bad : {"", "-1s", "s", "1.5", "1.5ms", "10 s", "10S", "10sec", "1d", "10us",
                          "1.s", "ms", "99999999999999999999h", "9223372036854775808"})
    EXPECT_EQ(parse_duration(bad), std::nullopt) << bad;
}

TEST(FormatSize, ShortExactForms) {
  EXPECT_EQ(format_size(0), "0B");
  EXPECT_EQ(format_size(1000), "1000B");
  EXPECT_EQ(format_size(1024), "1K");
  EXPECT_EQ(format_size(256u << 20), "256M");
  EXPECT_EQ(format_size(1610612736), "1.5G");
  EXPECT_EQ(format_size(2ull << 40), "2T");
  EXPECT_EQ(format_size(1310720), "1.25M");
  EXPECT_EQ(format_size(1025), "1025B") << "no inexact rounding";
}

TEST(FormatDuration, ShortExactForms) {
  EXPECT_EQ(format_duration(milliseconds(0)), "0ms");
  EXPECT_EQ(format_duration(milliseconds(250)), "250ms");
  EXPECT_EQ(format_duration(milliseconds(10'000)), "10s");
  EXPECT_EQ(format_duration(milliseconds(1'500)), "1.5s");
  EXPECT_EQ(format_duration(milliseconds(1'234)), "1.234s");
  EXPECT_EQ(format_duration(milliseconds(90'000)), "90s");
  EXPECT_EQ(format_duration(milliseconds(120'000)), "2m");
  EXPECT_EQ(format_duration(milliseconds(3'600'000)), "1h");
  EXPECT_EQ(format_duration(milliseconds(-1'500)), "-1.5s");
}

TEST(Units, FormattedValuesParseBack) {
  for (std::uint64_t bytes : std::initializer_list<std::uint64_t>{
           1ull, 1000ull, 1024ull, 1536ull, 4095ull, 1ull << 20, 1610612736ull, (1ull << 40) + 1,
           std::numeric_limits<std::uint64_t>::max()})
    EXPECT_EQ(parse_size(format_size(bytes)), bytes) << format_size(bytes);
  for (std::int64_t millis : {0LL, 1LL, 999LL, 1001LL, 61'000LL, 3'600'000LL, 5'400'001LL})
    EXPECT_EQ(parse_duration(format_duration(milliseconds(millis))), milliseconds(millis))
        << format_duration(milliseconds(millis));
}

}  // namespace
}  // namespace rlm
