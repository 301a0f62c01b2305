// update/block_plan.cpp: restricting a whole tensor's plan to one block of it (see
// update/block_plan.hpp).
#include "update/block_plan.hpp"

#include <ferry/sdk/error.hpp>

#include <algorithm>
#include <optional>

namespace ferry::update {
namespace {

// The block as contiguous runs of the global tensor's flat (row-major) index space: dims after
// `split` are whole, so each index combination of dims [0, split) of the block is one run of
// `run_len` elements. Run j (row-major over those dims) is the block's elements
// [j * run_len, (j + 1) * run_len).
struct BlockRuns {
  std::vector<std::uint64_t> strides;  // global element strides per dim
  std::span<const std::uint64_t> offsets;
  std::span<const std::uint64_t> extents;
  std::size_t split = 0;
  std::uint64_t run_len = 0;
  std::uint64_t runs = 0;

  std::uint64_t start(std::uint64_t j) const {
    std::uint64_t at = offsets[split] * strides[split];
    for (std::size_t d = split; d-- > 0;) {
      const std::uint64_t i = j % extents[d];
      j /= extents[d];
      at += (offsets[d] + i) * strides[d];
    }
    return at;
  }
};

struct Piece {
  std::uint64_t src = 0;
  std::uint64_t dst = 0;
  std::uint64_t len = 0;
};

// Joins pieces into 2-D operations of `like`'s kind.
class OpBuilder {
 public:
  OpBuilder(const ferry_plan_op_t& like, std::vector<ferry_plan_op_t>& out) : like_(like), out_(out) {}
  ~OpBuilder() = default;

  void add(const Piece& p) {
    if (open_ && p.len == first_.len) {
      const std::uint64_t ds = p.src - last_.src;
      const std::uint64_t dd = p.dst - last_.dst;
      if (rows_ == 1 && ds >= p.len && dd >= p.len) {
        src_stride_ = ds;
        dst_stride_ = dd;
        last_ = p;
        rows_ = 2;
        return;
      }
      if (rows_ > 1 && ds == src_stride_ && dd == dst_stride_) {
        last_ = p;
        ++rows_;
        return;
      }
    }
    flush();
    open_ = true;
    first_ = last_ = p;
    rows_ = 1;
    src_stride_ = dst_stride_ = p.len;
  }

  void flush() {
    if (!open_) return;
    ferry_plan_op_t op = like_;
    op.src_offset = first_.src;
    op.src_row_stride = src_stride_;
    op.dst_offset = first_.dst;
    op.dst_row_stride = dst_stride_;
    op.rows = rows_;
    op.cols = first_.len;
    out_.push_back(op);
    open_ = false;
  }

