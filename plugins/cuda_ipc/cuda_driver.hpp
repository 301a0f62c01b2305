// cuda_ipc/cuda_driver.hpp: the CUDA driver entry points the CUDA IPC transport uses (VMM export,
// import and mapping), resolved at run time through cudaGetDriverEntryPointByVersion rather than
// by linking libcuda, so the plugin loads (and answers get_caps) on a machine without a driver.
#pragma once

#include <cuda.h>
#include <cudaTypedefs.h>
#include <cuda_runtime_api.h>

#include <string>

namespace ferry::cuda_ipc {

struct Driver {
  PFN_cuGetErrorName_v6000 get_error_name = nullptr;
  PFN_cuMemGetAllocationGranularity_v10020 granularity = nullptr;
  PFN_cuMemAddressReserve_v10020 address_reserve = nullptr;
  PFN_cuMemAddressFree_v10020 address_free = nullptr;
  PFN_cuMemRelease_v10020 release = nullptr;
  PFN_cuMemMap_v10020 map = nullptr;
  PFN_cuMemUnmap_v10020 unmap = nullptr;
  PFN_cuMemSetAccess_v10020 set_access = nullptr;
  PFN_cuMemRetainAllocationHandle_v11000 retain = nullptr;
  PFN_cuMemGetAddressRange_v3020 address_range = nullptr;
  PFN_cuMemExportToShareableHandle_v10020 export_handle = nullptr;
  PFN_cuMemImportFromShareableHandle_v10020 import_handle = nullptr;
  PFN_cuMemGetAllocationPropertiesFromHandle_v10020 properties = nullptr;

  // The table, loaded once (thread-safe). INTERNAL naming the symbol when the driver lacks one,
  // NOT_FOUND when there is no CUDA device at all.
  static const Driver& get();
  // "CUDA_ERROR_INVALID_VALUE" for a result.
  std::string name(CUresult result) const;
};

// Throws INTERNAL (OUT_OF_MEMORY for allocation failures) for a driver result, naming `what`.
void check_cu(CUresult result, const char* what);
// Same for the runtime API; clears the sticky last error.
void check_rt(cudaError_t err, const char* what);

// Makes `device` current on this thread for the scope and restores the previous one after.
class DeviceScope {
 public:
  explicit DeviceScope(int device);
  ~DeviceScope();
  DeviceScope(const DeviceScope&) = delete;
  DeviceScope& operator=(const DeviceScope&) = delete;

 private:
  int device_;
  int previous_ = -1;
};

}  // namespace ferry::cuda_ipc
