// ferry/kernels/cuda.hpp: the CUDA data-movement kernels (built with the cuda feature). Each has a
// CPU twin in cpu.hpp and produces the same bytes for the same input (NaN payloads through
// F64 <-> F32 excepted: the GPU may return the canonical NaN there).
//
// Pointers in EntryView / ParamView and `data` are device pointers (or memory a kernel on the
// stream's device may access). Functions enqueue work on `stream` and return before it runs,
// except where a comment says they synchronize; inputs must stay valid and unchanged until the
// stream reaches the work. Errors (a bad plan, a failed CUDA call) throw ferry::Error. Any
// thread; concurrent calls on different streams are independent.
#pragma once

#include "ferry/kernels/cpu.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <memory>
#include <span>

namespace ferry::kernels {

namespace cuda_detail {
struct DeviceOp;
}

// Executes `ops` like scatter_cpu, in one kernel launch for all ops. The plan is validated on
// the host with check_plan before anything is enqueued (a bad op throws INVALID_ARGUMENT and
// nothing is written). The op table is copied to the device (stream-ordered allocation), so the
// host spans may be freed when this returns.
void scatter_cuda(std::span<const ferry_plan_op_t> ops, std::span<const EntryView> entries,
                  std::span<const ParamView> params, cudaStream_t stream);

// A plan prepared once for many launches: validated (check_plan) and converted to the device op
// table once, the table uploaded to device memory once. Sources are kept as offsets from the
// bucket's first byte, so one prepared plan serves every bucket with the same entry layout
// (e.g. both staging buckets of a double-buffered update); destinations are the parameter
// addresses given at preparation, which must stay valid (the weight store keeps them stable).
// Immutable after creation; launches from several threads and streams may share it. The
// destructor frees the device table (cudaFree, which waits for the device): destroy it only
// after the work that uses it, e.g. when a plan cache drops it.
class PreparedScatter {
 public:
  PreparedScatter(const PreparedScatter&) = delete;
  PreparedScatter& operator=(const PreparedScatter&) = delete;
  ~PreparedScatter();

  std::size_t device_ops() const noexcept { return num_ops_; }  // ops with work (rows, cols > 0)
  std::uint64_t bucket_bytes() const noexcept { return bucket_bytes_; }  // bytes the ops read up to
  int device() const noexcept { return device_; }

 private:
  friend std::shared_ptr<const PreparedScatter> prepare_scatter_cuda(
      std::span<const ferry_plan_op_t>, std::span<const EntryView>, const std::byte*,
      std::span<const ParamView>);
  friend void scatter_cuda(const PreparedScatter&, const std::byte*, cudaStream_t);
  PreparedScatter() = default;

  cuda_detail::DeviceOp* table_ = nullptr;  // device memory, owned
  std::size_t num_ops_ = 0;
  std::uint64_t total_units_ = 0;
  std::uint64_t bucket_bytes_ = 0;
  int device_ = 0;
};

// Prepares `ops` for `entries`, which lie in a bucket starting at `bucket_base` (every entry's
// data pointer is bucket_base + its offset; bucket_base must be 16-byte aligned). Validates like
// scatter_cuda (INVALID_ARGUMENT, nothing uploaded) and uploads the table to the current
// device with a synchronous copy. OUT_OF_MEMORY when the table does not fit.
std::shared_ptr<const PreparedScatter> prepare_scatter_cuda(std::span<const ferry_plan_op_t> ops,
                                                            std::span<const EntryView> entries,
                                                            const std::byte* bucket_base,
                                                            std::span<const ParamView> params);

// Executes a prepared plan reading from the bucket at `bucket_base` (device-accessible, 16-byte
// aligned, holding the same entry layout the plan was prepared for): one kernel launch, no host
// work per op and no upload. INVALID_ARGUMENT for a misaligned or null base.
void scatter_cuda(const PreparedScatter& plan, const std::byte* bucket_base, cudaStream_t stream);

// Executes FP8 ops (FERRY_TRANSFORM_FP8_BLOCK_QUANT only) like fp8_block_quant_cpu, with the
// same bytes, in one launch: one thread block per 128x128 tile; the tile is loaded into
// registers once, reduced to its scale and written once as e4m3. Validated on the host with
// check_fp8_plan first; the tile table is copied to the device stream-ordered.
void fp8_block_quant_cuda(std::span<const ferry_plan_op_t> ops, std::span<const EntryView> entries,
                          std::span<const ParamView> params, cudaStream_t stream);

// Enqueues xxh64-interleaved-v1 (docs/fingerprint.md) of `bytes` bytes at device address `data`;
// the value is written to `device_result` (device memory, 8 bytes) when the stream gets there.
// Any alignment of `data`; a batch of one for fingerprint_many_cuda_async's kernels.
void fingerprint_cuda_async(const void* data, std::uint64_t bytes, std::uint64_t* device_result,
                            cudaStream_t stream);

// Fingerprints of many ranges, ranges[i] = (data[i], bytes[i]) -> device_results[i] (empty
// ranges included; any alignment), enqueued on `stream` after its earlier work: two launches
// for the whole batch (every 1 MiB chunk of every range hashed side by side, then one combine
// per range), with a stream-ordered scratch allocation and a copy of the range table made
// before this returns, so the spans may be freed at once. INVALID_ARGUMENT (nothing enqueued)
// when the spans' sizes differ, a range with bytes has null data or device_results is null.
void fingerprint_many_cuda_async(std::span<const void* const> data,
                                 std::span<const std::uint64_t> bytes,
                                 std::uint64_t* device_results, cudaStream_t stream);

// fingerprint_chunks_cpu of many ranges: range i's ceil(bytes[i] / 1 MiB) chunk hashes, numbered
// from first_index[i], into device_hashes (device memory), the ranges' one after the other;
// enqueued on `stream` (one launch; the range table copied before this returns).
// INVALID_ARGUMENT as fingerprint_many_cuda_async.
void fingerprint_chunks_many_cuda_async(std::span<const void* const> data,
                                        std::span<const std::uint64_t> bytes,
                                        std::span<const std::uint64_t> first_index,
                                        std::uint64_t* device_hashes, cudaStream_t stream);

// The same, waiting for the stream and returning the value (synchronizes `stream`).
std::uint64_t fingerprint_cuda(const void* data, std::uint64_t bytes, cudaStream_t stream);

}  // namespace ferry::kernels
