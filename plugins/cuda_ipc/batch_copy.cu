// cuda_ipc/batch_copy.cu: the batched copy kernel (see batch_copy.hpp). Block row y copies op y;
// the blocks of a row stride over it with 16-byte loads and stores where source and destination
// are equally aligned (head and tail bytewise), bytewise otherwise. The fingerprinted copy runs
// the SDK's xxh64-interleaved-v1 chunk routine (ferry/sdk/fingerprint_cuda.cuh), one warp per
// 1 MiB chunk of every op, with a destination to store each hashed unit to (a warp's loads and
// stores are 512 contiguous bytes, as in a plain copy), then combines each op's chunk hashes,
// like kernels/cuda/fingerprint.cu.
#include "batch_copy.hpp"

#include "ferry/sdk/cuda_scratch.hpp"
#include "ferry/sdk/fingerprint_cuda.cuh"

namespace ferry::cuda_ipc {
namespace {

constexpr unsigned kThreads = 256;
constexpr std::uint64_t kBytesPerBlockStep = kThreads * 16ull * 4;  // 4 vectors per thread
constexpr unsigned kMaxBlocksPerOp = 2048;

struct CopyBatch {
  CopyOp ops[kMaxCopyOps];
};

__global__ void __launch_bounds__(kThreads) batch_copy_kernel(const CopyBatch batch) {
  const CopyOp op = batch.ops[blockIdx.y];
  const auto* src = static_cast<const unsigned char*>(op.src);
  auto* dst = static_cast<unsigned char*>(op.dst);
  std::uint64_t bytes = op.bytes;
  const std::uint64_t stride = static_cast<std::uint64_t>(gridDim.x) * blockDim.x;
  const std::uint64_t first = static_cast<std::uint64_t>(blockIdx.x) * blockDim.x + threadIdx.x;
  const unsigned src_mis = static_cast<unsigned>(reinterpret_cast<std::uintptr_t>(src) & 15u);
  const unsigned dst_mis = static_cast<unsigned>(reinterpret_cast<std::uintptr_t>(dst) & 15u);
  if (src_mis != dst_mis) {
    for (std::uint64_t i = first; i < bytes; i += stride) dst[i] = src[i];
    return;
  }
  const std::uint64_t head = src_mis == 0 ? 0 : (16u - src_mis < bytes ? 16u - src_mis : bytes);
  for (std::uint64_t i = first; i < head; i += stride) dst[i] = src[i];
  src += head;
  dst += head;
  bytes -= head;
  const std::uint64_t vectors = bytes / 16;
  const auto* s4 = reinterpret_cast<const uint4*>(src);
  auto* d4 = reinterpret_cast<uint4*>(dst);
  std::uint64_t i = first;
  for (; i + 3 * stride < vectors; i += 4 * stride) {
    const uint4 a = s4[i];
    const uint4 b = s4[i + stride];
    const uint4 c = s4[i + 2 * stride];
    const uint4 d = s4[i + 3 * stride];
    d4[i] = a;
    d4[i + stride] = b;
    d4[i + 2 * stride] = c;
    d4[i + 3 * stride] = d;
  }
  for (; i < vectors; i += stride) d4[i] = s4[i];
  for (std::uint64_t t = vectors * 16 + first; t < bytes; t += stride) dst[t] = src[t];
}

namespace fp = ferry::sdk::fingerprint_cuda;

constexpr unsigned kHashThreads = 64;  // combine, per block: 16 groups of fp::kGroup
constexpr unsigned kGroupsPerBlock = kHashThreads / fp::kGroup;
static_assert(kHashThreads % 32 == 0 && 32 % fp::kGroup == 0, "a group must lie within one warp");
// Copy, per block: 8 chunks, one per warp. Measured on an H200 over Qwen3-8B's tensors, 8 warps
// with 8 units in flight per lane reached 0.87-1.03 of one cudaMemcpy of the same bytes
// (docs/benchmarks.md, "The fingerprinting copy on real-model sizes").
constexpr unsigned kCopyWarps = 8;

// One op as the fingerprinting kernels see it: its chunks are global chunks first_chunk ..
// first_chunk + ceil(bytes / C) - 1 of the launch, their hashes hashes[first_chunk ..], each
// numbered from chunk_base (0 but for the pieces of a longer range).
struct HashedOp {
  const unsigned char* src;
  unsigned char* dst;
  std::uint64_t bytes;
  std::uint64_t first_chunk;
  std::uint64_t chunk_base;
};

// Both kernels' parameter (16 KiB for 512 ops, within the 32 KiB CUDA 12.1+ allows).
struct HashedBatch {
  const HashedOp* ops;     // `n` entries (device memory) in order of first_chunk
  std::uint64_t n;
  std::uint64_t chunks;    // of all ops together
  std::uint64_t* hashes;   // `chunks` entries (device scratch)
  std::uint64_t* results;  // `n` entries
};

// The op holding global chunk `g` (< b.chunks): the last one whose first_chunk <= g. Empty ops
// share their first_chunk with the next op, so the search never lands on one.
__device__ std::uint64_t find_op(const HashedBatch& b, std::uint64_t g) {
  std::uint64_t lo = 0;
  std::uint64_t hi = b.n - 1;
  while (lo < hi) {
    const std::uint64_t mid = lo + (hi - lo + 1) / 2;
    if (b.ops[mid].first_chunk <= g) {
      lo = mid;
    } else {
      hi = mid - 1;
    }
  }
  return lo;
}

// One warp per chunk of the launch: copies the chunk and sets hashes[g] = its hash (index in its
// op).
__global__ void __launch_bounds__(kCopyWarps * 32) copy_chunk_kernel(const HashedBatch b) {
  __shared__ std::uint64_t scratch[kCopyWarps][fp::kWarpScratchWords];
  const unsigned warp = threadIdx.x / 32;
  const unsigned lane = threadIdx.x % 32;
  const std::uint64_t g = static_cast<std::uint64_t>(blockIdx.x) * kCopyWarps + warp;
  if (g >= b.chunks) return;  // a whole warp
  const HashedOp op = b.ops[find_op(b, g)];
  const std::uint64_t index = g - op.first_chunk;
  const std::uint64_t begin = index * fp::kChunkBytes;
  const std::uint64_t rest = op.bytes - begin;
  const std::uint64_t len = rest < fp::kChunkBytes ? rest : fp::kChunkBytes;
  const std::uint64_t h = fp::warp_chunk_hash(op.src + begin, len, op.chunk_base + index, lane,
                                              scratch[warp], fp::CopyTo{op.dst + begin});
  if (lane == 0) b.hashes[g] = h;
}

// One group per op: results[i] = XXH64(its chunk hashes as little-endian u64, seed = bytes).
__global__ void __launch_bounds__(kHashThreads) combine_kernel(const HashedBatch b) {
  const std::uint64_t i =
      static_cast<std::uint64_t>(blockIdx.x) * kGroupsPerBlock + threadIdx.x / fp::kGroup;
  const unsigned lane = threadIdx.x % fp::kGroup;
  const bool active = i < b.n;
  HashedOp op{nullptr, nullptr, 0, 0, 0};
  if (active) op = b.ops[i];
  const std::uint64_t chunks = (op.bytes + fp::kChunkBytes - 1) / fp::kChunkBytes;
  // An empty op reads nothing (and `hashes` is null when every op is empty): XXH64 of no bytes.
  const auto* p =
      chunks > 0 ? reinterpret_cast<const unsigned char*>(b.hashes + op.first_chunk) : nullptr;
  const std::uint64_t h = fp::group_hash(p, chunks * sizeof(std::uint64_t), op.bytes, lane, active);
  if (active && lane == 0) b.results[i] = h;
}

unsigned hash_blocks_for(std::uint64_t groups) {
  return static_cast<unsigned>((groups + kGroupsPerBlock - 1) / kGroupsPerBlock);
}

}  // namespace

cudaError_t launch_batch_copy(const CopyOp* ops, std::size_t n, cudaStream_t stream) {
  if (n == 0) return cudaSuccess;
  if (n > kMaxCopyOps) return cudaErrorInvalidValue;
  CopyBatch batch{};
  std::uint64_t largest = 0;
  for (std::size_t i = 0; i < n; ++i) {
    batch.ops[i] = ops[i];
    if (ops[i].bytes > largest) largest = ops[i].bytes;
  }
  std::uint64_t blocks = (largest + kBytesPerBlockStep - 1) / kBytesPerBlockStep;
  if (blocks == 0) blocks = 1;
  if (blocks > kMaxBlocksPerOp) blocks = kMaxBlocksPerOp;
  const dim3 grid(static_cast<unsigned>(blocks), static_cast<unsigned>(n));
  batch_copy_kernel<<<grid, kThreads, 0, stream>>>(batch);
  return cudaGetLastError();
}

std::size_t fingerprinted_copy_staging_bytes(std::size_t n) { return n * sizeof(HashedOp); }

std::uint64_t fingerprinted_copy_chunks(const CopyOp* ops, std::size_t n) {
  std::uint64_t chunks = 0;
  for (std::size_t i = 0; i < n; ++i) {
    chunks += ops[i].bytes / fp::kChunkBytes + (ops[i].bytes % fp::kChunkBytes != 0 ? 1 : 0);
  }
  return chunks;
}

cudaError_t launch_fingerprinted_copy(const CopyOp* ops, std::size_t n,
                                      std::uint64_t* device_results, void* pinned_staging,
                                      cudaStream_t stream, const std::uint64_t* chunk_bases,
                                      std::uint64_t* host_chunk_hashes) {
  if (n == 0) return cudaSuccess;
  if (device_results == nullptr || pinned_staging == nullptr) return cudaErrorInvalidValue;
  auto* table = static_cast<HashedOp*>(pinned_staging);
  HashedBatch batch{};
  std::uint64_t chunks = 0;
  for (std::size_t i = 0; i < n; ++i) {
    table[i] = {static_cast<const unsigned char*>(ops[i].src),
                static_cast<unsigned char*>(ops[i].dst), ops[i].bytes, chunks,
                chunk_bases != nullptr ? chunk_bases[i] : 0};
    // ceil(bytes / C) without overflowing near 2^64.
    chunks += ops[i].bytes / fp::kChunkBytes + (ops[i].bytes % fp::kChunkBytes != 0 ? 1 : 0);
  }
  // The grids are 1-D: 2^31 - 1 blocks.
  constexpr std::uint64_t kMaxGroups = 0x7fffffffull * kGroupsPerBlock;
  constexpr std::uint64_t kMaxChunks = 0x7fffffffull * kCopyWarps;
  if (chunks > kMaxChunks) return cudaErrorInvalidValue;
  if (n > kMaxGroups) return cudaErrorInvalidValue;
  batch.n = n;
  batch.chunks = chunks;
  batch.results = device_results;
  // One scratch allocation: the op table, then a hash per chunk.
  const std::size_t table_bytes = fingerprinted_copy_staging_bytes(n);
  unsigned char* scratch = nullptr;
  cudaError_t err = ferry::sdk::scratch_alloc_async(reinterpret_cast<void**>(&scratch),
                                    table_bytes + chunks * sizeof(std::uint64_t), stream);
  if (err != cudaSuccess) return err;
  batch.ops = reinterpret_cast<const HashedOp*>(scratch);
  batch.hashes = chunks > 0 ? reinterpret_cast<std::uint64_t*>(scratch + table_bytes) : nullptr;
  err = cudaMemcpyAsync(scratch, table, table_bytes, cudaMemcpyHostToDevice, stream);
  if (err == cudaSuccess && chunks > 0) {
    const auto blocks = static_cast<unsigned>((chunks + kCopyWarps - 1) / kCopyWarps);
    copy_chunk_kernel<<<blocks, kCopyWarps * 32, 0, stream>>>(batch);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess) {
    combine_kernel<<<hash_blocks_for(n), kHashThreads, 0, stream>>>(batch);
    err = cudaGetLastError();
  }
  if (err == cudaSuccess && host_chunk_hashes != nullptr && chunks > 0) {
    err = cudaMemcpyAsync(host_chunk_hashes, batch.hashes, chunks * sizeof(std::uint64_t),
                          cudaMemcpyDeviceToHost, stream);
  }
  const cudaError_t free_err = cudaFreeAsync(scratch, stream);
  if (err == cudaSuccess) err = free_err;
  return err;
}

}  // namespace ferry::cuda_ipc