 private:
  const ferry_plan_op_t& like_;
  std::vector<ferry_plan_op_t>& out_;
  bool open_ = false;
  Piece first_, last_;
  std::uint64_t rows_ = 0, src_stride_ = 0, dst_stride_ = 0;
};

}  // namespace

std::vector<ferry_plan_op_t> restrict_to_block(std::span<const ferry_plan_op_t> whole,
                                               std::span<const std::uint64_t> global_shape,
                                               std::span<const std::uint64_t> offsets,
                                               std::span<const std::uint64_t> extents,
                                               const std::string& name) {
  const std::size_t ndim = global_shape.size();
  if (offsets.size() != ndim || extents.size() != ndim) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "tensor '{}': a block of {} / {} dims in {} dims", name,
         offsets.size(), extents.size(), ndim);
  }
  bool is_whole = true;
  std::uint64_t block_elements = 1;
  for (std::size_t d = 0; d < ndim; ++d) {
    is_whole = is_whole && offsets[d] == 0 && extents[d] == global_shape[d];
    block_elements *= extents[d];
  }
  if (is_whole) return {whole.begin(), whole.end()};
  std::vector<ferry_plan_op_t> out;
  if (block_elements == 0) return out;

  BlockRuns runs;
  runs.offsets = offsets;
  runs.extents = extents;
  runs.strides.assign(ndim, 1);
  for (std::size_t d = ndim; d-- > 1;) runs.strides[d - 1] = runs.strides[d] * global_shape[d];
  runs.split = ndim - 1;
  while (runs.split > 0 && offsets[runs.split] == 0 &&
         extents[runs.split] == global_shape[runs.split]) {
    --runs.split;
  }
  runs.run_len = extents[runs.split] * runs.strides[runs.split];
  runs.runs = 1;
  for (std::size_t d = 0; d < runs.split; ++d) runs.runs *= extents[d];

  for (const ferry_plan_op_t& op : whole) {
    if (op.rows == 0 || op.cols == 0) continue;
    if (op.rows > 1 && op.src_row_stride < op.cols) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "tensor '{}': a plan operation whose source rows overlap ({} rows of {} at stride {}) "
           "cannot be restricted to a block",
           name, op.rows, op.cols, op.src_row_stride);
    }
    std::vector<ferry_plan_op_t> pieces_of_op;
    std::uint64_t covered = 0;
    {
      OpBuilder builder(op, pieces_of_op);
      std::uint64_t r = 0;
      std::uint64_t j = 0;
      // Skip the runs that end before the op's first element.
      while (r < op.rows && j < runs.runs) {
        const std::uint64_t a = op.src_offset + r * op.src_row_stride;
        const std::uint64_t b = a + op.cols;
        const std::uint64_t c = runs.start(j);
        const std::uint64_t e = c + runs.run_len;
        const std::uint64_t x0 = std::max(a, c);
        const std::uint64_t x1 = std::min(b, e);
        if (x0 < x1) {
          builder.add({j * runs.run_len + (x0 - c), op.dst_offset + r * op.dst_row_stride + (x0 - a),
                       x1 - x0});
          covered += x1 - x0;
        }
        if (b <= e) {
          ++r;
        } else {
          ++j;
        }
      }
      builder.flush();
    }
    if (covered == 0) continue;
    if (op.transform == FERRY_TRANSFORM_FP8_BLOCK_QUANT && covered != op.rows * op.cols) {
      fail(FERRY_STATUS_UNIMPLEMENTED,
           "tensor '{}': FP8 block quantization of a block that covers part of a quantized "
           "region ({} of {} elements): its scales need the whole tile; send this tensor whole",
           name, covered, op.rows * op.cols);
    }
    out.insert(out.end(), pieces_of_op.begin(), pieces_of_op.end());
  }
  return out;
}

std::vector<TensorReads> reads_of(std::span<const ferry_plan_op_t> ops,
                                  std::span<const ferry_tensor_desc_t> tensors) {
  std::vector<TensorReads> out(tensors.size());
  std::vector<bool> read(tensors.size(), false);
  for (const auto& op : ops) {
    if (op.src_tensor >= tensors.size() || op.rows == 0 || op.cols == 0) continue;
    const ferry_tensor_desc_t& t = tensors[op.src_tensor];
    std::uint64_t inner = 1;
    std::uint64_t count = t.ndim == 0 ? 1 : t.shape[0];
    for (std::uint32_t d = 1; d < t.ndim && d < FERRY_MAX_DIMS; ++d) {
      inner *= t.shape[d];
      count *= t.shape[d];
    }
    // The op's last element read, +1: its last row's start plus its columns.
    const std::uint64_t end = op.src_offset + (op.rows - 1) * op.src_row_stride + op.cols;
    if (inner == 0 || end > count || end < op.src_offset) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "tensor '{}': an operation reads elements [{}, {}) of {}", t.name ? t.name : "?",
           op.src_offset, end, count);
    }
    const std::uint64_t first = op.src_offset / inner;
    const std::uint64_t last = (end + inner - 1) / inner;
    // Columns (2-D): the op reads columns [col, col + cols) of each of its rows when those lie
    // in one row and its rows are consecutive; else every column.
    const std::uint64_t col = op.src_offset % inner;
    const bool columns = t.ndim == 2 && col + op.cols <= inner &&
                         (op.rows == 1 || op.src_row_stride == inner);
    const std::uint64_t first_col = columns ? col : 0;
    const std::uint64_t end_col = columns ? col + op.cols : inner;
    TensorReads& r = out[op.src_tensor];
    if (!read[op.src_tensor]) {
      r.first_row = first;
      r.end_row = last;
      r.first_col = first_col;
      r.end_col = end_col;
      read[op.src_tensor] = true;
    } else {
      r.first_row = std::min(r.first_row, first);
      r.end_row = std::max(r.end_row, last);
      r.first_col = std::min(r.first_col, first_col);
      r.end_col = std::max(r.end_col, end_col);
    }
    r.elements = std::min(count, r.elements + op.rows * op.cols);
  }
  return out;
}

}  // namespace ferry::update
