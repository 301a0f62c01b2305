// tests/session/slow_write.hpp: kernels that wait on the GPU for a while, then write: they stand
// in for a trainer's optimizer step still queued when push() is called, or an engine's forward
// pass still running when an update arrives (session_stream_order_test).
#pragma once

#include <cuda_runtime_api.h>

#include <cstddef>

namespace ferry::test {

// Queues on `stream`: wait `wait_ms` milliseconds of GPU time, then copy `bytes` bytes from `src`
// to `dst` (device memory).
cudaError_t enqueue_slow_copy(const void* src, void* dst, std::size_t bytes, unsigned wait_ms,
                              cudaStream_t stream);

// Queues on `stream`: wait `wait_ms` milliseconds of GPU time, then set `bytes` bytes of `dst` to
// `value`.
cudaError_t enqueue_slow_fill(void* dst, std::size_t bytes, unsigned char value, unsigned wait_ms,
                              cudaStream_t stream);

}  // namespace ferry::test
