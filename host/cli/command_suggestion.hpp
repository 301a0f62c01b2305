// cli/command_suggestion.hpp: what to tell a user who typed a command `ferry` does not have: the
// nearest known one by edit distance ("srve" -> "serve"), if any is close.
#pragma once

#include <optional>
#include <string>
#include <vector>

namespace ferry::cli {

// The first word of argv[1..] that is not a global option or its value (--config F, --set K=V,
// --plugin-dir D, --log-level L, and their --opt=value forms), or nullopt when there is none
// (only options, or --help / --version).
std::optional<std::string> command_word(int argc, char** argv);

// The known command nearest to `word` (Levenshtein distance at most 2, and less than its length),
// or nullopt.
std::optional<std::string> nearest_command(const std::string& word,
                                           const std::vector<std::string>& known);

}  // namespace ferry::cli
