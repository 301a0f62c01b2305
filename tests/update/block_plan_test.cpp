// tests/update/block_plan_test.cpp: a whole tensor's plan restricted to blocks of it
// (update/block_plan.hpp): the blocks of a tiling, each applied from its own bytes, write exactly
// what the whole plan writes from the whole tensor (for a whole copy, a column slice into a fused
// parameter and a 3-D tensor); a dim-0 block of a whole copy stays one operation, a column
// block one strided operation; a partial FP8 tile is refused. What a plan reads of each tensor
// (reads_of): its rows, the columns of a column split, nothing of a tensor it does not read.
#include <gtest/gtest.h>

#include <ferry/sdk/error.hpp>

#include <numeric>

#include "update/block_plan.hpp"

namespace ferry::update {
namespace {

ferry_plan_op_t op(std::uint64_t src, std::uint64_t src_stride, std::uint64_t dst,
                   std::uint64_t dst_stride, std::uint64_t rows, std::uint64_t cols) {
  ferry_plan_op_t o{};
  o.struct_size = sizeof o;
  o.src_dtype = o.dst_dtype = FERRY_DTYPE_I32;
  o.src_offset = src;
  o.src_row_stride = src_stride;
  o.dst_offset = dst;
  o.dst_row_stride = dst_stride;
  o.rows = rows;
  o.cols = cols;
  return o;
}

// The reference scatter: each op's rows x cols elements from `src` into `dst`.
void apply(const std::vector<ferry_plan_op_t>& ops, const std::vector<int>& src,
           std::vector<int>& dst) {
  for (const auto& o : ops) {
    for (std::uint64_t r = 0; r < o.rows; ++r) {
      for (std::uint64_t c = 0; c < o.cols; ++c) {
        dst.at(o.dst_offset + r * o.dst_row_stride + c) = src.at(o.src_offset + r * o.src_row_stride + c);
      }
    }
  }
}

// The elements of the block at `offsets` of extent `extents`, row-major.
std::vector<int> block_of(const std::vector<int>& global, const std::vector<std::uint64_t>& shape,
                          const std::vector<std::uint64_t>& offsets,
                          const std::vector<std::uint64_t>& extents) {
  std::vector<int> out;
  std::vector<std::uint64_t> at(shape.size(), 0);
  std::uint64_t n = 1;
  for (auto e : extents) n *= e;
  for (std::uint64_t i = 0; i < n; ++i) {
    std::uint64_t flat = 0;
    for (std::size_t d = 0; d < shape.size(); ++d) flat = flat * shape[d] + offsets[d] + at[d];
    out.push_back(global[flat]);
    for (std::size_t d = shape.size(); d-- > 0;) {
      if (++at[d] < extents[d]) break;
      at[d] = 0;
    }
  }
  return out;
}

struct Tile {
  std::vector<std::uint64_t> offsets, extents;
};

// Applying each tile's restricted plan from the tile's bytes equals applying the whole plan.
void expect_tiling_matches(const std::vector<ferry_plan_op_t>& whole,
                           const std::vector<std::uint64_t>& shape, const std::vector<Tile>& tiles,
                           std::size_t dst_elements) {
  std::uint64_t n = 1;
  for (auto d : shape) n *= d;
  std::vector<int> global(n);
  std::iota(global.begin(), global.end(), 1);
  std::vector<int> expected(dst_elements, 0), actual(dst_elements, 0);
  apply(whole, global, expected);
  for (const auto& t : tiles) {
    const auto ops = restrict_to_block(whole, shape, t.offsets, t.extents, "t");
    apply(ops, block_of(global, shape, t.offsets, t.extents), actual);
  }
  EXPECT_EQ(actual, expected);
}

using Dims = std::vector<std::uint64_t>;

TEST(BlockPlan, RowBlocksOfAWholeCopyStayOneOperationEach) {
  const std::vector<ferry_plan_op_t> whole = {op(0, 48, 0, 48, 1, 48)};
  const auto ops = restrict_to_block(whole, Dims{6, 8}, Dims{2, 0}, Dims{3, 8}, "t");
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].src_offset, 0u);
  EXPECT_EQ(ops[0].dst_offset, 16u);
  EXPECT_EQ(ops[0].rows * ops[0].cols, 24u);
  expect_tiling_matches(whole, {6, 8}, {{{0, 0}, {2, 8}}, {{2, 0}, {3, 8}}, {{5, 0}, {1, 8}}}, 48);
}

TEST(BlockPlan, AColumnBlockIsOneStridedOperation) {
  const std::vector<ferry_plan_op_t> whole = {op(0, 8, 0, 8, 6, 8)};
  const auto ops = restrict_to_block(whole, Dims{6, 8}, Dims{0, 4}, Dims{6, 4}, "t");
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].rows, 6u);
  EXPECT_EQ(ops[0].cols, 4u);
  EXPECT_EQ(ops[0].src_row_stride, 4u);
  EXPECT_EQ(ops[0].dst_row_stride, 8u);
  EXPECT_EQ(ops[0].dst_offset, 4u);
  expect_tiling_matches(whole, {6, 8}, {{{0, 0}, {6, 4}}, {{0, 4}, {6, 4}}}, 48);
}

TEST(BlockPlan, ATensorParallelSliceIntoAFusedParameterFromAGridOfBlocks) {
  // The plan keeps columns [2, 6) of a [6, 8] tensor and writes them at rows 10.. of a fused
  // [16, 4] parameter.
  const std::vector<ferry_plan_op_t> whole = {op(2, 8, 40, 4, 6, 4)};
  expect_tiling_matches(whole, {6, 8},
                        {{{0, 0}, {3, 3}}, {{0, 3}, {3, 5}}, {{3, 0}, {3, 3}}, {{3, 3}, {3, 5}}},
                        64);
}

