// ferry/kernels/cuda.hpp: the CUDA data-movement kernels (built with the cuda feature). Each has a
// CPU twin in cpu.hpp and produces the same bytes for the same input (NaN payloads through
// F64 <-> F32 excepted: the GPU may return the canonical NaN there).
//
// Pointers in EntryView / ParamView and `data` are device pointers (or memory a kernel on the
// stream's device may access). Functions enqueue work on `stream` and return before it runs,
// except where a comment says they synchronize; inputs must stay valid and unchanged until the
// stream reaches the work. Errors (a bad plan, a failed CUDA call) throw ferry::Error. Any
// thread; concurrent calls on different streams are independent.
#pragma once

#include "ferry/kernels/cpu.hpp"

#include <cuda_runtime_api.h>

#include <cstdint>
#include <span>

namespace ferry::kernels {

// Executes `ops` like scatter_cpu, in one kernel launch for all ops. The plan is validated on
// the host with check_plan before anything is enqueued (a bad op throws INVALID_ARGUMENT and
// nothing is written). The op table is copied to the device (stream-ordered allocation), so the
// host spans may be freed when this returns.
void scatter_cuda(std::span<const ferry_plan_op_t> ops, std::span<const EntryView> entries,
                  std::span<const ParamView> params, cudaStream_t stream);

// Enqueues xxh64-chunked-v1 (docs/fingerprint.md) of `bytes` bytes at device address `data`;
// the value is written to `device_result` (device memory, 8 bytes) when the stream gets there.
void fingerprint_cuda_async(const void* data, std::uint64_t bytes, std::uint64_t* device_result,
                            cudaStream_t stream);

// The same, waiting for the stream and returning the value (synchronizes `stream`).
std::uint64_t fingerprint_cuda(const void* data, std::uint64_t bytes, cudaStream_t stream);

}  // namespace ferry::kernels
