// cuda_ipc/batch_copy.hpp: one kernel launch for many device-to-device copies (the puts queued
// before a flush). A copy call costs ~4 us of host time per copy, even through
// cudaMemcpyBatchAsync (measured on an H200, docs/benchmarks.md), more than a small tensor's
// copy takes on the GPU; one launch costs the same for 1 or 512 copies.
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

namespace ferry::cuda_ipc {

struct CopyOp {
  const void* src = nullptr;
  void* dst = nullptr;
  std::uint64_t bytes = 0;
};

// Copies per launch: the ops travel as the kernel's parameter (512 x 24 bytes, within the
// 32 KiB that CUDA 12.1+ allows for kernel parameters).
inline constexpr std::size_t kMaxCopyOps = 512;

// Enqueues the `n` (1 .. kMaxCopyOps) copies on `stream`; any alignment and size. Device
// memory of the current device (or mapped into it) on both sides. Returns the launch's error.
cudaError_t launch_batch_copy(const CopyOp* ops, std::size_t n, cudaStream_t stream);

}  // namespace ferry::cuda_ipc
