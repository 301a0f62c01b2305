// cli/command_suggestion.cpp: the nearest known command to a mistyped one (command_suggestion.hpp).
#include "cli/command_suggestion.hpp"

#include <algorithm>
#include <array>
#include <string_view>

namespace ferry::cli {
namespace {

constexpr std::array<std::string_view, 4> kValueOptions = {"--config", "--set", "--plugin-dir",
                                                           "--log-level"};

std::size_t edit_distance(const std::string& a, const std::string& b) {
  std::vector<std::size_t> row(b.size() + 1);
  for (std::size_t j = 0; j <= b.size(); ++j) row[j] = j;
  for (std::size_t i = 1; i <= a.size(); ++i) {
    std::size_t diagonal = row[0];
    row[0] = i;
    for (std::size_t j = 1; j <= b.size(); ++j) {
      const std::size_t above = row[j];
      row[j] = std::min({row[j] + 1, row[j - 1] + 1, diagonal + (a[i - 1] == b[j - 1] ? 0 : 1)});
      diagonal = above;
    }
  }
  return row[b.size()];
}

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
  std::optional<std::string> best;
  std::size_t best_distance = 3;
  for (const auto& k : known) {
    const std::size_t d = edit_distance(word, k);
    if (d < best_distance && d < std::max<std::size_t>(word.size(), 1)) {
      best = k;
      best_distance = d;
    }
  }
  return best;
}

}  // namespace ferry::cli
