// ferry/kernels/float_bits.hpp: bit-exact conversions between float32/float64 and the narrow
// float formats (f16, bf16, fp8 e4m3fn, fp8 e5m2), written once for the CPU kernels and the CUDA
// kernels (every function is __host__ __device__ under nvcc), so both produce the same bytes.
//
// Rules, for every narrowing conversion:
//  - round to nearest, ties to even, in one step from the source value (a float64 source is
//    rounded directly, never through float32, so there is no double rounding);
//  - NaN stays NaN with its sign. For f16/bf16/e5m2 the top payload bits are kept and the quiet
//    bit is set only when the kept payload would be zero (so every f16/bf16 code round-trips
//    through float32 bit for bit); e4m3fn has a single NaN per sign (0x7f / 0xff);
//  - f16, bf16 and e5m2 are IEEE-like: overflow gives +-inf, inf stays inf;
//  - e4m3fn has no inf: anything above the largest finite value (448), inf included, saturates
//    to +-448;
//  - subnormal results are produced exactly; underflow gives a signed zero.
// Widening conversions (narrow -> float32 -> float64) are exact.
#pragma once

#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FERRY_HD __host__ __device__ __forceinline__
#else
#define FERRY_HD inline
#endif

namespace ferry::kernels::bits {

FERRY_HD std::uint32_t f32_bits(float v) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(v);
#else
  std::uint32_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
#endif
}
FERRY_HD float f32_from_bits(std::uint32_t u) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(u);
#else
  float v;
  std::memcpy(&v, &u, sizeof v);
  return v;
#endif
}
FERRY_HD std::uint64_t f64_bits(double v) {
#if defined(__CUDA_ARCH__)
  return static_cast<std::uint64_t>(__double_as_longlong(v));
#else
  std::uint64_t u;
  std::memcpy(&u, &v, sizeof u);
  return u;
#endif
}

// How a narrow format treats values beyond its largest finite one.
enum class Overflow {
  kInfinity,   // IEEE-like (f16, bf16, e5m2): +-inf, exponent all ones reserved for inf/NaN
  kSaturateFn  // e4m3fn: no inf, only mantissa-all-ones in the top exponent is NaN
};

// Narrow format with E exponent bits and M mantissa bits (bias 2^(E-1)-1).
template <int E, int M, Overflow O>
struct Narrow {
  static constexpr int kExpBits = E;
  static constexpr int kManBits = M;
  static constexpr int kBias = (1 << (E - 1)) - 1;
  static constexpr int kEmin = 1 - kBias;  // exponent of the smallest normal
  static constexpr std::uint32_t kSignBit = 1u << (E + M);
  static constexpr std::uint32_t kExpAllOnes = ((1u << E) - 1u) << M;
  static constexpr std::uint32_t kManMask = (1u << M) - 1u;
  static constexpr Overflow kOverflow = O;
  // Largest finite code (without sign).
  static constexpr std::uint32_t kMaxFinite =
      O == Overflow::kInfinity ? kExpAllOnes - 1u : kExpAllOnes | (kManMask - 1u);
  // Unbiased exponent of the largest finite value.
  static constexpr int kEmax = O == Overflow::kInfinity ? kBias : kBias + 1;
};

using F16 = Narrow<5, 10, Overflow::kInfinity>;
using BF16 = Narrow<8, 7, Overflow::kInfinity>;
using E4M3 = Narrow<4, 3, Overflow::kSaturateFn>;
using E5M2 = Narrow<5, 2, Overflow::kInfinity>;

// Source (wide) formats.
struct SrcF32 {
  using Bits = std::uint32_t;
  static constexpr int kMan = 23;
  static constexpr int kExpBits = 8;
  static constexpr int kBias = 127;
};
struct SrcF64 {
  using Bits = std::uint64_t;
  static constexpr int kMan = 52;
  static constexpr int kExpBits = 11;
  static constexpr int kBias = 1023;
};

