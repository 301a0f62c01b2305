// Fingerprint of one parameter by memory kind (see update/param_fingerprint.hpp).
#include "update/param_fingerprint.hpp"

#include <ferry/kernels/cpu.hpp>
#include <ferry/sdk/error.hpp>

#if FERRY_UPDATE_HAVE_CUDA
#include <ferry/kernels/cuda.hpp>

#include "update/cuda_apply.hpp"
#endif

namespace ferry::update {

std::uint64_t fingerprint_param(const store::ParamInfo& param, unsigned threads) {
  if (param.memory_kind != FERRY_MEMORY_CUDA) {
    return kernels::fingerprint_cpu(param.data, param.bytes, threads);
  }
#if FERRY_UPDATE_HAVE_CUDA
  int previous = -1;
  (void)cudaGetDevice(&previous);
  const int device = CudaApplier::device_of(param.data);
  if (device != previous && cudaSetDevice(device) != cudaSuccess) {
    fail(FERRY_STATUS_INTERNAL, "fingerprint of '{}': cannot select CUDA device {}", param.name,
         device);
  }
  try {
    const std::uint64_t value =
        kernels::fingerprint_cuda(param.data, param.bytes, cudaStreamPerThread);
    if (previous >= 0 && previous != device) (void)cudaSetDevice(previous);
    return value;
  } catch (...) {
    if (previous >= 0 && previous != device) (void)cudaSetDevice(previous);
    throw;
  }
#else
  (void)threads;
  fail(FERRY_STATUS_UNIMPLEMENTED, "parameter '{}' is in CUDA memory but this build has no CUDA",
       param.name);
#endif
}

}  // namespace ferry::update
