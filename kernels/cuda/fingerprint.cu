// The CUDA fingerprint: xxh64-interleaved-v1 (docs/fingerprint.md) of a batch of ranges in two
// launches. The chunk kernel hashes every 1 MiB chunk of every range with one warp, lane j
// running accumulators 2j and 2j + 1 over the chunk's 16-byte units j, j + 32, .. (so a warp
// reads 512 contiguous bytes at a time), with a ring of loads kept in flight in registers; lane 0
// then hashes the 64 accumulators. The combine kernel hashes each range's chunk hashes (XXH64 of
// 8 bytes per chunk, seeded with the range's length) with four threads per range. Both routines
// (warp_chunk_hash, group_hash) live in the plugin SDK (ferry/sdk/fingerprint_cuda.cuh), which
// the cuda_ipc plugin's fingerprinting copy uses too.
#include "launch.hpp"

#include "ferry/sdk/cuda_scratch.hpp"
#include "ferry/sdk/fingerprint_cuda.cuh"

#include <cstdint>
#include <vector>

namespace ferry::kernels::cuda_detail {
namespace {

namespace fp = ferry::sdk::fingerprint_cuda;

constexpr std::uint64_t kChunkBytes = fp::kChunkBytes;  // kFingerprintChunkBytes of cpu.hpp
constexpr unsigned kGroup = fp::kGroup;                 // threads per hash
constexpr unsigned kThreads = 64;                       // combine: 16 ranges per block
constexpr unsigned kGroupsPerBlock = kThreads / kGroup;
static_assert(kThreads % 32 == 0 && 32 % kGroup == 0, "a group must lie within one warp");
constexpr unsigned kChunkWarps = 8;  // chunk kernel: 8 chunks per block, one per warp

// One range as the kernels see it: its chunk hashes are hashes[first_chunk ..] of the batch,
// its chunks numbered from first_index (0 but for chunk hashes of a range's pieces).
struct DeviceRange {
  const unsigned char* data;
  std::uint64_t bytes;
  std::uint64_t first_chunk;
  std::uint64_t first_index;
};

// A batch of up to this many ranges carries its table in the kernels' argument (1 KiB of the
// 4 KiB a launch may pass; __grid_constant__, so indexing it copies nothing per thread): no
// upload before the launch, one GPU operation where the hashes are written to mapped host
// memory (a commit's chunks where pieces meet).
constexpr std::size_t kInlineRanges = 32;

// The kernels' argument. A batch of up to kInlineRanges ranges carries them in `inline_ranges`
// (no upload); otherwise `ranges` is a device table of `num_ranges` entries in order of
// first_chunk.
struct Batch {
  const DeviceRange* ranges;
  DeviceRange inline_ranges[kInlineRanges];
  std::uint64_t num_ranges;
  std::uint64_t chunks;    // of all ranges together
  std::uint64_t* hashes;   // `chunks` entries (device scratch)
  std::uint64_t* results;  // `num_ranges` entries
};

__device__ __forceinline__ DeviceRange range_at(const Batch& b, std::uint64_t r) {
  return b.ranges == nullptr ? b.inline_ranges[r] : b.ranges[r];
}

// The range holding global chunk `g` (< b.chunks): the last one whose first_chunk <= g. Empty
// ranges share their first_chunk with the next range, so the search never lands on one.
__device__ std::uint64_t find_range(const Batch& b, std::uint64_t g) {
  std::uint64_t lo = 0;
  std::uint64_t hi = b.num_ranges - 1;
  while (lo < hi) {
    const std::uint64_t mid = lo + (hi - lo + 1) / 2;
    if (range_at(b, mid).first_chunk <= g) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// One warp per chunk of the batch: hashes[g] = the hash of chunk g (index in its range, seed).
__global__ void __launch_bounds__(kChunkWarps * 32) chunk_kernel(const __grid_constant__ Batch b) {
  __shared__ std::uint64_t scratch[kChunkWarps][fp::kWarpScratchWords];
  const unsigned warp = threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;
  const std::uint64_t g = static_cast<std::uint64_t>(blockIdx.x) * kChunkWarps + warp;
  if (g >= b.chunks) return;  // a whole warp
  const DeviceRange range = range_at(b, find_range(b, g));
  const std::uint64_t index = g - range.first_chunk;
  const std::uint64_t begin = index * kChunkBytes;
  const std::uint64_t rest = range.bytes - begin;
  const std::uint64_t len = rest < kChunkBytes ? rest : kChunkBytes;
  const std::uint64_t h =
      fp::warp_chunk_hash(range.data + begin, len, range.first_index + index, lane, scratch[warp]);
  if (lane == 0) b.hashes[g] = h;
}

// One group per range: results[r] = XXH64(its chunk hashes as little-endian u64, seed = bytes).
__global__ void __launch_bounds__(kThreads) combine_kernel(const __grid_constant__ Batch b) {
  const std::uint64_t r =
      static_cast<std::uint64_t>(blockIdx.x) * kGroupsPerBlock + threadIdx.x / kGroup;
  const unsigned lane = threadIdx.x % kGroup;
  const bool active = r < b.num_ranges;
  DeviceRange range{nullptr, 0, 0, 0};
  if (active) range = range_at(b, r);
  const std::uint64_t chunks = (range.bytes + kChunkBytes - 1) / kChunkBytes;
  // An empty range reads nothing (and `hashes` may be null when every range is empty).
  const auto* p =
      chunks > 0 ? reinterpret_cast<const unsigned char*>(b.hashes + range.first_chunk) : nullptr;
  const std::uint64_t h =
      fp::group_hash(p, chunks * sizeof(std::uint64_t), range.bytes, lane, active);
  if (active && lane == 0) b.results[r] = h;
}

unsigned blocks_for(std::uint64_t groups) {
  return static_cast<unsigned>((groups + kGroupsPerBlock - 1) / kGroupsPerBlock);
}

}  // namespace

namespace {

// launch_fingerprints, or with `device_chunk_hashes` launch_chunk_hashes: the chunk kernel
// writes there (no scratch) and the combine kernel is left out.
cudaError_t launch(const FingerprintRange* ranges, std::size_t num_ranges,
                   std::uint64_t* device_results, std::uint64_t* device_chunk_hashes,
                   cudaStream_t stream) {
  if (num_ranges == 0) return cudaSuccess;
  std::vector<DeviceRange> table(num_ranges);
  std::uint64_t chunks = 0;
  for (std::size_t i = 0; i < num_ranges; ++i) {
    table[i] = {static_cast<const unsigned char*>(ranges[i].data), ranges[i].bytes, chunks,
                ranges[i].first_index};
    chunks += (ranges[i].bytes + kChunkBytes - 1) / kChunkBytes;
  }
  // The grids are 1-D: 2^31 - 1 blocks.
  constexpr std::uint64_t kMaxGroups = 0x7fffffffull * kGroupsPerBlock;
  constexpr std::uint64_t kMaxChunks = 0x7fffffffull * kChunkWarps;
  if (chunks > kMaxChunks || num_ranges > kMaxGroups) return cudaErrorInvalidValue;

  Batch batch{};
  batch.num_ranges = num_ranges;
  batch.chunks = chunks;
  batch.results = device_results;
  // One stream-ordered scratch allocation: the chunk hashes, then the range table (8-byte
  // aligned after them) unless the batch is small enough to travel in the argument.
  const std::uint64_t hash_bytes =
      device_chunk_hashes != nullptr ? 0 : chunks * sizeof(std::uint64_t);
  const std::uint64_t table_bytes =
      num_ranges > kInlineRanges ? num_ranges * sizeof(DeviceRange) : 0;
  unsigned char* scratch = nullptr;
  cudaError_t err = cudaSuccess;
  if (hash_bytes + table_bytes > 0) {
    err = ferry::sdk::scratch_alloc_async(reinterpret_cast<void**>(&scratch),
                                          hash_bytes + table_bytes, stream);
    if (err != cudaSuccess) return err;
  }
  batch.hashes = device_chunk_hashes != nullptr ? device_chunk_hashes
                                                : reinterpret_cast<std::uint64_t*>(scratch);
  if (table_bytes > 0) {
    auto* device_table = reinterpret_cast<DeviceRange*>(scratch + hash_bytes);
    batch.ranges = device_table;
    // Pageable source: the copy is staged before this returns, so `table` may go.
    err = cudaMemcpyAsync(device_table, table.data(), table_bytes, cudaMemcpyHostToDevice, stream);
  } else {
    batch.ranges = nullptr;
    for (std::size_t i = 0; i < num_ranges; ++i) batch.inline_ranges[i] = table[i];
  }
  if (err == cudaSuccess && chunks > 0) {
    const auto blocks = static_cast<unsigned>((chunks + kChunkWarps - 1) / kChunkWarps);
    chunk_kernel<<<blocks, kChunkWarps * 32, 0, stream>>>(batch);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess && device_chunk_hashes == nullptr) {
    combine_kernel<<<blocks_for(num_ranges), kThreads, 0, stream>>>(batch);
    err = cudaGetLastError();
  }
  if (scratch != nullptr) {
    const cudaError_t free_err = cudaFreeAsync(scratch, stream);
    if (err == cudaSuccess) err = free_err;
  }
  return err;
}

}  // namespace

cudaError_t launch_fingerprints(const FingerprintRange* ranges, std::size_t num_ranges,
                                std::uint64_t* device_results, cudaStream_t stream) {
  return launch(ranges, num_ranges, device_results, nullptr, stream);
}

cudaError_t launch_chunk_hashes(const FingerprintRange* ranges, std::size_t num_ranges,
                                std::uint64_t* device_hashes, cudaStream_t stream) {
  return launch(ranges, num_ranges, nullptr, device_hashes, stream);
}

}  // namespace ferry::kernels::cuda_detail
