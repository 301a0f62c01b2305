// config/suggest.hpp: the known word nearest to a mistyped one ("receiver.prot" ->
// "receiver.port", "srve" -> "serve"), for messages that name what was probably meant.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

namespace ferry::config {

// Levenshtein distance (insertions, deletions and substitutions each cost 1).
std::size_t edit_distance(std::string_view a, std::string_view b);

// The candidate nearest to `word`: at most 2 edits away and fewer edits than `word` has
// characters (so a short word is not "near" everything); the first of equally near ones;
// nullopt when none is that close.
std::optional<std::string> nearest(std::string_view word, const std::vector<std::string>& known);

}  // namespace ferry::config
