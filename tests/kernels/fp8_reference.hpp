// tests/kernels/fp8_reference.hpp: an independent float64 statement of FP8 e4m3 128x128 block
// quantization (s = max(amax, 1e-4) / 448, optionally rounded up to a power of two; q = RNE
// e4m3fn(w / s), saturating at 448), written from the formats' definitions without the kernels'
// code, for the kernel tests and the low-bit model tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <vector>

namespace ferry::fp8_reference {

inline double bf16_value(std::uint16_t v) {
  const std::uint32_t u = static_cast<std::uint32_t>(v) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}

// Every finite non-negative e4m3fn value by code (0x00 .. 0x7e), from the format's definition.
inline double e4m3_code_value(unsigned code) {
  const unsigned e = (code >> 3) & 0xf, m = code & 7;
  return e == 0 ? std::ldexp(m, -9) : std::ldexp(1.0 + m / 8.0, static_cast<int>(e) - 7);
}

// Nearest e4m3fn code to x, ties to the even code, saturating at 448, NaN -> 0x7f with sign.
// (Codes 0x00 .. 0x7e are increasing in value, so the nearest is one of the two around x.)
inline std::uint8_t e4m3_reference(double x) {
  static const std::vector<double> values = [] {
    std::vector<double> v;
    for (unsigned c = 0; c <= 0x7e; ++c) v.push_back(e4m3_code_value(c));
    return v;
  }();
  const unsigned sign = std::signbit(x) ? 0x80u : 0u;
  if (std::isnan(x)) return static_cast<std::uint8_t>(sign | 0x7f);
  const double a = std::fabs(x);
  if (a >= 448.0) return static_cast<std::uint8_t>(sign | 0x7e);
  const auto hi = static_cast<unsigned>(std::lower_bound(values.begin(), values.end(), a) -
                                        values.begin());
  if (hi == 0) return static_cast<std::uint8_t>(sign);
  const unsigned lo = hi - 1;
  const double below = a - values[lo], above = values[hi] - a;
  const unsigned code = below < above ? lo : (above < below ? hi : ((lo & 1u) == 0 ? lo : hi));
  return static_cast<std::uint8_t>(sign | code);
}

// s and q of one block, in float64 with each float32 operation's single rounding made explicit
// (a float64 quotient of float32 values rounded to float32 equals the float32 quotient).
inline float reference_scale(double amax, bool ue8m0) {
  const double floored = std::max(amax, static_cast<double>(1e-4f));
  float s = static_cast<float>(floored / 448.0);
  if (ue8m0 && std::isfinite(s)) {
    int e = 0;
    const double m = std::frexp(static_cast<double>(s), &e);  // s = m * 2^e, m in [0.5, 1)
    if (m != 0.5) s = static_cast<float>(std::ldexp(1.0, e));
  }
  return s;
}

// A whole row-major [rows, cols] matrix of values (as doubles): codes and the
// [ceil(rows/128), ceil(cols/128)] scales.
struct Quantized {
  std::vector<std::uint8_t> q;
  std::vector<float> scales;
};
inline Quantized quantize_matrix(const std::vector<double>& w, std::uint64_t rows,
                                 std::uint64_t cols, bool ue8m0) {
  const std::uint64_t br = (rows + 127) / 128, bc = (cols + 127) / 128;
  Quantized out{std::vector<std::uint8_t>(rows * cols), std::vector<float>(br * bc)};
  for (std::uint64_t i = 0; i < br; ++i) {
    for (std::uint64_t j = 0; j < bc; ++j) {
      const std::uint64_t r1 = std::min(rows, i * 128 + 128), c1 = std::min(cols, j * 128 + 128);
      double amax = 0;
      for (std::uint64_t r = i * 128; r < r1; ++r) {
        for (std::uint64_t c = j * 128; c < c1; ++c) {
          if (!std::isnan(w[r * cols + c])) amax = std::max(amax, std::fabs(w[r * cols + c]));
        }
      }
      const float s = reference_scale(amax, ue8m0);
      out.scales[i * bc + j] = s;
      for (std::uint64_t r = i * 128; r < r1; ++r) {
        for (std::uint64_t c = j * 128; c < c1; ++c) {
          const double x = w[r * cols + c];
          const float q = static_cast<float>(x / static_cast<double>(s));
          // A NaN quotient (NaN w, or inf / inf) is the e4m3 NaN with w's sign.
          out.q[r * cols + c] = std::isnan(q) ? (std::signbit(x) ? 0xff : 0x7f) : e4m3_reference(q);
        }
      }
    }
  }
  return out;
}

}  // namespace ferry::fp8_reference
