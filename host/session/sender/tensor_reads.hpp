// session/sender/tensor_reads.hpp: the sender's own reads of a pushed tensor (the transports'
// copies aside): the fingerprints a receiver must report (docs/fingerprint.md), CUDA tensors
// fingerprinted on their device, and the copy of a tensor into a host staging slot.
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "session/sender/sender.hpp"

namespace ferry::session {

// The fingerprint of every tensor, by index. Per device, the CUDA tensors' kernels run side by
// side on a pool of streams with one read-back (session/device_fingerprints.hpp); host tensors
// are hashed with `threads` threads (0: the hardware count).
std::vector<std::uint64_t> fingerprint_tensors(std::span<const TensorView> tensors,
                                               unsigned threads);

// Copies `size` bytes of `t` to `dst` (host memory). CUDA tensors are staged through host
// memory this way (one device-to-host copy per tensor and receiver) for a transport that moves
// host buckets. Throws IO naming the tensor when the copy fails.
void copy_to_host(std::byte* dst, const TensorView& t, std::uint64_t size);

// Contiguous copies of pieces of a sender's blocks (a receiver that splits a tensor by columns
// needs a strided part of a row-major block: Link::sent_views): host memory, and device memory
// on one GPU, each grown as needed and kept for the next push.
// Threading: one push thread at a time.
class GatherMemory {
 public:
  GatherMemory() = default;
  ~GatherMemory();
  GatherMemory(const GatherMemory&) = delete;
  GatherMemory& operator=(const GatherMemory&) = delete;

  // At least `host_bytes` of host memory and `device_bytes` of memory on CUDA device `device`;
  // what reserve() returned before is gone. Throws OUT_OF_MEMORY naming the bytes.
  void reserve(std::uint64_t host_bytes, std::uint64_t device_bytes, int device);
  std::byte* host() { return host_.data(); }
  std::byte* device() { return static_cast<std::byte*>(device_); }
  // Copies rows [row0, row0 + rows) x columns [col0, col0 + cols) of the 2-D view `t` to `dst`
  // (reserved memory of t's kind), contiguous. A CUDA copy is queued: wait() before the copy
  // is read.
  void gather(std::byte* dst, const TensorView& t, std::uint64_t row0, std::uint64_t rows,
              std::uint64_t col0, std::uint64_t cols);
  // Waits for the queued copies; throws IO when one failed.
  void wait();

 private:
  void release_device() noexcept;
  std::vector<std::byte> host_;
  void* device_ = nullptr;
  std::uint64_t device_bytes_ = 0;
  int device_id_ = -1;
  void* stream_ = nullptr;  // cudaStream_t of device_id_
};

}  // namespace ferry::session
