// Sizes and durations as policy files and command-line flags spell them.
#pragma once

#include <chrono>
#include <cstdint>
#include <optional>
#include <string>
#include <string_view>

namespace rlm {

// "1048576", "512K", "256M", "1G", "2T" (binary multiples; an optional trailing "B" or "iB" is
// accepted: "256MiB", "64KB"). nullopt for anything else, or on overflow.
std::optional<std::uint64_t> parse_size(std::string_view text);

// "1500" (milliseconds), "250ms", "10s", "1.5s", "2m", "1h". nullopt for anything else.
std::optional<std::chrono::milliseconds> parse_duration(std::string_view text);

// Human forms for messages: "256M", "1.5G", "1000B"; "10s", "250ms", "1.5s".
std::string format_size(std::uint64_t bytes);
std::string format_duration(std::chrono::milliseconds duration);
// A CPU count (limits.cpus) as written: "0.5", "2", "1.25".
std::string format_cpus(double cpus);

}  // namespace rlm
