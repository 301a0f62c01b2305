// cli/command_suggestion.cpp: the nearest known command to a mistyped one (command_suggestion.hpp).
#include "cli/command_suggestion.hpp"

#include <algorithm>
#include <array>
#include <string_view>

#include "config/suggest.hpp"

namespace ferry::cli {
namespace {

constexpr std::array<std::string_view, 4> kValueOptions = {"--config", "--set", "--plugin-dir",
                                                           "--log-level"};

}  // namespace

std::optional<std::string> command_word(int argc, char** argv) {
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg.empty()) continue;
    if (arg[0] != '-') return std::string(arg);
    const bool takes_value = std::find(kValueOptions.begin(), kValueOptions.end(), arg) !=
                             kValueOptions.end();
    if (takes_value) ++i;  // its value
  }
  return std::nullopt;
}

std::optional<std::string> nearest_command(const std::string& word,
                                           const std::vector<std::string>& known) {
  return config::nearest(word, known);
}

}  // namespace ferry::cli
