// tests/session/slow_write.cu: the waiting-then-writing kernels of slow_write.hpp. Every block
// waits on the GPU's global timer (ns, clock-rate independent) before it writes its part.
#include "slow_write.hpp"

namespace ferry::test {
namespace {

__device__ unsigned long long now_ns() {
  unsigned long long t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  return t;
}

__device__ void wait_for(unsigned wait_ms) {
  if (threadIdx.x == 0) {
    const unsigned long long until = now_ns() + 1000000ull * wait_ms;
    while (now_ns() < until) {
    }
  }
  __syncthreads();
}

__global__ void slow_copy_kernel(const unsigned char* src, unsigned char* dst, std::size_t bytes,
                                 unsigned wait_ms) {
  wait_for(wait_ms);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes;
       i += stride) {
    dst[i] = src[i];
  }
}

__global__ void slow_fill_kernel(unsigned char* dst, std::size_t bytes, unsigned char value,
                                 unsigned wait_ms) {
  wait_for(wait_ms);
  const std::size_t stride = static_cast<std::size_t>(gridDim.x) * blockDim.x;
  for (std::size_t i = static_cast<std::size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < bytes;
       i += stride) {
    dst[i] = value;
  }
}

}  // namespace

cudaError_t enqueue_slow_copy(const void* src, void* dst, std::size_t bytes, unsigned wait_ms,
                              cudaStream_t stream) {
  slow_copy_kernel<<<264, 256, 0, stream>>>(static_cast<const unsigned char*>(src),
                                            static_cast<unsigned char*>(dst), bytes, wait_ms);
  return cudaGetLastError();
}

cudaError_t enqueue_slow_fill(void* dst, std::size_t bytes, unsigned char value, unsigned wait_ms,
                              cudaStream_t stream) {
  slow_fill_kernel<<<264, 256, 0, stream>>>(static_cast<unsigned char*>(dst), bytes, value,
                                            wait_ms);
  return cudaGetLastError();
}

}  // namespace ferry::test