// Index of the highest set bit of a non-zero value.
template <typename T>
FERRY_HD int highest_bit(T v) {
  int p = 0;
  while (v >>= 1) ++p;
  return p;
}

// Rounds the bit pattern of a wide float (`Src`) to the narrow format `N`; returns its code.
template <typename Src, typename N>
FERRY_HD std::uint32_t narrow_from_bits(typename Src::Bits x) {
  using Bits = typename Src::Bits;
  constexpr int kTotal = Src::kMan + Src::kExpBits;  // bits without the sign
  constexpr Bits kManMask = (Bits{1} << Src::kMan) - 1;
  constexpr Bits kExpMax = (Bits{1} << Src::kExpBits) - 1;
  const std::uint32_t sign = static_cast<std::uint32_t>(x >> kTotal) ? N::kSignBit : 0u;
  const Bits abs = x & ((Bits{1} << kTotal) - 1);
  const Bits exp_field = abs >> Src::kMan;
  const Bits man = abs & kManMask;

  if (exp_field == kExpMax) {
    if (man != 0) {  // NaN
      if constexpr (N::kOverflow == Overflow::kSaturateFn) {
        return sign | N::kExpAllOnes | N::kManMask;
      } else {
        std::uint32_t payload = static_cast<std::uint32_t>(man >> (Src::kMan - N::kManBits));
        if (payload == 0) payload = 1u << (N::kManBits - 1);
        return sign | N::kExpAllOnes | payload;
      }
    }
    return sign | (N::kOverflow == Overflow::kInfinity ? N::kExpAllOnes : N::kMaxFinite);
  }
  if (abs == 0) return sign;

  // Value = sig * 2^(e - Src::kMan) with the leading bit of sig at position Src::kMan.
  int e;
  Bits sig;
  if (exp_field == 0) {
    const int p = highest_bit(man);
    sig = man << (Src::kMan - p);
    e = 1 - Src::kBias - (Src::kMan - p);
  } else {
    sig = man | (Bits{1} << Src::kMan);
    e = static_cast<int>(exp_field) - Src::kBias;
  }

  const std::uint32_t overflow_code =
      sign | (N::kOverflow == Overflow::kInfinity ? N::kExpAllOnes : N::kMaxFinite);
  if (e > N::kEmax) return overflow_code;

  std::uint32_t code;
  int shift;  // how many low bits of sig are dropped
  if (e >= N::kEmin) {
    shift = Src::kMan - N::kManBits;
    code = (static_cast<std::uint32_t>(e + N::kBias) << N::kManBits) |
           static_cast<std::uint32_t>((sig >> shift) & N::kManMask);
  } else {
    shift = Src::kMan - N::kManBits + (N::kEmin - e);
    if (shift > Src::kMan + 1) return sign;  // below half the smallest subnormal
    code = static_cast<std::uint32_t>(sig >> shift);
  }
  const Bits rem = sig & ((Bits{1} << shift) - 1);
  const Bits half = Bits{1} << (shift - 1);
  if (rem > half || (rem == half && (code & 1u))) ++code;  // a carry moves into the exponent

  if (code > N::kMaxFinite) return overflow_code;
  return sign | code;
}

