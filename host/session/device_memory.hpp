// session/device_memory.hpp: which CUDA allocation holds a pointer, and whether it is still the
// same allocation. A sender's tensor lent to a receiver (reads in place) is registered once per
// kept session; the registration, and the receiver's mapping of it, stand for the allocation
// under the tensor at that time. A trainer that frees its tensors and allocates new ones at the
// same addresses (torch's empty_cache, an offload and reload, a VMM allocator that remaps) puts
// other memory under the same range: the registration must go.
#pragma once

#include <cstdint>
#include <optional>

namespace ferry::session {

struct DeviceAllocation {
  std::uintptr_t base = 0;  // where the allocation (a VMM mapping: its mapped piece) begins
  // Unique in this process for as long as the allocation lives (its CUDA buffer id; for VMM
  // memory, with the physical allocation's handle).
  std::uint64_t identity = 0;
  std::uint64_t handle = 0;
};

// The allocation holding device pointer `p` (the current device's context); nullopt where CUDA
// cannot say (a build without CUDA, no driver, not device memory).
std::optional<DeviceAllocation> device_allocation(const void* p);

// Whether allocation `a` is still the one at its base: the same buffer id (one driver call), and
// for VMM memory the same physical allocation mapped there.
bool still_allocated(const DeviceAllocation& a);

}  // namespace ferry::session
