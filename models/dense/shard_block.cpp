// The tensor-parallel block arithmetic shared by the model families (see shard_block.hpp).
#include "shard_block.hpp"

#include <ferry/sdk/dtype.hpp>

namespace ferry::dense {

Block block_of(const std::vector<std::uint64_t>& shape, Shard shard, std::uint64_t part_offset,
               std::uint32_t rank, std::uint32_t size) {
  const std::uint64_t r = shape[0];
  const std::uint64_t c = shape.size() > 1 ? shape[1] : 1;
  Block b;
  switch (shard) {
    case Shard::kReplicated:
      b.rows = 1;
      b.cols = r * c;
      break;
    case Shard::kDim0:
      // A run of whole rows is contiguous on both sides: one row of (R/n)*C elements.
      b.rows = 1;
      b.cols = (r / size) * c;
      b.src_offset = rank * b.cols;
      break;
    case Shard::kDim1:
      b.rows = r;
      b.cols = c / size;
      b.src_offset = rank * b.cols;
      break;
  }
  b.src_row_stride = shard == Shard::kDim1 ? c : b.cols;
  b.dst_row_stride = b.cols;
  b.dst_offset = part_offset;
  return b;
}

ferry_plan_op_t make_op(const Block& b, std::uint32_t src_tensor, ferry_dtype_t src_dtype,
                        std::uint32_t dst_param, ferry_dtype_t dst_dtype) {
  ferry_plan_op_t op{};
  op.struct_size = FERRY_STRUCT_SIZE(ferry_plan_op_t, scale_param);
  op.src_tensor = src_tensor;
  op.src_dtype = src_dtype;
  op.src_offset = b.src_offset;
  op.src_row_stride = b.src_row_stride;
  op.dst_param = dst_param;
  op.dst_dtype = dst_dtype;
  op.dst_offset = b.dst_offset;
  op.dst_row_stride = b.dst_row_stride;
  op.rows = b.rows;
  op.cols = b.cols;
  op.transform = src_dtype == dst_dtype ? FERRY_TRANSFORM_COPY : FERRY_TRANSFORM_CAST;
  op.flags = 0;
  op.scale_param = 0;
  return op;
}

ferry_plan_op_t locate_op(Block b, ferry_dtype_t requested, ferry_dtype_t cataloged,
                          std::uint32_t dst_param, ferry_dtype_t dst_dtype) {
  b.src_offset = 0;
  b.src_row_stride = b.cols;
  const ferry_dtype_t src_dtype = dtype_size(requested) != 0 ? requested : cataloged;
  return make_op(b, 0, src_dtype, dst_param, dst_dtype);
}

}  // namespace ferry::dense
