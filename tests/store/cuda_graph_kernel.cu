// tests/store/cuda_graph_kernel.cu: the word-sum kernel the CUDA store tests capture into a graph
// (see cuda_graph_kernel.hpp).
#include "cuda_graph_kernel.hpp"

namespace ferry::store::testing {
namespace {

__global__ void word_sum_kernel(const unsigned int* words, unsigned long long count,
                                unsigned long long* out) {
  unsigned long long local = 0;
  const unsigned long long stride = static_cast<unsigned long long>(gridDim.x) * blockDim.x;
  for (unsigned long long i =
           static_cast<unsigned long long>(blockIdx.x) * blockDim.x + threadIdx.x;
       i < count; i += stride) {
    local += words[i];
  }
  atomicAdd(out, local);
}

}  // namespace

cudaError_t enqueue_word_sum(const void* words, std::uint64_t count, unsigned long long* out,
                             cudaStream_t stream) {
  cudaError_t err = cudaMemsetAsync(out, 0, sizeof(*out), stream);
  if (err != cudaSuccess) return err;
  word_sum_kernel<<<264, 256, 0, stream>>>(static_cast<const unsigned int*>(words), count, out);
  return cudaGetLastError();
}

}  // namespace ferry::store::testing
