// The CUDA fingerprint: xxh64-chunked-v1 (docs/fingerprint.md). One block per 1 MiB chunk: the
// block stages the chunk through shared memory in tiles with coalesced loads, four threads run
// XXH64's four accumulators over each tile, and thread 0 finishes the chunk. One more
// single-thread kernel combines the chunk hashes.
#include "launch.hpp"

#include "ferry/kernels/xxh64.hpp"

#include <cstdint>

namespace ferry::kernels::cuda_detail {
namespace {

constexpr std::uint64_t kChunkBytes = 1ull << 20;  // kFingerprintChunkBytes of cpu.hpp
constexpr unsigned kThreads = 128;
constexpr unsigned kTileBytes = 8192;  // a multiple of 32 (stripe) and of 16 * kThreads
static_assert(kChunkBytes % kTileBytes == 0);

__global__ void __launch_bounds__(kThreads)
    chunk_hash_kernel(const unsigned char* data, std::uint64_t bytes, std::uint64_t* hashes) {
  __shared__ uint4 tile_storage[kTileBytes / 16];
  __shared__ std::uint64_t lanes[4];
  auto* tile = reinterpret_cast<unsigned char*>(tile_storage);
  const auto* words = reinterpret_cast<const std::uint64_t*>(tile_storage);

  const std::uint64_t chunk = blockIdx.x;
  const std::uint64_t begin = chunk * kChunkBytes;
  const std::uint64_t len = bytes - begin < kChunkBytes ? bytes - begin : kChunkBytes;
  const unsigned char* p = data + begin;
  const std::uint64_t striped = len / xxh64::kStripeBytes * xxh64::kStripeBytes;
  const bool vector_loads = (reinterpret_cast<std::uintptr_t>(p) & 15u) == 0;

  std::uint64_t acc = 0;
  if (threadIdx.x < 4) acc = xxh64::initial_accumulator(static_cast<int>(threadIdx.x), chunk);
  for (std::uint64_t t = 0; t < striped; t += kTileBytes) {
    const unsigned n = static_cast<unsigned>(striped - t < kTileBytes ? striped - t : kTileBytes);
    if (vector_loads) {
      const auto* src = reinterpret_cast<const uint4*>(p + t);
      for (unsigned i = threadIdx.x; i < n / 16; i += blockDim.x) tile_storage[i] = src[i];
    } else {
      for (unsigned i = threadIdx.x; i < n; i += blockDim.x) tile[i] = p[t + i];
    }
    __syncthreads();
    if (threadIdx.x < 4) {
      // Little-endian words: the device reads them as XXH64's lanes.
      for (unsigned s = 0; s < n / 32; ++s) acc = xxh64::accumulate(acc, words[s * 4 + threadIdx.x]);
    }
    __syncthreads();
  }
  if (threadIdx.x < 4) lanes[threadIdx.x] = acc;
  __syncthreads();
  if (threadIdx.x == 0) {
    std::uint64_t h = len >= xxh64::kStripeBytes ? xxh64::converge(lanes) : chunk + xxh64::kPrime5;
    h = xxh64::finish(h, len, p + striped, len - striped);
    hashes[chunk] = h;
  }
}

__global__ void combine_kernel(const std::uint64_t* hashes, std::uint64_t chunks,
                               std::uint64_t bytes, std::uint64_t* result) {
  *result = xxh64::hash(hashes, chunks * sizeof(std::uint64_t), bytes);
}

}  // namespace

cudaError_t launch_fingerprint(const void* data, std::uint64_t bytes,
                               std::uint64_t* device_result, cudaStream_t stream) {
  const std::uint64_t chunks = (bytes + kChunkBytes - 1) / kChunkBytes;
  std::uint64_t* hashes = nullptr;
  cudaError_t err = cudaSuccess;
  if (chunks > 0) {
    err = cudaMallocAsync(reinterpret_cast<void**>(&hashes), chunks * sizeof(std::uint64_t),
                          stream);
    if (err != cudaSuccess) return err;
    chunk_hash_kernel<<<static_cast<unsigned>(chunks), kThreads, 0, stream>>>(
        static_cast<const unsigned char*>(data), bytes, hashes);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) {
    combine_kernel<<<1, 1, 0, stream>>>(hashes, chunks, bytes, device_result);
    err = cudaGetLastError();
  }
  if (hashes != nullptr) {
    const cudaError_t free_err = cudaFreeAsync(hashes, stream);
    if (err == cudaSuccess) err = free_err;
  }
  return err;
}

}  // namespace ferry::kernels::cuda_detail
