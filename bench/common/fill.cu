// bench/common/fill.cu: the CUDA twin of fill_pattern_cpu (data.hpp): writes the random-looking
// source bytes of `ferry bench` on the device, 8 bytes per thread in a grid-stride loop.
#include "fill.hpp"

#include "data.hpp"

namespace ferry::bench {
namespace {

constexpr unsigned kThreads = 256;
constexpr std::uint64_t kMaxBlocks = 1u << 16;

__global__ void __launch_bounds__(kThreads)
    fill_kernel(unsigned char* data, std::uint64_t bytes, std::uint64_t seed) {
  const std::uint64_t words = bytes / 8;
  const bool aligned = (reinterpret_cast<std::uintptr_t>(data) & 7u) == 0;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  for (std::uint64_t w = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
       w < words; w += stride) {
    const std::uint64_t v = pattern_word(seed, w);
    if (aligned) {
      reinterpret_cast<std::uint64_t*>(data)[w] = v;  // little-endian, as on the CPU
    } else {
      for (int b = 0; b < 8; ++b) data[w * 8 + b] = static_cast<unsigned char>(v >> (8 * b));
    }
  }
  if (blockIdx.x == 0 && threadIdx.x == 0) {
    const std::uint64_t last = pattern_word(seed, words);
    for (std::uint64_t i = words * 8; i < bytes; ++i) {
      data[i] = static_cast<unsigned char>(last >> (8 * (i - words * 8)));
    }
  }
}

}  // namespace

cudaError_t launch_fill_pattern(void* data, std::uint64_t bytes, std::uint64_t seed,
                                cudaStream_t stream) {
  if (bytes == 0) return cudaSuccess;
  const std::uint64_t words = bytes / 8;
  std::uint64_t blocks = (words + kThreads - 1) / kThreads;
  if (blocks == 0) blocks = 1;
  if (blocks > kMaxBlocks) blocks = kMaxBlocks;
  fill_kernel<<<static_cast<unsigned>(blocks), kThreads, 0, stream>>>(
      static_cast<unsigned char*>(data), bytes, seed);
  return cudaGetLastError();
}

}  // namespace ferry::bench
