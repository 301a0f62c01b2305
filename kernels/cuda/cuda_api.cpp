// Host side of the CUDA kernels (cuda.hpp): validates plans with the CPU checks, builds the
// device op table with its prefix sum of work units, and turns CUDA errors into ferry::Error.
#include "ferry/kernels/cuda.hpp"

#include "launch.hpp"

#include <ferry/sdk/cuda_scratch.hpp>
#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <algorithm>
#include <cstdint>
#include <limits>
#include <optional>
#include <vector>

namespace ferry::kernels {
namespace {

// Work unit sizes: a copy unit is 64 KiB of one row, a cast unit 16 Ki elements of one row.
constexpr std::uint64_t kCopyUnitBytes = 64ull << 10;
constexpr std::uint64_t kCastUnitElems = 16ull << 10;

void check_cuda(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  const ferry_status_code_t code = err == cudaErrorMemoryAllocation ? FERRY_STATUS_OUT_OF_MEMORY
                                                                    : FERRY_STATUS_INTERNAL;
  fail(code, "{}: {} ({})", what, cudaGetErrorString(err), cudaGetErrorName(err));
}

}  // namespace

namespace {

struct Table {
  std::vector<cuda_detail::DeviceOp> ops;
  std::uint64_t units = 0;
  std::uint64_t src_end = 0;  // one past the last source byte, relative to src_origin
};

// The device op table of a checked plan. Source addresses are made relative to `src_origin`
// (0: absolute addresses).
Table build_table(std::span<const ferry_plan_op_t> ops, std::span<const EntryView> entries,
                  std::span<const ParamView> params, std::uintptr_t src_origin) {
  if (ops.size() > std::numeric_limits<std::uint32_t>::max()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "scatter_cuda: {} ops exceed the 2^32 - 1 per launch",
         ops.size());
  }
  Table table;
  table.ops.reserve(ops.size());
  std::uint64_t units = 0;
  for (const ferry_plan_op_t& op : ops) {
    if (op.rows == 0 || op.cols == 0) continue;
    const EntryView& entry = entries[op.src_tensor];
    const ParamView& param = params[op.dst_param];
    const std::uint64_t ss = dtype_size(op.src_dtype);
    const std::uint64_t ds = dtype_size(op.dst_dtype);
    cuda_detail::DeviceOp d{};
    const auto src_address = reinterpret_cast<std::uintptr_t>(entry.data) + op.src_offset * ss;
    d.src = reinterpret_cast<const unsigned char*>(src_address - src_origin);
    d.dst = reinterpret_cast<unsigned char*>(param.data) + op.dst_offset * ds;
    d.rows = op.rows;
    d.cols = op.cols;
    d.src_stride = op.src_row_stride * ss;
    d.dst_stride = op.dst_row_stride * ds;
    // check_plan proved the last source element lies inside its entry.
    const std::uint64_t last =
        src_address - src_origin + (op.rows - 1) * d.src_stride + op.cols * ss;
    table.src_end = std::max(table.src_end, last);
    d.is_copy = op.src_dtype == op.dst_dtype ? 1 : 0;
    if (d.is_copy) {
      // Bytes; contiguous blocks become one long row.
      d.src_size = d.dst_size = 1;
      d.cols = op.cols * ss;
      if (op.rows == 1 || (op.src_row_stride == op.cols && op.dst_row_stride == op.cols)) {
        d.cols *= op.rows;
        d.rows = 1;
      }
      d.unit_elems = kCopyUnitBytes;
    } else {
      d.src_dtype = static_cast<std::uint32_t>(op.src_dtype);
      d.dst_dtype = static_cast<std::uint32_t>(op.dst_dtype);
      d.src_size = static_cast<std::uint32_t>(ss);
      d.dst_size = static_cast<std::uint32_t>(ds);
      d.unit_elems = kCastUnitElems;
      const auto t = reinterpret_cast<std::uintptr_t>(d.dst);
      // src_origin is 16-byte aligned (0 or a checked bucket base), so the offset's alignment is
      // the address's.
      d.aligned = (src_address % ss == 0 && t % ds == 0) ? 1 : 0;
    }
    d.units_per_row = (d.cols + d.unit_elems - 1) / d.unit_elems;
    d.first_unit = units;
    const auto op_units = checked_mul(d.rows, d.units_per_row);
    const auto next = op_units ? checked_add(units, *op_units) : std::nullopt;
    if (!next) fail(FERRY_STATUS_INVALID_ARGUMENT, "scatter_cuda: work units overflow uint64");
    units = *next;
    table.ops.push_back(d);
  }
  table.units = units;
  return table;
}

void check_base(const std::byte* bucket_base, const char* what) {
  const auto base = reinterpret_cast<std::uintptr_t>(bucket_base);
  if (base == 0 || base % 16 != 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "{}: the bucket base {:#x} must be a non-null 16-byte aligned address", what, base);
  }
}

}  // namespace

