// cuda_ipc/batch_copy.hpp: one kernel launch for many device-to-device copies (the puts queued
// before a flush). A copy call costs ~4 us of host time per copy, even through
// cudaMemcpyBatchAsync (measured on an H200, docs/benchmarks.md), more than a small tensor's
// copy takes on the GPU; one launch costs the same for 1 or 512 copies. The fingerprinted copy
// also hashes what it copies (xxh64-interleaved-v1), from the words it stores, in the same pass.
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

// Bytes of page-locked host memory launch_fingerprinted_copy stages its op table through.
std::size_t fingerprinted_copy_staging_bytes(std::size_t n);

// Copies like launch_batch_copy and writes each op's fingerprint (xxh64-interleaved-v1 of the bytes
// copied, the value ferry::kernels::fingerprint_cpu gives for them) to device_results[i]
// (device memory, n entries), reading each source byte once. Any n (0 enqueues nothing; a null
// device_results or pinned_staging is refused with cudaErrorInvalidValue): the op table goes
// to the device through `pinned_staging`, page-locked host memory of at least
// fingerprinted_copy_staging_bytes(n) bytes (8-byte aligned) that must stay untouched until
// the stream has passed the launch. One launch takes every op because a chunk's 1 MiB is
// hashed by one warp in sequence: a launch needs thousands of chunks to fill the GPU (a
// parameter table would hold 512 ops). No op's source may overlap any op's destination (sources are read through the
// read-only cache). A table copy, two launches and a stream-ordered scratch allocation (the
// table, and 8 bytes per MiB) on `stream`; the results are there once the stream reaches them.
// With `chunk_bases` (n entries), op i's chunks are numbered from chunk_bases[i] (its bytes
// taken as chunks chunk_bases[i], .. of a longer range, docs/fingerprint.md) and its result is
// the XXH64 of those hashes seeded with its length; with `host_chunk_hashes` (page-locked,
// fingerprinted_copy_chunks(ops, n) entries) every op's chunk hashes, op after op, are copied
// there once the stream passes the launch.
cudaError_t launch_fingerprinted_copy(const CopyOp* ops, std::size_t n,
                                      std::uint64_t* device_results, void* pinned_staging,
                                      cudaStream_t stream,
                                      const std::uint64_t* chunk_bases = nullptr,
                                      std::uint64_t* host_chunk_hashes = nullptr);
// The chunks of the ops together: ceil(bytes / 1 MiB) each.
std::uint64_t fingerprinted_copy_chunks(const CopyOp* ops, std::size_t n);

}  // namespace ferry::cuda_ipc
