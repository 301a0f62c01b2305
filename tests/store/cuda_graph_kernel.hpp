// tests/store/cuda_graph_kernel.hpp: a small CUDA kernel for the store tests that reads weights
// through their raw device pointer: the wrapping uint64 sum of 32-bit words (exact and the same
// whatever the order, so eager, graph and CPU results compare bit for bit).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ferry::store::testing {

// Enqueues on `stream`: *out = 0, then *out += every word of words[0, count). `out` is device
// memory. Returns the launch error (cudaSuccess when enqueued). Capturable into a CUDA graph.
cudaError_t enqueue_word_sum(const void* words, std::uint64_t count, unsigned long long* out,
                             cudaStream_t stream);

}  // namespace ferry::store::testing
