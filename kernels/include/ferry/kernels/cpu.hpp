// ferry/kernels/cpu.hpp: the CPU data-movement kernels. They are the reference twins of the CUDA
// kernels (kernels/cuda/): a CUDA kernel must produce the same bytes for the same inputs.
//
//  - scatter: executes a plan (ferry_plan_op_t list) from one bucket into many parameters, with
//    dtype casts (round-to-nearest-even), in one call per bucket, parallel over threads.
//  - fingerprint: the xxh64-chunked-v1 algorithm of docs/fingerprint.md.
#pragma once

#include <ferry/plugin.h>

#include <cstddef>
#include <cstdint>
#include <span>

namespace ferry::kernels {

// Where one parameter of the target layout lives.
struct ParamView {
  std::byte* data = nullptr;
  ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
  std::uint64_t elements = 0;
};

// Executes `ops` reading from the bucket entries (`entries[i]` = first byte of manifest entry i,
// with `entry_elements[i]` elements) into `params`. Every op is bounds-checked against its source
// entry and destination parameter before any byte is written; a bad op throws ferry::Error
// (INVALID_ARGUMENT) naming the op and nothing is written. `threads` = 0 uses the hardware count.
void scatter_cpu(std::span<const ferry_plan_op_t> ops, std::span<const std::byte* const> entries,
                 std::span<const std::uint64_t> entry_elements, std::span<const ParamView> params,
                 unsigned threads = 0);

// Bytes of the fingerprint chunking (docs/fingerprint.md).
inline constexpr std::uint64_t kFingerprintChunkBytes = 1ull << 20;

// xxh64-chunked-v1 of `bytes` bytes at `data`. `threads` = 0 uses the hardware count.
std::uint64_t fingerprint_cpu(const void* data, std::uint64_t bytes, unsigned threads = 0);

// Scalar conversions shared by scatter and tests (round-to-nearest-even, NaN preserved).
float bf16_to_f32(std::uint16_t v) noexcept;
std::uint16_t f32_to_bf16(float v) noexcept;
float f16_to_f32(std::uint16_t v) noexcept;
std::uint16_t f32_to_f16(float v) noexcept;

}  // namespace ferry::kernels
