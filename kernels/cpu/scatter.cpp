// The CPU scatter kernel: validates a plan against one bucket and the target parameters, then
// executes its copy/cast operations on a per-call thread pool, splitting big operations into
// pieces and batching small ones so every thread streams a similar number of bytes.
#include "ferry/kernels/cpu.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <optional>
#include <string>
#include <thread>
#include <vector>

namespace ferry::kernels {
namespace {

const char* transform_name(ferry_transform_t t) noexcept {
  switch (t) {
    case FERRY_TRANSFORM_COPY: return "COPY";
    case FERRY_TRANSFORM_CAST: return "CAST";
    case FERRY_TRANSFORM_FP8_BLOCK_QUANT: return "FP8_BLOCK_QUANT";
  }
  return "unknown";
}

[[noreturn]] void refuse(std::size_t index, const ferry_plan_op_t& op, const std::string& rule) {
  fail(FERRY_STATUS_INVALID_ARGUMENT, "plan op {} ({} entry {} -> param {}): {}", index,
       transform_name(op.transform), op.src_tensor, op.dst_param, rule);
}

// Index one past the last element a (rows x cols, row_stride) block at `offset` touches, or
// nullopt on overflow. Requires rows > 0 and cols > 0.
std::optional<std::uint64_t> block_end(std::uint64_t offset, std::uint64_t row_stride,
                                       std::uint64_t rows, std::uint64_t cols) {
  auto span = checked_mul(rows - 1, row_stride);
  if (!span) return std::nullopt;
  auto start_of_last = checked_add(*span, offset);
  if (!start_of_last) return std::nullopt;
  return checked_add(*start_of_last, cols);
}

// One rectangular piece of an op: `rows` rows of `cols` elements.
struct Piece {
  const std::byte* src;
  std::byte* dst;
  std::uint64_t src_stride_bytes;
  std::uint64_t dst_stride_bytes;
  std::uint64_t rows;
  std::uint64_t cols;
  ferry_dtype_t src_dtype;
  ferry_dtype_t dst_dtype;  // equal to src_dtype: a memcpy of each row
  std::uint64_t bytes;      // work estimate: max(src, dst) bytes
};

void run_piece(const Piece& p) {
  const bool copy = p.src_dtype == p.dst_dtype;
  const std::uint64_t row_bytes = p.cols * dtype_size(p.src_dtype);
  const std::byte* src = p.src;
  std::byte* dst = p.dst;
  for (std::uint64_t r = 0; r < p.rows; ++r) {
    if (copy) {
      std::memcpy(dst, src, row_bytes);
    } else {
      convert_elements(src, p.src_dtype, dst, p.dst_dtype, p.cols);
    }
    src += p.src_stride_bytes;
    dst += p.dst_stride_bytes;
  }
}

// Work per piece: small enough that the pieces of one big op spread over every thread, large
// enough that per-piece overhead vanishes next to the memory traffic.
std::uint64_t piece_bytes_for(std::uint64_t total_bytes, unsigned threads) {
  constexpr std::uint64_t kMin = 256ull << 10;
  constexpr std::uint64_t kMax = 16ull << 20;
  const std::uint64_t want = total_bytes / (std::uint64_t{threads} * 4 + 1);
  return std::clamp(want, kMin, kMax);
}

void split_op(const ferry_plan_op_t& op, const EntryView& entry, const ParamView& param,
              std::uint64_t target, std::vector<Piece>& out) {
  const std::uint64_t ss = dtype_size(op.src_dtype);
  const std::uint64_t ds = dtype_size(op.dst_dtype);
  const std::uint64_t es = std::max(ss, ds);
  std::uint64_t rows = op.rows;
  std::uint64_t cols = op.cols;
  // Contiguous on both sides: one long row (the whole op becomes byte ranges).
  if (rows == 1 || (op.src_row_stride == cols && op.dst_row_stride == cols)) {
    cols *= rows;  // cannot overflow: check_plan bounded it by the entry's element count
    rows = 1;
  }
  const std::byte* src = entry.data + op.src_offset * ss;
  std::byte* dst = param.data + op.dst_offset * ds;
  const std::uint64_t src_stride = op.src_row_stride * ss;
  const std::uint64_t dst_stride = op.dst_row_stride * ds;
  const std::uint64_t row_bytes = cols * es;
  if (row_bytes >= target) {
    // Long rows: each row in column ranges (a multiple of 64 elements keeps pieces aligned).
    std::uint64_t chunk = std::max<std::uint64_t>(target / es, 1);
    chunk = std::max<std::uint64_t>(chunk / 64 * 64, 64);
    for (std::uint64_t r = 0; r < rows; ++r) {
      for (std::uint64_t c = 0; c < cols; c += chunk) {
        const std::uint64_t n = std::min(chunk, cols - c);
        out.push_back(Piece{src + r * src_stride + c * ss, dst + r * dst_stride + c * ds, 0, 0, 1,
                            n, op.src_dtype, op.dst_dtype, n * es});
      }
    }
    return;
  }
  const std::uint64_t rows_per_piece = std::max<std::uint64_t>(target / row_bytes, 1);
  for (std::uint64_t r = 0; r < rows; r += rows_per_piece) {
    const std::uint64_t n = std::min(rows_per_piece, rows - r);
    out.push_back(Piece{src + r * src_stride, dst + r * dst_stride, src_stride, dst_stride, n,
                        cols, op.src_dtype, op.dst_dtype, n * row_bytes});
  }
}

}  // namespace

void check_plan(std::span<const ferry_plan_op_t> ops, std::span<const EntryView> entries,
                std::span<const ParamView> params) {
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const ferry_plan_op_t& op = ops[i];
    if (op.src_tensor >= entries.size()) {
      refuse(i, op, fmt::format("src_tensor {} is out of range (the bucket has {} entries)",
                                op.src_tensor, entries.size()));
    }
    if (op.dst_param >= params.size()) {
      refuse(i, op, fmt::format("dst_param {} is out of range (the layout has {} parameters)",
                                op.dst_param, params.size()));
    }
    const EntryView& entry = entries[op.src_tensor];
    const ParamView& param = params[op.dst_param];
    switch (op.transform) {
      case FERRY_TRANSFORM_COPY:
        if (op.src_dtype != op.dst_dtype) {
          refuse(i, op, fmt::format("COPY needs equal dtypes, got {} -> {}",
                                    dtype_name(op.src_dtype), dtype_name(op.dst_dtype)));
        }
        if (dtype_size(op.src_dtype) == 0) {
          refuse(i, op, fmt::format("invalid dtype {}", static_cast<int>(op.src_dtype)));
        }
        break;
      case FERRY_TRANSFORM_CAST:
        if (!cast_supported(op.src_dtype, op.dst_dtype)) {
          refuse(i, op, fmt::format("CAST {} -> {} is not supported", dtype_name(op.src_dtype),
                                    dtype_name(op.dst_dtype)));
        }
        break;
      case FERRY_TRANSFORM_FP8_BLOCK_QUANT:
        // Tile and scale rules: check_fp8_plan (fp8.cpp); the kernels are fp8_block_quant_*.
        if (op.src_dtype != FERRY_DTYPE_BF16 && op.src_dtype != FERRY_DTYPE_F16 &&
            op.src_dtype != FERRY_DTYPE_F32) {
          refuse(i, op, fmt::format("FP8_BLOCK_QUANT reads BF16, F16 or F32, not {}",
                                    dtype_name(op.src_dtype)));
        }
        if (op.dst_dtype != FERRY_DTYPE_F8_E4M3) {
          refuse(i, op, fmt::format("FP8_BLOCK_QUANT writes F8_E4M3, not {}",
                                    dtype_name(op.dst_dtype)));
        }
        if (op.scale_param >= params.size() ||
            params[op.scale_param].dtype != FERRY_DTYPE_F32) {
          refuse(i, op, fmt::format("scale_param {} is not a F32 parameter of the layout",
                                    op.scale_param));
        }
        break;
      default:
        refuse(i, op, fmt::format("unknown transform {}", static_cast<int>(op.transform)));
    }
    if (entry.dtype != FERRY_DTYPE_INVALID && entry.dtype != op.src_dtype) {
      refuse(i, op, fmt::format("src_dtype {} differs from the entry's dtype {}",
                                dtype_name(op.src_dtype), dtype_name(entry.dtype)));
    }
    if (param.dtype != op.dst_dtype) {
      refuse(i, op, fmt::format("dst_dtype {} differs from the parameter's dtype {}",
                                dtype_name(op.dst_dtype), dtype_name(param.dtype)));
    }
    if (op.rows == 0 || op.cols == 0) continue;
    if (op.rows > 1 && op.dst_row_stride < op.cols) {
      refuse(i, op, fmt::format("dst_row_stride {} < cols {}: destination rows would overlap",
                                op.dst_row_stride, op.cols));
    }
    const auto src_end = block_end(op.src_offset, op.src_row_stride, op.rows, op.cols);
    if (!src_end || *src_end > entry.elements) {
      refuse(i, op, fmt::format("source block (offset {}, row stride {}, {} x {}) ends past the "
                                "entry's {} elements",
                                op.src_offset, op.src_row_stride, op.rows, op.cols,
                                entry.elements));
    }
    const auto dst_end = block_end(op.dst_offset, op.dst_row_stride, op.rows, op.cols);
    if (!dst_end || *dst_end > param.elements) {
      refuse(i, op, fmt::format("destination block (offset {}, row stride {}, {} x {}) ends past "
                                "the parameter's {} elements",
                                op.dst_offset, op.dst_row_stride, op.rows, op.cols,
                                param.elements));
    }
    if (!checked_mul(*src_end, dtype_size(op.src_dtype)) ||
        !checked_mul(*dst_end, dtype_size(op.dst_dtype))) {
      refuse(i, op, "byte offsets overflow uint64");
    }
    if (entry.data == nullptr) refuse(i, op, "the entry's data pointer is null");
    if (param.data == nullptr) refuse(i, op, "the parameter's data pointer is null");
  }
}