TEST(BlockPlan, ThreeDimensionalBlocksOnTheMiddleDimension) {
  const std::vector<ferry_plan_op_t> whole = {op(0, 60, 0, 60, 1, 60)};
  expect_tiling_matches(whole, {3, 4, 5},
                        {{{0, 0, 0}, {3, 1, 5}}, {{0, 1, 0}, {3, 3, 5}}}, 60);
  expect_tiling_matches(whole, {3, 4, 5},
                        {{{0, 0, 0}, {2, 4, 2}}, {{0, 0, 2}, {2, 4, 3}}, {{2, 0, 0}, {1, 4, 5}}},
                        60);
}

TEST(BlockPlan, AnOperationOutsideTheBlockIsDropped) {
  const std::vector<ferry_plan_op_t> whole = {op(0, 8, 0, 8, 2, 8), op(16, 8, 100, 8, 4, 8)};
  const auto ops = restrict_to_block(whole, Dims{6, 8}, Dims{0, 0}, Dims{2, 8}, "t");
  ASSERT_EQ(ops.size(), 1u);
  EXPECT_EQ(ops[0].dst_offset, 0u);
}

TEST(BlockPlan, APartialFp8TileIsRefusedNamingTheTensor) {
  auto quant = op(0, 256, 0, 256, 256, 256);
  quant.transform = FERRY_TRANSFORM_FP8_BLOCK_QUANT;
  try {
    (void)restrict_to_block({&quant, 1}, Dims{256, 256}, Dims{0, 0}, Dims{128, 256}, "model.w");
    FAIL() << "no error";
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_UNIMPLEMENTED);
    EXPECT_NE(std::string(e.what()).find("'model.w'"), std::string::npos) << e.what();
  }
}

ferry_tensor_desc_t desc(const char* name, std::vector<std::uint64_t> shape) {
  ferry_tensor_desc_t d{};
  d.struct_size = sizeof d;
  d.name = name;
  d.dtype = FERRY_DTYPE_I32;
  d.ndim = static_cast<std::uint32_t>(shape.size());
  for (std::size_t k = 0; k < shape.size(); ++k) d.shape[k] = shape[k];
  return d;
}

TEST(ReadsOf, RowsOfARowSplitColumnsOfAColumnSplitAndNothingOfAnUnreadTensor) {
  const std::vector<ferry_tensor_desc_t> tensors = {
      desc("rows", {8, 6}), desc("cols", {8, 6}), desc("unread", {4, 4}), desc("bias", {8}),
      desc("cube", {4, 3, 2})};
  auto a = op(2 * 6, 6, 0, 6, 3, 6);  // rows 2..4 of "rows", whole
  a.src_tensor = 0;
  auto b = op(1, 6, 0, 2, 8, 2);  // columns 1..2 of every row of "cols"
  b.src_tensor = 1;
  auto c = op(4, 6, 16, 2, 8, 2);  // and columns 4..5: the union is columns 1..5
  c.src_tensor = 1;
  auto d = op(3, 0, 0, 0, 1, 4);  // elements 3..6 of a 1-D tensor
  d.src_tensor = 3;
  auto e = op(6 + 1, 6, 0, 1, 2, 1);  // one column of a 3-D tensor: whole rows, every column
  e.src_tensor = 4;
  const auto r = reads_of(std::vector<ferry_plan_op_t>{a, b, c, d, e}, tensors);
  ASSERT_EQ(r.size(), 5u);
  EXPECT_EQ(r[0].first_row, 2u);
  EXPECT_EQ(r[0].end_row, 5u);
  EXPECT_EQ(r[0].first_col, 0u);
  EXPECT_EQ(r[0].end_col, 6u);
  EXPECT_EQ(r[0].elements, 18u);
  EXPECT_EQ(r[1].first_row, 0u);
  EXPECT_EQ(r[1].end_row, 8u);
  EXPECT_EQ(r[1].first_col, 1u);
  EXPECT_EQ(r[1].end_col, 6u);
  EXPECT_EQ(r[1].elements, 32u);
  EXPECT_EQ(r[2].end_row, r[2].first_row);  // nothing read
  EXPECT_EQ(r[2].elements, 0u);
  EXPECT_EQ(r[3].first_row, 3u);
  EXPECT_EQ(r[3].end_row, 7u);
  EXPECT_EQ(r[4].first_row, 1u);
  EXPECT_EQ(r[4].end_row, 3u);
  EXPECT_EQ(r[4].first_col, 0u);
  EXPECT_EQ(r[4].end_col, 6u);
}

TEST(ReadsOf, AnOperationReadingPastTheTensorIsRefusedNamingIt) {
  const std::vector<ferry_tensor_desc_t> tensors = {desc("short", {2, 3})};
  auto a = op(3, 3, 0, 3, 2, 3);  // rows 1..2 of a 2-row tensor
  a.src_tensor = 0;
  try {
    reads_of(std::vector<ferry_plan_op_t>{a}, tensors);
    FAIL() << "expected a refusal";
  } catch (const Error& err) {
    EXPECT_EQ(err.code(), FERRY_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(err.what()).find("'short'"), std::string::npos) << err.what();
  }
}

}  // namespace
}  // namespace ferry::update
