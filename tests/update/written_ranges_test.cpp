// Tests of WrittenRanges: coverage is exact whatever the order and overlap of the writes.
#include "update/written_ranges.hpp"

#include <gtest/gtest.h>

namespace ferry::update {
namespace {

TEST(WrittenRanges, OverlappingWritesAreCountedOnce) {
  WrittenRanges w;
  w.reset(100);
  w.add(0, 60);
  w.add(40, 80);
  EXPECT_EQ(w.covered(), 80u);
  EXPECT_FALSE(w.complete());
  w.add(80, 100);
  EXPECT_TRUE(w.complete());
}

TEST(WrittenRanges, OutOfOrderBlocksCoverA2DParameter) {
  WrittenRanges w;
  w.reset(8 * 10);  // 8 rows of 10
  w.add_block(5, 10, 8, 5);  // right half of every row
  EXPECT_EQ(w.covered(), 40u);
  w.add_block(0, 10, 4, 5);  // left half of the top rows
  EXPECT_FALSE(w.complete());
  w.add_block(40, 10, 4, 5);  // left half of the bottom rows
  EXPECT_TRUE(w.complete());
}

TEST(WrittenRanges, WritesPastTheEndAreClampedAndManyRangesMerge) {
  WrittenRanges w;
  w.reset(5000);
  for (std::uint64_t i = 0; i < 5000; i += 2) w.add(i, i + 1);
  EXPECT_EQ(w.covered(), 2500u);
  for (std::uint64_t i = 1; i < 5000; i += 2) w.add(i, i + 1);
  w.add(4990, 9000);
  EXPECT_TRUE(w.complete());
  EXPECT_EQ(w.covered(), 5000u);
}

}  // namespace
}  // namespace ferry::update
