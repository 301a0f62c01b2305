// kernels/cpu/fp8_jobs.hpp (internal): an FP8 plan resolved into pointers, shared by the CPU twin
// (fp8.cpp) and the CUDA host side (cuda/fp8_api.cpp) so both execute the same tiles.
// Plain types only: nvcc-compiled code includes it too.
#pragma once

#include <cstdint>

namespace ferry::kernels::fp8_detail {

// One FP8 op after validation: rows x cols source elements quantized into whole 128x128 tiles.
// Strides and counts are in elements; `scales` points at the scale of the op's first tile and
// `scale_stride` is the number of scales per tile row of the parameter (ceil(K/128)).
struct Fp8Job {
  const unsigned char* src;
  unsigned char* dst;
  float* scales;
  std::uint64_t src_stride;
  std::uint64_t dst_stride;
  std::uint64_t rows;
  std::uint64_t cols;
  std::uint64_t scale_stride;
  std::uint64_t tile_cols;   // ceil(cols / 128)
  std::uint64_t first_tile;  // exclusive prefix sum of the tiles of the jobs before
  std::uint32_t src_dtype;   // ferry_dtype_t: BF16, F16 or F32
  std::uint32_t ue8m0;       // 1: power-of-two scales
};

}  // namespace ferry::kernels::fp8_detail

#if !defined(__CUDACC__)
#include "ferry/kernels/cpu.hpp"

#include <span>
#include <vector>

namespace ferry::kernels {
// Validates `ops` (check_plan, then the FP8 tile rules of cpu.hpp) and resolves them into jobs
// in op order (ops with no elements dropped). Throws INVALID_ARGUMENT naming the op.
std::vector<fp8_detail::Fp8Job> fp8_jobs(std::span<const ferry_plan_op_t> ops,
                                         std::span<const EntryView> entries,
                                         std::span<const ParamView> params);
}  // namespace ferry::kernels
#endif