// Widens a narrow code to float32 (exact).
template <typename N>
FERRY_HD float narrow_to_f32(std::uint32_t code) {
  const std::uint32_t sign = (code & N::kSignBit) ? 0x80000000u : 0u;
  const std::uint32_t exp_field = (code >> N::kManBits) & ((1u << N::kExpBits) - 1u);
  const std::uint32_t man = code & N::kManMask;
  constexpr std::uint32_t kExpMax = (1u << N::kExpBits) - 1u;
  if constexpr (N::kOverflow == Overflow::kSaturateFn) {
    if (exp_field == kExpMax && man == N::kManMask) return f32_from_bits(sign | 0x7fc00000u);
  } else {
    if (exp_field == kExpMax) {
      return f32_from_bits(sign | 0x7f800000u | (man << (23 - N::kManBits)));
    }
  }
  if (exp_field == 0) {
    if (man == 0) return f32_from_bits(sign);
    // Subnormal: man * 2^(kEmin - M); normalise into a float32 normal (all formats here have
    // kEmin - M >= -133, and float32 normals reach 2^-126, subnormals 2^-149).
    const int p = highest_bit(man);
    const int e = N::kEmin - N::kManBits + p;  // exponent of the leading bit
    if (e >= -126) {
      const std::uint32_t frac = (man << (23 - p)) & 0x7fffffu;
      return f32_from_bits(sign | (static_cast<std::uint32_t>(e + 127) << 23) | frac);
    }
    // Only bf16 subnormals land here: they are float32 subnormals with the same bits shifted.
    return f32_from_bits(sign | (man << (23 - N::kManBits)));
  }
  const std::uint32_t exp32 = exp_field - N::kBias + 127;
  return f32_from_bits(sign | (exp32 << 23) | (man << (23 - N::kManBits)));
}

// Fast path: float32 -> bf16 by rounding the top 16 bits (same result as narrow_from_bits).
FERRY_HD std::uint16_t f32_to_bf16(float v) {
  const std::uint32_t u = f32_bits(v);
  if ((u & 0x7fffffffu) > 0x7f800000u) {
    std::uint32_t top = u >> 16;
    if ((top & 0x7fu) == 0) top |= 0x40u;
    return static_cast<std::uint16_t>(top);
  }
  return static_cast<std::uint16_t>((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
FERRY_HD float bf16_to_f32(std::uint16_t v) {
  return f32_from_bits(static_cast<std::uint32_t>(v) << 16);
}
FERRY_HD std::uint16_t f32_to_f16(float v) {
  const std::uint32_t u = f32_bits(v);
  const std::uint32_t abs = u & 0x7fffffffu;
  // Fast path: results that are f16 normals (|v| in [2^-14, 65520)) round by adding to the
  // rebiased bits; the same result as the general routine, which handles everything else.
  if (abs >= 0x38800000u && abs < 0x477ff000u) {
    const std::uint32_t r = abs - (112u << 23);
    return static_cast<std::uint16_t>(((u >> 16) & 0x8000u) |
                                      ((r + 0xfffu + ((r >> 13) & 1u)) >> 13));
  }
  return static_cast<std::uint16_t>(narrow_from_bits<SrcF32, F16>(u));
}
FERRY_HD float f16_to_f32(std::uint16_t v) { return narrow_to_f32<F16>(v); }
FERRY_HD std::uint8_t f32_to_e4m3(float v) {
  return static_cast<std::uint8_t>(narrow_from_bits<SrcF32, E4M3>(f32_bits(v)));
}
FERRY_HD float e4m3_to_f32(std::uint8_t v) { return narrow_to_f32<E4M3>(v); }
FERRY_HD std::uint8_t f32_to_e5m2(float v) {
  return static_cast<std::uint8_t>(narrow_from_bits<SrcF32, E5M2>(f32_bits(v)));
}
FERRY_HD float e5m2_to_f32(std::uint8_t v) { return narrow_to_f32<E5M2>(v); }

// float64 sources round directly (no double rounding through float32).
FERRY_HD std::uint16_t f64_to_bf16(double v) {
  return static_cast<std::uint16_t>(narrow_from_bits<SrcF64, BF16>(f64_bits(v)));
}
FERRY_HD std::uint16_t f64_to_f16(double v) {
  return static_cast<std::uint16_t>(narrow_from_bits<SrcF64, F16>(f64_bits(v)));
}
FERRY_HD std::uint8_t f64_to_e4m3(double v) {
  return static_cast<std::uint8_t>(narrow_from_bits<SrcF64, E4M3>(f64_bits(v)));
}
FERRY_HD std::uint8_t f64_to_e5m2(double v) {
  return static_cast<std::uint8_t>(narrow_from_bits<SrcF64, E5M2>(f64_bits(v)));
}

}  // namespace ferry::kernels::bits
