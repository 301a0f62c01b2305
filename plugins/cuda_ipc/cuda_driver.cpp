// cuda_ipc/cuda_driver.cpp: run-time resolution of the driver entry points (see cuda_driver.hpp).
#include "cuda_driver.hpp"

#include <ferry/sdk/error.hpp>

#include <mutex>

namespace ferry::cuda_ipc {
namespace {

constexpr unsigned kDriverApiVersion = 12000;  // oldest CUDA whose signatures we use

template <typename Fn>
void load(const char* symbol, Fn& fn) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found = cudaDriverEntryPointSymbolNotFound;
  const cudaError_t err = cudaGetDriverEntryPointByVersion(symbol, &address, kDriverApiVersion,
                                                           cudaEnableDefault, &found);
  if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || address == nullptr) {
    (void)cudaGetLastError();
    fail(FERRY_STATUS_INTERNAL, "cuda_ipc: CUDA driver entry point {} is not available: {}",
         symbol, err != cudaSuccess ? cudaGetErrorName(err) : "symbol not found in this driver");
  }
  fn = reinterpret_cast<Fn>(address);
}

}  // namespace

const Driver& Driver::get() {
  static Driver driver;
  static std::once_flag once;
  static std::string failure;
  static ferry_status_code_t failure_code = FERRY_STATUS_OK;
  std::call_once(once, [] {
    try {
      int count = 0;
      const cudaError_t err = cudaGetDeviceCount(&count);
      if (err != cudaSuccess || count == 0) {
        (void)cudaGetLastError();
        fail(FERRY_STATUS_NOT_FOUND, "cuda_ipc: no CUDA device is visible ({})",
             err != cudaSuccess ? cudaGetErrorName(err) : "0 devices");
      }
      Driver d;
      load("cuGetErrorName", d.get_error_name);
      load("cuMemGetAllocationGranularity", d.granularity);
      load("cuMemAddressReserve", d.address_reserve);
      load("cuMemAddressFree", d.address_free);
      load("cuMemRelease", d.release);
      load("cuMemMap", d.map);
      load("cuMemUnmap", d.unmap);
      load("cuMemSetAccess", d.set_access);
      load("cuMemRetainAllocationHandle", d.retain);
      load("cuMemGetAddressRange", d.address_range);
      load("cuMemExportToShareableHandle", d.export_handle);
      load("cuMemImportFromShareableHandle", d.import_handle);
      load("cuMemGetAllocationPropertiesFromHandle", d.properties);
      driver = d;
    } catch (const Error& e) {
      failure = e.what();
      failure_code = e.code();
    }
  });
  if (failure_code != FERRY_STATUS_OK) throw Error(failure_code, failure);
  return driver;
}

std::string Driver::name(CUresult result) const {
  const char* text = nullptr;
  if (get_error_name == nullptr || get_error_name(result, &text) != CUDA_SUCCESS ||
      text == nullptr) {
    return fmt::format("CUresult {}", static_cast<int>(result));
  }
  return text;
}

void check_cu(CUresult result, const char* what) {
  if (result == CUDA_SUCCESS) return;
  fail(result == CUDA_ERROR_OUT_OF_MEMORY ? FERRY_STATUS_OUT_OF_MEMORY : FERRY_STATUS_INTERNAL,
       "cuda_ipc: {} failed: {}", what, Driver::get().name(result));
}

void check_rt(cudaError_t err, const char* what) {
  if (err == cudaSuccess) return;
  (void)cudaGetLastError();
  fail(err == cudaErrorMemoryAllocation ? FERRY_STATUS_OUT_OF_MEMORY : FERRY_STATUS_INTERNAL,
       "cuda_ipc: {} failed: {} ({})", what, cudaGetErrorString(err), cudaGetErrorName(err));
}

DeviceScope::DeviceScope(int device) : device_(device) {
  if (cudaGetDevice(&previous_) != cudaSuccess) {
    (void)cudaGetLastError();
    previous_ = -1;
  }
  if (previous_ != device_) check_rt(cudaSetDevice(device_), "cudaSetDevice");
}

DeviceScope::~DeviceScope() {
  if (previous_ >= 0 && previous_ != device_) (void)cudaSetDevice(previous_);
}

}  // namespace ferry::cuda_ipc
