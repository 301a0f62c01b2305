// update/block_plan.hpp: the plan of a block of a tensor (a sharded sender's piece,
// manifest::Block). A model plugin plans whole checkpoint tensors; for a block the host asks it
// for the plan of the whole global tensor and keeps, of each operation, the elements that lie in
// the block, reading them from the block's own row-major bytes. Model plugins never see blocks.
#pragma once

#include <ferry/plugin.h>

#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace ferry::update {

// The operations of `whole` (the plan of one entry holding the whole global tensor of
// `global_shape`, row-major) restricted to the block at `offsets` of extent `extents`: each
// reads its elements from the block's bytes (src_offset counted from the block's first element).
// Consecutive pieces of equal length and constant strides become one 2-D operation, so a dim-0
// block of a whole copy stays one operation and a column block one strided operation.
// UNIMPLEMENTED naming `name` for an FP8 block-quantizing operation that the block covers only in
// part (its block scales need the whole 128 x 128 tile); INVALID_ARGUMENT for a source row
// layout it cannot walk (rows overlapping or going backwards).
std::vector<ferry_plan_op_t> restrict_to_block(std::span<const ferry_plan_op_t> whole,
                                               std::span<const std::uint64_t> global_shape,
                                               std::span<const std::uint64_t> offsets,
                                               std::span<const std::uint64_t> extents,
                                               const std::string& name);

// What a plan reads of one global tensor (a receiver's needs, docs/sharded.md).
struct TensorReads {
  // The dim-0 rows its operations read from, [first_row, end_row): a superset of the elements
  // read (a whole row counts where any element of it is read). Empty when no operation reads the
  // tensor (this rank does not need it). A tensor of no dims has one row.
  std::uint64_t first_row = 0;
  std::uint64_t end_row = 0;
  // A 2-D tensor whose operations read every row at the same columns: those, [first_col,
  // end_col) (the columns a tensor-parallel rank splits); every column otherwise.
  std::uint64_t first_col = 0;
  std::uint64_t end_col = 0;
  // The elements read (each operation's rows x cols, at most the tensor's element count).
  std::uint64_t elements = 0;
};

// Per tensor of `tensors` (the entries `ops` were planned for: src_tensor indexes them), what
// `ops` read. INVALID_ARGUMENT naming the tensor for an operation reading past its end.
std::vector<TensorReads> reads_of(std::span<const ferry_plan_op_t> ops,
                                  std::span<const ferry_tensor_desc_t> tensors);

}  // namespace ferry::update
