// shard_block.hpp: how tensor parallelism splits a checkpoint tensor across ranks, and the 2-D
// block copy (one ferry_plan_op_t) that moves one rank's part into its parameter. Shared by the
// dense family and the families built on it (MoE, low-bit), so every family shards alike.
#pragma once

#include <ferry/plugin.h>

#include <cstdint>
#include <vector>

namespace ferry::dense {

// How tensor parallelism splits a checkpoint tensor across ranks.
enum class Shard {
  kReplicated,  // every rank holds all of it (norms)
  kDim0,        // column-parallel / vocab-parallel: rank r holds rows [r*R/n, (r+1)*R/n)
  kDim1,        // row-parallel: rank r holds columns [r*C/n, (r+1)*C/n)
};

// This rank's block of a checkpoint tensor, seen as a [R, C] matrix (a 1-D tensor is [N, 1]).
// Offsets and strides are in elements.
struct Block {
  std::uint64_t src_offset = 0;
  std::uint64_t src_row_stride = 0;
  std::uint64_t dst_offset = 0;
  std::uint64_t dst_row_stride = 0;
  std::uint64_t rows = 0;
  std::uint64_t cols = 0;
};

// Rank `rank` of `size`'s block of a tensor of `shape` (1-D or 2-D, non-empty, divisible as the
// shard needs: the caller checked) split by `shard`, written at element `part_offset` of its
// parameter (non-zero for a part of a fused parameter).
Block block_of(const std::vector<std::uint64_t>& shape, Shard shard, std::uint64_t part_offset,
               std::uint32_t rank, std::uint32_t size);

// The plan op for block `b` of manifest entry `src_tensor`: COPY when the dtypes are equal, else
// CAST.
ferry_plan_op_t make_op(const Block& b, std::uint32_t src_tensor, ferry_dtype_t src_dtype,
                        std::uint32_t dst_param, ferry_dtype_t dst_dtype);

// What locate answers for block `b`: the op with its source seen as a compact rows x cols block
// (src_tensor 0, src_offset 0, src_row_stride cols) of `requested` dtype, or of `cataloged` when
// `requested` is not a valid dtype (a lookup by name only).
ferry_plan_op_t locate_op(Block b, ferry_dtype_t requested, ferry_dtype_t cataloged,
                          std::uint32_t dst_param, ferry_dtype_t dst_dtype);

}  // namespace ferry::dense
