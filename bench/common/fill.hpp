// bench/common/fill.hpp: the boundary to the nvcc-compiled fill kernel of `ferry bench` (plain
// types only, so fill.cu needs no host-side headers). Built only with the cuda feature.
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

namespace ferry::bench {

// Enqueues on `stream` a kernel writing the pattern of data.hpp (fill_pattern_cpu's
// bytes) to `bytes` bytes of device memory at `data`. Returns the launch error, if any.
cudaError_t launch_fill_pattern(void* data, std::uint64_t bytes, std::uint64_t seed,
                                cudaStream_t stream);

}  // namespace ferry::bench