void scatter_cpu(std::span<const ferry_plan_op_t> ops, std::span<const EntryView> entries,
                 std::span<const ParamView> params, unsigned threads) {
  check_plan(ops, entries, params);
  for (std::size_t i = 0; i < ops.size(); ++i) {
    if (ops[i].transform == FERRY_TRANSFORM_FP8_BLOCK_QUANT) {
      refuse(i, ops[i], "FP8_BLOCK_QUANT ops are executed by fp8_block_quant_cpu, not scatter");
    }
  }

  if (threads == 0) threads = hardware_threads();
  std::uint64_t total = 0;
  for (const auto& op : ops) {
    // Bounded by real memory sizes (check_plan), so the sum cannot overflow in practice; saturate.
    const std::uint64_t es = std::max(dtype_size(op.src_dtype), dtype_size(op.dst_dtype));
    total = std::min(total + op.rows * op.cols * es, ~std::uint64_t{0} / 2);
  }
  const std::uint64_t target = piece_bytes_for(total, threads);

  std::vector<Piece> pieces;
  pieces.reserve(ops.size());
  for (const auto& op : ops) {
    if (op.rows == 0 || op.cols == 0) continue;
    split_op(op, entries[op.src_tensor], params[op.dst_param], target, pieces);
  }
  if (pieces.empty()) return;

  // Batches of consecutive pieces of about `target` bytes: thousands of tiny ops cost one atomic
  // increment per batch, not per op.
  std::vector<std::size_t> batch_starts;
  std::uint64_t acc = 0;
  for (std::size_t i = 0; i < pieces.size(); ++i) {
    if (i == 0 || acc >= target) {
      batch_starts.push_back(i);
      acc = 0;
    }
    acc += pieces[i].bytes;
  }
  batch_starts.push_back(pieces.size());
  const std::size_t num_batches = batch_starts.size() - 1;

  std::atomic<std::size_t> next{0};
  auto work = [&] {
    for (std::size_t b = next.fetch_add(1); b < num_batches; b = next.fetch_add(1)) {
      for (std::size_t i = batch_starts[b]; i < batch_starts[b + 1]; ++i) run_piece(pieces[i]);
    }
  };
  const std::size_t workers = std::min<std::size_t>(threads, num_batches);
  {
    std::vector<std::jthread> pool;
    pool.reserve(workers - 1);
    for (std::size_t t = 1; t < workers; ++t) pool.emplace_back(work);
    work();
  }
}

void scatter_cpu(std::span<const ferry_plan_op_t> ops, std::span<const std::byte* const> entries,
                 std::span<const std::uint64_t> entry_elements, std::span<const ParamView> params,
                 unsigned threads) {
  if (entries.size() != entry_elements.size()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "scatter: {} entry pointers but {} entry element counts (one each expected)",
         entries.size(), entry_elements.size());
  }
  std::vector<EntryView> views(entries.size());
  for (std::size_t i = 0; i < entries.size(); ++i) {
    views[i] = EntryView{entries[i], FERRY_DTYPE_INVALID, entry_elements[i]};
  }
  scatter_cpu(ops, std::span<const EntryView>(views), params, threads);
}

}  // namespace ferry::kernels
