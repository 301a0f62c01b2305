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

GatherMemory::~GatherMemory() { release_device(); }

void GatherMemory::release_device() noexcept {
#if FERRY_HAVE_CUDA
  if (device_ != nullptr || stream_ != nullptr) {
    cudaSetDevice(device_id_);
    if (stream_ != nullptr) cudaStreamDestroy(static_cast<cudaStream_t>(stream_));
    if (device_ != nullptr) cudaFree(device_);
  }
#endif
  device_ = nullptr;
  stream_ = nullptr;
  device_bytes_ = 0;
  device_id_ = -1;
}

void GatherMemory::reserve(std::uint64_t host_bytes, std::uint64_t device_bytes, int device) {
  if (host_.size() < host_bytes) {
    try {
      host_ = std::vector<std::byte>(host_bytes);
    } catch (const std::bad_alloc&) {
      fail(FERRY_STATUS_OUT_OF_MEMORY,
           "push: {} bytes of host memory for the column pieces a receiver needs", host_bytes);
    }
  }
  if (device_bytes == 0 || (device_bytes <= device_bytes_ && device == device_id_)) return;
#if FERRY_HAVE_CUDA
  release_device();
  cudaError_t e = cudaSetDevice(device);
  cudaStream_t stream = nullptr;
  if (e == cudaSuccess) e = cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking);
  if (e == cudaSuccess) {
    stream_ = stream;
    device_id_ = device;
    e = cudaMalloc(&device_, device_bytes);
  }
  if (e != cudaSuccess) {
    device_ = nullptr;
    release_device();
    fail(FERRY_STATUS_OUT_OF_MEMORY,
         "push: {} bytes of CUDA device {} memory for the column pieces a receiver needs: {}",
         device_bytes, device, cudaGetErrorString(e));
  }
  device_bytes_ = device_bytes;
#else
  fail(FERRY_STATUS_UNIMPLEMENTED, "push: CUDA tensors (no CUDA in this build)");
#endif
}

void GatherMemory::gather(std::byte* dst, const TensorView& t, std::uint64_t row0,
                          std::uint64_t rows, std::uint64_t col0, std::uint64_t cols) {
  const std::uint64_t elem = dtype_size(t.dtype);
  const std::uint64_t pitch = t.shape[1] * elem;
  const auto* src = static_cast<const std::byte*>(t.data) + row0 * pitch + col0 * elem;
  const std::uint64_t width = cols * elem;
  if (rows == 0 || width == 0) return;
  if (t.memory_kind != FERRY_MEMORY_CUDA) {
    for (std::uint64_t r = 0; r < rows; ++r) std::memcpy(dst + r * width, src + r * pitch, width);
    return;
  }
#if FERRY_HAVE_CUDA
  const cudaError_t e = cudaMemcpy2DAsync(dst, width, src, pitch, width, rows,
                                          cudaMemcpyDeviceToDevice,
                                          static_cast<cudaStream_t>(stream_));
  if (e != cudaSuccess) {
    fail(FERRY_STATUS_IO, "push: gathering columns [{}, {}) of tensor '{}' failed: {}", col0,
         col0 + cols, t.name, cudaGetErrorString(e));
  }
#else
  fail(FERRY_STATUS_UNIMPLEMENTED, "push: tensor '{}' is in CUDA memory (no CUDA in this build)",
       t.name);
#endif
}

void GatherMemory::wait() {
#if FERRY_HAVE_CUDA
  if (stream_ == nullptr) return;
  cudaSetDevice(device_id_);
  const cudaError_t e = cudaStreamSynchronize(static_cast<cudaStream_t>(stream_));
  if (e != cudaSuccess) {
    fail(FERRY_STATUS_IO, "push: gathering the column pieces a receiver needs failed: {}",
         cudaGetErrorString(e));
  }
#endif
}

}  // namespace ferry::session
