// ferry/kernels/fp8_block.hpp: the arithmetic of FP8 e4m3 128x128 block quantization, written
// once for the CPU twin (kernels/cpu/fp8.cpp) and the CUDA kernel (kernels/cuda/fp8.cu) so both
// produce the same bytes. Every function is __host__ __device__ under nvcc.
//
// For one block of source values w (bf16, f16 or f32, widened exactly to float32):
//   amax = max |w| over the block, NaN ignored (fmax semantics; order does not matter)
//   s    = max(amax, 1e-4f) / 448.0f               (float32, IEEE division, round to nearest even)
//   ue8m0: s is rounded up to the next power of two (unchanged when it already is one)
//   q    = e4m3(w / s)                              (float32 IEEE division, then RNE to e4m3fn
//                                                   with saturation to +-448; a NaN quotient -> the
//                                                   e4m3 NaN with w's sign)
// The scale tensor holds s, the dequantization multiplier (w ~= e4m3_to_f32(q) * s).
#pragma once

#include "ferry/kernels/float_bits.hpp"

#include <cstdint>

namespace ferry::kernels::fp8 {

inline constexpr std::uint64_t kBlock = 128;   // block edge, rows and columns
inline constexpr float kE4m3Max = 448.0f;      // largest finite e4m3fn value
inline constexpr float kAmaxFloor = 1e-4f;     // keeps all-zero blocks finite

// |a| folded into a running maximum; NaN never wins (so the order of folding is irrelevant).
FERRY_HD float fold_amax(float running, float v) {
  const float a = v < 0.0f ? -v : v;
  return a > running ? a : running;  // false for NaN: keeps running
}

// The block scale s from the block's amax (see the file comment).
FERRY_HD float block_scale(float amax, bool ue8m0) {
  const float floored = amax > kAmaxFloor ? amax : kAmaxFloor;
#if defined(__CUDA_ARCH__)
  float s = __fdiv_rn(floored, kE4m3Max);
#else
  float s = floored / kE4m3Max;
#endif
  if (ue8m0) {
    // s is a positive normal or +inf here; a set mantissa bit means "not a power of two".
    std::uint32_t u = bits::f32_bits(s);
    if ((u & 0x7fffffu) != 0) u = (u & 0xff800000u) + 0x800000u;
    s = bits::f32_from_bits(u);
  }
  return s;
}

// The e4m3 NaN for a NaN quotient (a NaN w, or +-inf / inf): the sign is w's, stated here
// because CPUs and GPUs give different NaNs for an invalid operation.
FERRY_HD std::uint8_t nan_code(float w) {
  return (bits::f32_bits(w) >> 31) != 0 ? std::uint8_t{0xff} : std::uint8_t{0x7f};
}

// One quantized element.
FERRY_HD std::uint8_t quantize(float w, float s) {
#if defined(__CUDA_ARCH__)
  const float q = __fdiv_rn(w, s);
#else
  const float q = w / s;
#endif
  if (q != q) return nan_code(w);
  return bits::f32_to_e4m3(q);
}

FERRY_HD std::uint64_t blocks_of(std::uint64_t n) { return n / kBlock + (n % kBlock != 0 ? 1 : 0); }

}  // namespace ferry::kernels::fp8
