// The sender's fingerprints and host staging of pushed tensors (see
// session/sender/tensor_reads.hpp).
#include "session/sender/tensor_reads.hpp"

#include <ferry/kernels/cpu.hpp>
#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include "ferry_build_config.h"
#if FERRY_HAVE_CUDA
#include <cuda_runtime.h>
#endif

#include <cstring>
#include <map>

#include "session/device_fingerprints.hpp"

namespace ferry::session {

std::vector<std::uint64_t> fingerprint_tensors(std::span<const TensorView> tensors,
                                               unsigned threads) {
  std::vector<std::uint64_t> prints(tensors.size());
  std::map<int, std::vector<std::size_t>> by_device;
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    if (tensors[t].memory_kind == FERRY_MEMORY_CUDA) by_device[tensors[t].device].push_back(t);
  }
  for (const auto& [device, indices] : by_device) {
    std::vector<const void*> data;
    std::vector<std::uint64_t> bytes;
    data.reserve(indices.size());
    bytes.reserve(indices.size());
    for (std::size_t t : indices) {
      data.push_back(tensors[t].data);
      bytes.push_back(byte_size(tensors[t].dtype, tensors[t].shape).value_or(0));
    }
    const auto values = fingerprint_device_ranges(device, data, bytes, "push");
    for (std::size_t k = 0; k < indices.size(); ++k) prints[indices[k]] = values[k];
  }
  for (std::size_t t = 0; t < tensors.size(); ++t) {
    const auto& tensor = tensors[t];
    if (tensor.memory_kind == FERRY_MEMORY_CUDA) continue;
    const std::uint64_t size = byte_size(tensor.dtype, tensor.shape).value_or(0);
    prints[t] = kernels::fingerprint_cpu(tensor.data, size, threads);
  }
  return prints;
}

void copy_to_host(std::byte* dst, const TensorView& t, std::uint64_t size) {
  if (size == 0) return;
  if (t.memory_kind != FERRY_MEMORY_CUDA) {
    std::memcpy(dst, t.data, size);
    return;
  }
#if FERRY_HAVE_CUDA
  cudaError_t e = cudaSetDevice(t.device);
  if (e == cudaSuccess) e = cudaMemcpy(dst, t.data, size, cudaMemcpyDeviceToHost);
  if (e != cudaSuccess) {
    fail(FERRY_STATUS_IO, "push: copying tensor '{}' from CUDA device {} failed: {}", t.name,
         t.device, cudaGetErrorString(e));
  }
#else
  fail(FERRY_STATUS_UNIMPLEMENTED, "push: tensor '{}' is in CUDA memory (no CUDA in this build)",
       t.name);
#endif
}

}  // namespace ferry::session
