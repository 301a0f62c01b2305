// Which CUDA allocation holds a pointer (see session/device_memory.hpp): the driver's address
// range and buffer id, and for VMM memory the physical allocation's handle, reached through
// cudaGetDriverEntryPointByVersion (the host links the runtime, not libcuda).
#include "session/device_memory.hpp"

#include "ferry_build_config.h"
#if FERRY_HAVE_CUDA
#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime.h>
#endif

namespace ferry::session {

#if FERRY_HAVE_CUDA
namespace {

struct Driver {
  PFN_cuMemGetAddressRange_v3020 address_range = nullptr;
  PFN_cuPointerGetAttribute_v4000 attribute = nullptr;
  PFN_cuMemRetainAllocationHandle_v11000 retain = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  bool loaded = false;
};

template <typename Fn>
bool load(const char* symbol, Fn& fn) {
  void* address = nullptr;
  cudaDriverEntryPointQueryResult found{};
  const cudaError_t err =
      cudaGetDriverEntryPointByVersion(symbol, &address, 12000, cudaEnableDefault, &found);
  if (err != cudaSuccess || found != cudaDriverEntryPointSuccess || address == nullptr) {
    (void)cudaGetLastError();
    return false;
  }
  fn = reinterpret_cast<Fn>(address);
  return true;
}

const Driver& driver() {
  static const Driver d = [] {
    Driver out;
    out.loaded = load("cuMemGetAddressRange", out.address_range) &&
                 load("cuPointerGetAttribute", out.attribute) &&
                 load("cuMemRetainAllocationHandle", out.retain) &&
                 load("cuMemRelease", out.release);
    return out;
  }();
  return d;
}

}  // namespace

std::optional<DeviceAllocation> device_allocation(const void* p) {
  const Driver& d = driver();
  if (!d.loaded || p == nullptr) return std::nullopt;
  const auto at = reinterpret_cast<CUdeviceptr>(p);
  CUdeviceptr base = 0;
  std::size_t bytes = 0;
  if (d.address_range(&base, &bytes, at) != CUDA_SUCCESS) return std::nullopt;
  DeviceAllocation out;
  out.base = static_cast<std::uintptr_t>(base);
  unsigned long long id = 0;
  if (d.attribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, base) != CUDA_SUCCESS) return std::nullopt;
  out.identity = id;
  // VMM memory: the physical allocation mapped there (a remap at the same addresses maps another
  // one, while whoever still maps the old one keeps it alive, so its handle is not reused).
  CUmemGenericAllocationHandle handle = 0;
  if (d.retain(&handle, reinterpret_cast<void*>(base)) == CUDA_SUCCESS) {
    out.handle = static_cast<std::uint64_t>(handle);
    (void)d.release(handle);
  }
  return out;
}

bool still_allocated(const DeviceAllocation& a) {
  const Driver& d = driver();
  if (!d.loaded) return true;  // (device_allocation said nothing then)
  const auto base = static_cast<CUdeviceptr>(a.base);
  unsigned long long id = 0;
  if (d.attribute(&id, CU_POINTER_ATTRIBUTE_BUFFER_ID, base) != CUDA_SUCCESS || id != a.identity) {
    return false;
  }
  if (a.handle == 0) return true;
  CUmemGenericAllocationHandle handle = 0;
  if (d.retain(&handle, reinterpret_cast<void*>(a.base)) != CUDA_SUCCESS) return false;
  (void)d.release(handle);
  return static_cast<std::uint64_t>(handle) == a.handle;
}
#else
std::optional<DeviceAllocation> device_allocation(const void*) {
  return std::nullopt;
}
bool still_allocated(const DeviceAllocation&) {
  return true;
}
#endif

}  // namespace ferry::session
