// Fingerprints of many device ranges of one GPU, their kernels spread over a pool of streams
// (see session/device_fingerprints.hpp).
#include "session/device_fingerprints.hpp"

#include <ferry/sdk/error.hpp>

#include "ferry_build_config.h"
#if FERRY_HAVE_CUDA
#include <cuda_runtime.h>
#include <ferry/sdk/cuda_scratch.hpp>

#include <ferry/kernels/cuda.hpp>
#endif

#include <algorithm>

namespace ferry::session {

std::vector<std::uint64_t> fingerprint_device_ranges(int device,
                                                     std::span<const void* const> data,
                                                     std::span<const std::uint64_t> bytes,
                                                     const std::string& what) {
  const std::size_t n = std::min(data.size(), bytes.size());
  std::vector<std::uint64_t> values(n, 0);
  if (n == 0) return values;
#if FERRY_HAVE_CUDA
  auto check = [&](cudaError_t e, const char* call) {
    if (e != cudaSuccess) {
      (void)cudaGetLastError();
      fail(FERRY_STATUS_IO, "{}: fingerprints on CUDA device {}: {}: {}", what, device, call,
           cudaGetErrorString(e));
    }
  };
  int previous = -1;
  if (cudaGetDevice(&previous) != cudaSuccess) {
    (void)cudaGetLastError();
    previous = -1;
  }
  check(cudaSetDevice(device), "cudaSetDevice");
  cudaStream_t stream = nullptr;
  cudaEvent_t produced = nullptr;
  std::uint64_t* results = nullptr;
  auto cleanup = [&]() noexcept {
    if (results != nullptr) (void)cudaFreeAsync(results, stream);
    if (stream != nullptr) (void)cudaStreamSynchronize(stream);
    if (produced != nullptr) (void)cudaEventDestroy(produced);
    if (stream != nullptr) (void)cudaStreamDestroy(stream);
    (void)cudaGetLastError();
    if (previous >= 0 && previous != device) (void)cudaSetDevice(previous);
  };
  try {
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreate");
    // The ranges' producers (a trainer's kernels, a cudaMemcpy from pageable memory that returned
    // before its DMA landed) ran on the device's default stream: read after them.
    check(cudaEventCreateWithFlags(&produced, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventRecord(produced, cudaStreamLegacy), "cudaEventRecord");
    check(cudaStreamWaitEvent(stream, produced, 0), "cudaStreamWaitEvent");
    check(ferry::sdk::scratch_alloc_async(reinterpret_cast<void**>(&results),
                                          n * sizeof(std::uint64_t), stream),
          "cudaMallocAsync");
    kernels::fingerprint_many_cuda_async(data.first(n), bytes.first(n), results, stream);
    check(cudaMemcpyAsync(values.data(), results, n * sizeof(std::uint64_t),
                          cudaMemcpyDeviceToHost, stream),
          "cudaMemcpyAsync");
    check(cudaFreeAsync(results, stream), "cudaFreeAsync");
    results = nullptr;
    check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  } catch (...) {
    cleanup();
    throw;
  }
  cleanup();
  return values;
#else
  (void)device;
  fail(FERRY_STATUS_UNIMPLEMENTED, "{}: {} ranges are in CUDA memory (no CUDA in this build)",
       what, n);
#endif
}

}  // namespace ferry::session
