// Device names, checks and the store for a device (see store/store_device.hpp).
#include "store/store_device.hpp"

#include "store/cpu_weight_store.hpp"
#if FERRY_STORE_HAVE_CUDA
#include "store/cuda_weight_store.hpp"

#include <cuda_runtime_api.h>
#endif

#include <ferry/sdk/error.hpp>

#include <charconv>

namespace ferry::store {

std::string StoreDevice::name() const { return cuda ? "cuda:" + std::to_string(ordinal) : "cpu"; }

StoreDevice parse_store_device(const std::string& name) {
  if (name == "cpu") return {};
  if (name == "cuda") return {true, 0};
  if (name.starts_with("cuda:")) {
    const char* first = name.data() + 5;
    const char* last = name.data() + name.size();
    int ordinal = -1;
    const auto [end, ec] = std::from_chars(first, last, ordinal);
    if (ec == std::errc() && end == last && first != last && ordinal >= 0) return {true, ordinal};
  }
  fail(FERRY_STATUS_INVALID_ARGUMENT, "device '{}' is not cpu, cuda or cuda:N", name);
}

void check_store_device(const StoreDevice& device) {
  if (!device.cuda) return;
#if FERRY_STORE_HAVE_CUDA
  int count = 0;
  const cudaError_t err = cudaGetDeviceCount(&count);
  if (err != cudaSuccess) {
    (void)cudaGetLastError();
    fail(FERRY_STATUS_NOT_FOUND, "device '{}': no CUDA device is usable here ({})", device.name(),
         cudaGetErrorString(err));
  }
  if (device.ordinal >= count) {
    fail(FERRY_STATUS_NOT_FOUND, "device '{}': only {} CUDA device(s) are visible", device.name(),
         count);
  }
#else
  fail(FERRY_STATUS_UNIMPLEMENTED,
       "device '{}': this ferry was built without CUDA support (-Dcuda=disabled); use cpu",
       device.name());
#endif
}

std::unique_ptr<WeightStore> make_weight_store(const StoreDevice& device, unsigned copy_threads) {
  check_store_device(device);
#if FERRY_STORE_HAVE_CUDA
  if (device.cuda) {
    CudaWeightStoreOptions options;
    options.device = device.ordinal;
    return std::make_unique<CudaWeightStore>(options);
  }
#endif
  return std::make_unique<CpuWeightStore>(CpuWeightStoreOptions{copy_threads});
}

}  // namespace ferry::store