void scatter_cuda(std::span<const ferry_plan_op_t> ops, std::span<const EntryView> entries,
                  std::span<const ParamView> params, cudaStream_t stream) {
  check_plan(ops, entries, params);
  const Table table = build_table(ops, entries, params, 0);
  if (table.ops.empty()) return;
  check_cuda(cuda_detail::launch_scatter(table.ops.data(), table.ops.size(), table.units, stream),
             "scatter_cuda: launching the scatter kernel");
}

PreparedScatter::~PreparedScatter() {
  if (table_ != nullptr) (void)cudaFree(table_);
}

std::shared_ptr<const PreparedScatter> prepare_scatter_cuda(std::span<const ferry_plan_op_t> ops,
                                                            std::span<const EntryView> entries,
                                                            const std::byte* bucket_base,
                                                            std::span<const ParamView> params) {
  check_base(bucket_base, "prepare_scatter_cuda");
  check_plan(ops, entries, params);
  for (std::size_t i = 0; i < entries.size(); ++i) {
    if (entries[i].data < bucket_base) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "prepare_scatter_cuda: entry {} starts before the bucket base", i);
    }
  }
  const Table table =
      build_table(ops, entries, params, reinterpret_cast<std::uintptr_t>(bucket_base));
  std::shared_ptr<PreparedScatter> plan(new PreparedScatter());
  check_cuda(cudaGetDevice(&plan->device_), "prepare_scatter_cuda: querying the device");
  plan->num_ops_ = table.ops.size();
  plan->total_units_ = table.units;
  plan->bucket_bytes_ = table.src_end;
  if (table.ops.empty()) return plan;
  const std::size_t bytes = table.ops.size() * sizeof(cuda_detail::DeviceOp);
  check_cuda(cudaMalloc(reinterpret_cast<void**>(&plan->table_), bytes),
             "prepare_scatter_cuda: allocating the device op table");
  check_cuda(cudaMemcpy(plan->table_, table.ops.data(), bytes, cudaMemcpyHostToDevice),
             "prepare_scatter_cuda: uploading the device op table");
  // cudaMemcpy from pageable memory may return once the bytes are staged, before the DMA lands;
  // the scatter runs on the caller's (non-blocking) stream, which does not wait for the legacy
  // stream: wait here, or a first scatter can read a partly uploaded table.
  check_cuda(cudaStreamSynchronize(cudaStreamLegacy),
             "prepare_scatter_cuda: waiting for the device op table");
  return plan;
}

void scatter_cuda(const PreparedScatter& plan, const std::byte* bucket_base, cudaStream_t stream) {
  check_base(bucket_base, "scatter_cuda");
  if (plan.num_ops_ == 0) return;
  check_cuda(cuda_detail::launch_scatter_table(plan.table_, plan.num_ops_, plan.total_units_,
                                               reinterpret_cast<std::uintptr_t>(bucket_base),
                                               stream),
             "scatter_cuda: launching the prepared scatter kernel");
}

