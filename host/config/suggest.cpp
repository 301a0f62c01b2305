// config/suggest.cpp: nearest known word by edit distance (see suggest.hpp).
#include "config/suggest.hpp"

#include <algorithm>

namespace ferry::config {

std::size_t edit_distance(std::string_view a, std::string_view b) {
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

std::optional<std::string> nearest(std::string_view word, const std::vector<std::string>& known) {
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

}  // namespace ferry::config
