// store/store_device.hpp: where a receiver keeps its weights: parses a device name ("cpu",
// "cuda", "cuda:N"), checks this build and machine can use it, and creates the weight store for it
// (CpuWeightStore, or CudaWeightStore on GPU N).
#pragma once

#include "store/weight_store.hpp"

#include <memory>
#include <string>

namespace ferry::store {

struct StoreDevice {
  bool cuda = false;
  int ordinal = 0;  // CUDA device ordinal ("cuda" is "cuda:0")
  std::string name() const;  // "cpu" or "cuda:N"
};

// INVALID_ARGUMENT naming the value when it is not cpu, cuda or cuda:N.
StoreDevice parse_store_device(const std::string& name);

// UNIMPLEMENTED when `device` is CUDA and this build has no CUDA support; NOT_FOUND when the CUDA
// device is not visible (naming how many are).
void check_store_device(const StoreDevice& device);

// A new, empty store on `device` (checked first). `copy_threads` as CpuWeightStoreOptions.
std::unique_ptr<WeightStore> make_weight_store(const StoreDevice& device, unsigned copy_threads);

}  // namespace ferry::store
