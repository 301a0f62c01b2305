// WrittenRanges: interval bookkeeping with lazy sort-and-merge.
#include "update/written_ranges.hpp"

#include <algorithm>

namespace ferry::update {

void WrittenRanges::reset(std::uint64_t elements) {
  elements_ = elements;
  ranges_.clear();
  compacted_size_ = 0;
}

void WrittenRanges::add(std::uint64_t begin, std::uint64_t end) {
  end = std::min(end, elements_);
  if (begin >= end) return;
  if (!ranges_.empty() && ranges_.back().second == begin) {
    ranges_.back().second = end;  // the common case: ops in order
    return;
  }
  ranges_.emplace_back(begin, end);
  if (ranges_.size() > 2 * compacted_size_ + 1024) compact();
}

void WrittenRanges::add_block(std::uint64_t offset, std::uint64_t row_stride, std::uint64_t rows,
                              std::uint64_t cols) {
  if (rows == 0 || cols == 0) return;
  if (rows == 1 || cols == row_stride) {
    // Contiguous; the kernel already bounds-checked offset + rows * cols.
    add(offset, offset + rows * cols);
    return;
  }
  for (std::uint64_t r = 0; r < rows; ++r) {
    const std::uint64_t start = offset + r * row_stride;
    add(start, start + cols);
  }
}

void WrittenRanges::compact() {
  std::sort(ranges_.begin(), ranges_.end());
  std::size_t out = 0;
  for (std::size_t i = 0; i < ranges_.size(); ++i) {
    if (out > 0 && ranges_[i].first <= ranges_[out - 1].second) {
      ranges_[out - 1].second = std::max(ranges_[out - 1].second, ranges_[i].second);
    } else {
      ranges_[out++] = ranges_[i];
    }
  }
  ranges_.resize(out);
  compacted_size_ = out;
}

std::uint64_t WrittenRanges::covered() {
  compact();
  std::uint64_t total = 0;
  for (const auto& [begin, end] : ranges_) total += end - begin;
  return total;
}

}  // namespace ferry::update