void fingerprint_cuda_async(const void* data, std::uint64_t bytes, std::uint64_t* device_result,
                            cudaStream_t stream) {
  if (device_result == nullptr) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "fingerprint_cuda_async: device_result is null");
  }
  if (data == nullptr && bytes > 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "fingerprint_cuda_async: data is null for {} bytes",
         bytes);
  }
  const cuda_detail::FingerprintRange range{data, bytes};
  check_cuda(cuda_detail::launch_fingerprints(&range, 1, device_result, stream),
             "fingerprint_cuda: launching the fingerprint kernels");
}

namespace {

// The kernels' ranges of `data`/`bytes` (and `first_index`, when given), checked: as many of
// each, `out` (the device results) set, no null range with bytes. `what` names the caller.
std::vector<cuda_detail::FingerprintRange> checked_ranges(
    const char* what, std::span<const void* const> data, std::span<const std::uint64_t> bytes,
    const std::span<const std::uint64_t>* first_index, const std::uint64_t* out) {
  if (data.size() != bytes.size() ||
      (first_index != nullptr && first_index->size() != data.size())) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: {} ranges, {} sizes{}", what, data.size(),
         bytes.size(),
         first_index != nullptr ? fmt::format(", {} first indexes", first_index->size()) : "");
  }
  const std::size_t n = data.size();
  if (n > 0 && out == nullptr) fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: no device results", what);
  std::vector<cuda_detail::FingerprintRange> ranges(n);
  for (std::size_t i = 0; i < n; ++i) {
    if (data[i] == nullptr && bytes[i] > 0) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: range {} has null data for {} bytes", what, i,
           bytes[i]);
    }
    ranges[i] = {data[i], bytes[i], first_index != nullptr ? (*first_index)[i] : 0};
  }
  return ranges;
}

}  // namespace

void fingerprint_many_cuda_async(std::span<const void* const> data,
                                 std::span<const std::uint64_t> bytes,
                                 std::uint64_t* device_results, cudaStream_t stream) {
  const auto ranges =
      checked_ranges("fingerprint_many_cuda_async", data, bytes, nullptr, device_results);
  if (ranges.empty()) return;
  check_cuda(cuda_detail::launch_fingerprints(ranges.data(), ranges.size(), device_results, stream),
             "fingerprint_many_cuda_async: launching the fingerprint kernels");
}

void fingerprint_chunks_many_cuda_async(std::span<const void* const> data,
                                        std::span<const std::uint64_t> bytes,
                                        std::span<const std::uint64_t> first_index,
                                        std::uint64_t* device_hashes, cudaStream_t stream) {
  const auto ranges = checked_ranges("fingerprint_chunks_many_cuda_async", data, bytes,
                                     &first_index, device_hashes);
  if (ranges.empty()) return;
  check_cuda(cuda_detail::launch_chunk_hashes(ranges.data(), ranges.size(), device_hashes, stream),
             "fingerprint_chunks_many_cuda_async: launching the chunk kernel");
}

std::uint64_t fingerprint_cuda(const void* data, std::uint64_t bytes, cudaStream_t stream) {
  std::uint64_t* device_result = nullptr;
  check_cuda(ferry::sdk::scratch_alloc_async(reinterpret_cast<void**>(&device_result),
                                             sizeof(std::uint64_t), stream),
             "fingerprint_cuda: allocating the result");
  std::uint64_t value = 0;
  cudaError_t err = cudaSuccess;
  try {
    fingerprint_cuda_async(data, bytes, device_result, stream);
    err = cudaMemcpyAsync(&value, device_result, sizeof value, cudaMemcpyDeviceToHost, stream);
  } catch (...) {
    (void)cudaFreeAsync(device_result, stream);
    throw;
  }
  const cudaError_t free_err = cudaFreeAsync(device_result, stream);
  const cudaError_t sync_err = cudaStreamSynchronize(stream);
  check_cuda(err, "fingerprint_cuda: copying the result");
  check_cuda(free_err, "fingerprint_cuda: freeing the result");
  check_cuda(sync_err, "fingerprint_cuda: waiting for the stream");
  return value;
}

}  // namespace ferry::kernels
