// update/written_ranges.hpp: which elements of one parameter an update has written, as merged
// [begin, end) element ranges, so commit can prove every parameter was fully written even when
// plan ops overlap or arrive out of order.
#pragma once

#include <cstdint>
#include <utility>
#include <vector>

namespace ferry::update {

class WrittenRanges {
 public:
  // Forgets everything; the parameter has `elements` elements.
  void reset(std::uint64_t elements);
  // Elements [begin, end) were written (clamped to the parameter).
  void add(std::uint64_t begin, std::uint64_t end);
  // A 2-D block: `rows` rows of `cols` elements, row i starting at offset + i * row_stride.
  void add_block(std::uint64_t offset, std::uint64_t row_stride, std::uint64_t rows,
                 std::uint64_t cols);
  // Distinct elements written so far.
  std::uint64_t covered();
  bool complete() { return covered() == elements_; }
  std::uint64_t elements() const noexcept { return elements_; }

 private:
  void compact();
  std::uint64_t elements_ = 0;
  std::vector<std::pair<std::uint64_t, std::uint64_t>> ranges_;
  std::size_t compacted_size_ = 0;
};

}  // namespace ferry::update
