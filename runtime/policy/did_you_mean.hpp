// Suggestions for misspelled names: keys, backends, syscalls, capabilities, policy names.
#pragma once

#include <optional>
#include <string>
#include <string_view>

namespace rlm::policy {

// Case-insensitive optimal-string-alignment distance: insertions, deletions, substitutions and
// swaps of two neighbours each cost 1, so "memroy" is one step from "memory".
std::size_t edit_distance(std::string_view a, std::string_view b);

// How many edits still look like a typo of `word` rather than a different word.
inline std::size_t typo_allowance(std::string_view word) {
  return word.size() / 3 > 1 ? word.size() / 3 : 1;
}

// The candidate closest to `word`, when it is close enough to be a plausible typo.
template <typename Candidates>
std::optional<std::string> closest_match(std::string_view word, const Candidates& candidates) {
  const std::size_t allowed = typo_allowance(word);
  std::optional<std::string> best;
  std::size_t best_distance = allowed + 1;
  for (const auto& candidate : candidates) {
    // The distance is at least the difference in length: skip what cannot be close, so a long
    // hostile word costs a comparison of lengths, not a full table against every candidate.
    const std::size_t length = std::string_view(candidate).size();
    if ((length > word.size() ? length - word.size() : word.size() - length) > allowed) continue;
    const std::size_t distance = edit_distance(word, candidate);
    if (distance < best_distance) {
      best_distance = distance;
      best = std::string(candidate);
    }
  }
  return best;
}

}  // namespace rlm::policy
