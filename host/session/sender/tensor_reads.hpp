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

}  // namespace ferry::session
