// update/cuda_apply.hpp: the CUDA side of applying buckets (built with the cuda feature; then
// FERRY_UPDATE_HAVE_CUDA is 1): device staging buckets fed from host buckets in a double-buffered
// pipeline, the one-launch scatter of prepared plans on the applier's own streams, and
// fingerprints of device memory. No CUDA header is needed to use it.
//
// Pipeline for host bucket k (slot = k % 2):
//   copy stream:  wait for event scattered[slot] (the scatter of bucket k-2 no longer reads the
//                 slot), copy the bucket into device staging slot (straight from page-locked
//                 memory; pageable memory goes through two page-locked pieces), record
//                 copied[slot];
//   apply stream: wait for copied[slot], scatter (prepared device op table), record
//                 scattered[slot].
//   The host waits only for copied[slot] before apply() returns (the caller may then reuse its
//   bucket), so the H2D copy of bucket k+1 and the caller's read of bucket k+2 overlap the scatter
//   of bucket k. There is no device-wide synchronization; errors of enqueued work surface at
//   synchronize() (the engine calls it at commit and before a rollback).
// A device bucket is scattered in place on the apply stream and apply() waits for that scatter
// (unless told not to: a bucket read in place, which the commit's synchronize() waits for).
//
// Threading: one caller at a time (the update engine serializes). Every call makes the applier's
// device current on the calling thread for its duration.
#pragma once

#include <ferry/kernels/cpu.hpp>
#include <ferry/plugin.h>

#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace ferry::update {

class CudaApplier {
 public:
  // NOT_FOUND when `device` is not a visible CUDA device.
  explicit CudaApplier(int device);
  // Waits for the enqueued work and frees the staging memory and streams.
  ~CudaApplier();
  CudaApplier(const CudaApplier&) = delete;
  CudaApplier& operator=(const CudaApplier&) = delete;

  int device() const noexcept;

  // Validates `ops` (every destination a device parameter in `params`) against `entries`, which
  // describe a bucket whose entry i starts at byte `offsets[i]`, and uploads the device op table
  // once. The result is opaque and immutable; keep it with the cached plan.
  std::shared_ptr<const void> prepare(std::span<const ferry_plan_op_t> ops,
                                      std::span<const kernels::EntryView> entries,
                                      std::span<const std::uint64_t> offsets,
                                      std::span<const kernels::ParamView> params);

  // FP8_BLOCK_QUANT ops of a bucket (kernels::fp8_block_quant_cuda), run after the scatter on
  // the apply stream. `entries` and `offsets` as for prepare(); validated on every call.
  struct Fp8Ops {
    std::span<const ferry_plan_op_t> ops;
    std::span<const kernels::EntryView> entries;
    std::span<const std::uint64_t> offsets;
    std::span<const kernels::ParamView> params;
  };

  // Applies a prepared plan (may be null when only `fp8` has ops) and the FP8 ops to `bucket`
  // (host or device memory, see the pipeline above). `wait` false: a device bucket's kernels are
  // queued and not waited for (a bucket read in place, whose source stays valid until the
  // commit's synchronize()).
  void apply(const std::shared_ptr<const void>& prepared, std::span<const std::byte> bucket,
             bool bucket_on_device, const Fp8Ops& fp8 = {}, bool wait = true);

  // Waits for every enqueued copy and scatter; throws INTERNAL naming the failed work.
  void synchronize();
  // The same, for failure paths: never throws; returns the error text ("" when none).
  std::string drain() noexcept;

  // xxh64-interleaved-v1 of each device range, computed on the apply stream after everything
  // enqueued before, with one wait at the end.
  std::vector<std::uint64_t> fingerprints(std::span<const std::byte* const> data,
                                          std::span<const std::uint64_t> bytes);
  // The same fingerprints queued on the apply stream without a wait, as one batch (a bucket
  // read in place: its plan is queued right after, and the next buckets' after it); the kernels
  // write them into mapped host memory. take_queued_fingerprints() waits for the stream once and
  // returns every batch queued since the last take, in order (empty when none were);
  // drop_queued_fingerprints() waits and forgets them (an update that failed).
  void queue_fingerprints(std::span<const std::byte* const> data,
                          std::span<const std::uint64_t> bytes);
  std::vector<std::vector<std::uint64_t>> take_queued_fingerprints();
  void drop_queued_fingerprints() noexcept;
  // The chunk hashes of each device range, numbered from first_index[i]
  // (kernels::fingerprint_chunks_many_cuda_async), the ranges' one after the other; the same
  // ordering and wait.
  std::vector<std::uint64_t> chunk_hashes(std::span<const std::byte* const> data,
                                          std::span<const std::uint64_t> bytes,
                                          std::span<const std::uint64_t> first_index);

  // Copies `bytes` bytes of device memory to the host (synchronous, after enqueued work).
  void copy_to_host(void* dst, const void* src, std::uint64_t bytes);

  // Whether `data` is CUDA device memory (VMM mappings and cudaMalloc included).
  static bool is_device_memory(const void* data) noexcept;
  // The CUDA device `data` lives on; NOT_FOUND when it is not device memory.
  static int device_of(const void* data);

  // Host memory of `bytes` bytes, 256-byte aligned, page-locked (cudaHostAlloc), for staging
  // buckets that are copied to a device: such copies run at PCIe speed without a bounce.
  static std::shared_ptr<std::byte> pinned_host(std::uint64_t bytes);

 private:
  struct Cuda;
  std::unique_ptr<Cuda> cuda_;
};

}  // namespace ferry::update
