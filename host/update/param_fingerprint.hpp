// update/param_fingerprint.hpp: the fingerprint (xxh64-interleaved-v1, docs/fingerprint.md) of one
// parameter wherever it lives: the CPU kernel for host memory, the CUDA kernel for device memory
// (the same value either way).
#pragma once

#include "store/weight_store.hpp"

#include <cstdint>

namespace ferry::update {

// Fingerprints `param`'s bytes as they are now. Device parameters are hashed on their device
// (synchronously); UNIMPLEMENTED for device memory in a build without CUDA. `threads` is for the
// CPU kernel (0: the hardware count). Any thread.
std::uint64_t fingerprint_param(const store::ParamInfo& param, unsigned threads = 0);

}  // namespace ferry::update
