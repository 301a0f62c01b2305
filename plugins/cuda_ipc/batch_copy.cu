// cuda_ipc/batch_copy.cu: the batched copy kernel (see batch_copy.hpp). Block row y copies op y;
// the blocks of a row stride over it with 16-byte loads and stores where source and destination
// are equally aligned (head and tail bytewise), bytewise otherwise.
#include "batch_copy.hpp"

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

}  // namespace ferry::cuda_ipc
