// Tests of the element conversions (bf16, f16, fp8 e4m3fn / e5m2 <-> f32, f64 sources, bulk
// casts): exhaustive over every narrow code, and rounding checked against a nearest-value search
// over a table of every representable value built here with std::ldexp (a different way from
// the bit manipulation under test).
#include "ferry/kernels/cpu.hpp"
#include "ferry/kernels/float_bits.hpp"

#include <ferry/sdk/error.hpp>

#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace fk = ferry::kernels;

namespace {

struct Format {
  const char* name;
  int exp_bits;
  int man_bits;
  bool saturate_fn;  // e4m3fn: no inf, one NaN code per sign
};

constexpr Format kF16{"f16", 5, 10, false};
constexpr Format kBF16{"bf16", 8, 7, false};
constexpr Format kE4M3{"e4m3fn", 4, 3, true};
constexpr Format kE5M2{"e5m2", 5, 2, false};

std::uint32_t sign_bit(const Format& f) { return 1u << (f.exp_bits + f.man_bits); }

// The value of a code, from the textbook formula.
double reference_decode(const Format& f, std::uint32_t code) {
  const int bias = (1 << (f.exp_bits - 1)) - 1;
  const bool negative = (code & sign_bit(f)) != 0;
  const std::uint32_t e = (code >> f.man_bits) & ((1u << f.exp_bits) - 1);
  const std::uint32_t m = code & ((1u << f.man_bits) - 1);
  const std::uint32_t e_max = (1u << f.exp_bits) - 1;
  double v;
  if (f.saturate_fn && e == e_max && m == (1u << f.man_bits) - 1) {
    v = std::numeric_limits<double>::quiet_NaN();
  } else if (!f.saturate_fn && e == e_max) {
    v = m == 0 ? std::numeric_limits<double>::infinity() : std::numeric_limits<double>::quiet_NaN();
  } else if (e == 0) {
    v = std::ldexp(static_cast<double>(m), 1 - bias - f.man_bits);
  } else {
    v = std::ldexp(static_cast<double>(m + (1u << f.man_bits)), static_cast<int>(e) - bias - f.man_bits);
  }
  return negative ? -v : v;
}

// Every non-negative finite code of a format with its value, ascending.
struct Table {
  Format format;
  std::vector<std::uint32_t> codes;
  std::vector<double> values;
};

Table make_table(const Format& f) {
  Table t{f, {}, {}};
  for (std::uint32_t c = 0; c < sign_bit(f); ++c) {
    const double v = reference_decode(f, c);
    if (std::isfinite(v)) {
      t.codes.push_back(c);
      t.values.push_back(v);
    }
  }
  return t;
}

// The code RNE gives for finite or infinite x, by searching the table of values.
std::uint32_t reference_round(const Table& t, double x) {
  const Format& f = t.format;
  const std::uint32_t sign = std::signbit(x) ? sign_bit(f) : 0u;
  const double a = std::fabs(x);
  const double max = t.values.back();
  const std::uint32_t max_code = t.codes.back();
  const std::uint32_t inf_code = ((1u << f.exp_bits) - 1) << f.man_bits;
  if (a > max) {
    if (f.saturate_fn) return sign | max_code;
    // Halfway between max and the next power-of-two step rounds to inf (max has an odd mantissa).
    const int bias = (1 << (f.exp_bits - 1)) - 1;
    const double half_ulp = std::ldexp(1.0, bias - f.man_bits - 1);
    return sign | (a >= max + half_ulp ? inf_code : max_code);
  }
  const auto it = std::lower_bound(t.values.begin(), t.values.end(), a);
  const std::size_t hi = static_cast<std::size_t>(it - t.values.begin());
  if (t.values[hi] == a) return sign | t.codes[hi];
  const std::size_t lo = hi - 1;  // a > 0 = values[0] here
  const double below = a - t.values[lo];
  const double above = t.values[hi] - a;
  if (below < above) return sign | t.codes[lo];
  if (above < below) return sign | t.codes[hi];
  return sign | ((t.codes[lo] & 1u) == 0 ? t.codes[lo] : t.codes[hi]);
}

// float32 inputs that probe every rounding decision of a format: each value, the midpoints
// between neighbours and one float32 step either side of them, beyond the largest value, below
// the smallest subnormal, plus random floats across the format's range.
std::vector<float> probe_floats(const Table& t, unsigned seed) {
  std::vector<float> out;
  auto add = [&](double v) {
    const auto f = static_cast<float>(v);
    if (static_cast<double>(f) != v) return;  // not a float32: skip
    out.push_back(f);
    out.push_back(std::nextafter(f, std::numeric_limits<float>::infinity()));
    out.push_back(std::nextafter(f, -std::numeric_limits<float>::infinity()));
  };
  for (std::size_t i = 0; i < t.values.size(); ++i) {
    add(t.values[i]);
    if (i + 1 < t.values.size()) add((t.values[i] + t.values[i + 1]) / 2);
  }
  const double max = t.values.back();
  const int bias = (1 << (t.format.exp_bits - 1)) - 1;
  add(max + std::ldexp(1.0, bias - t.format.man_bits - 1));
  add(max * 1.75);
  add(max * 4);
  add(t.values[1] / 2);
  add(t.values[1] / 4);
  add(t.values[1] * 0.75);
  out.push_back(std::numeric_limits<float>::max());
  out.push_back(std::numeric_limits<float>::denorm_min());
  out.push_back(std::numeric_limits<float>::min());
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> exponent(std::log2(t.values[1]) - 2, std::log2(max) + 2);
  std::uniform_real_distribution<double> mantissa(1.0, 2.0);
  for (int i = 0; i < 200000; ++i) {
    const double v = std::exp2(std::floor(exponent(rng))) * mantissa(rng);
    if (v < std::numeric_limits<float>::max()) out.push_back(static_cast<float>(v));
  }
  const std::size_t n = out.size();
  for (std::size_t i = 0; i < n; ++i) out.push_back(-out[i]);
  return out;
}

std::uint32_t f32_bits(float v) { return std::bit_cast<std::uint32_t>(v); }

// Checks a float32 -> narrow conversion against the reference on every probe value.
template <typename Fn>
void expect_rounds_like_reference(const Format& f, Fn convert) {
  const Table t = make_table(f);
  std::size_t mismatches = 0;
  for (float x : probe_floats(t, 7)) {
    const std::uint32_t want = reference_round(t, x);
    const std::uint32_t got = convert(x);
    if (got != want && ++mismatches <= 10) {
      ADD_FAILURE() << f.name << ": " << x << " (0x" << std::hex << f32_bits(x) << ") gave 0x"
                    << got << ", want 0x" << want;
    }
  }
  EXPECT_EQ(mismatches, 0u) << f.name;
}

// Every code decodes to the reference value (NaN to a NaN with the code's sign) and encodes back
// to itself.
template <typename Decode, typename Encode>
void expect_every_code_round_trips(const Format& f, Decode decode, Encode encode) {
  const std::uint32_t count = sign_bit(f) * 2;
  for (std::uint32_t c = 0; c < count; ++c) {
    const float v = decode(c);
    const double want = reference_decode(f, c);
    if (std::isnan(want)) {
      ASSERT_TRUE(std::isnan(v)) << f.name << " code " << c;
      ASSERT_EQ(std::signbit(v), (c & sign_bit(f)) != 0) << f.name << " code " << c;
    } else {
      ASSERT_EQ(static_cast<double>(v), want) << f.name << " code " << c;
      ASSERT_EQ(std::signbit(v), std::signbit(want)) << f.name << " code " << c;
    }
    ASSERT_EQ(encode(v), c) << f.name << " code " << c;
  }
}

}  // namespace

TEST(Convert, EveryBf16CodeDecodesExactlyAndRoundTripsThroughF32) {
  expect_every_code_round_trips(
      kBF16, [](std::uint32_t c) { return fk::bf16_to_f32(static_cast<std::uint16_t>(c)); },
      [](float v) { return std::uint32_t{fk::f32_to_bf16(v)}; });
}

TEST(Convert, EveryF16CodeDecodesExactlyAndRoundTripsThroughF32) {
  expect_every_code_round_trips(
      kF16, [](std::uint32_t c) { return fk::f16_to_f32(static_cast<std::uint16_t>(c)); },
      [](float v) { return std::uint32_t{fk::f32_to_f16(v)}; });
}

TEST(Convert, EveryE4m3CodeDecodesExactlyAndRoundTripsThroughF32) {
  expect_every_code_round_trips(
      kE4M3, [](std::uint32_t c) { return fk::e4m3_to_f32(static_cast<std::uint8_t>(c)); },
      [](float v) { return std::uint32_t{fk::f32_to_e4m3(v)}; });
}

TEST(Convert, EveryE5m2CodeDecodesExactlyAndRoundTripsThroughF32) {
  expect_every_code_round_trips(
      kE5M2, [](std::uint32_t c) { return fk::e5m2_to_f32(static_cast<std::uint8_t>(c)); },
      [](float v) { return std::uint32_t{fk::f32_to_e5m2(v)}; });
}

TEST(Convert, F32ToBf16RoundsToNearestEvenLikeTheReference) {
  expect_rounds_like_reference(kBF16, [](float x) { return std::uint32_t{fk::f32_to_bf16(x)}; });
}

TEST(Convert, F32ToBf16MatchesTheReferenceNearEveryTieOfEveryCode) {
  // For every bf16 code, the float32s whose dropped low half is at or next to a rounding edge.
  const Table t = make_table(kBF16);
  std::size_t mismatches = 0;
  for (std::uint32_t hi = 0; hi < 0x10000; ++hi) {
    for (std::uint32_t lo : {0x0000u, 0x0001u, 0x7fffu, 0x8000u, 0x8001u, 0xffffu}) {
      const float x = std::bit_cast<float>((hi << 16) | lo);
      if (std::isnan(x)) continue;
      const std::uint32_t want = reference_round(t, x);
      const std::uint32_t got = fk::f32_to_bf16(x);
      if (got != want && ++mismatches <= 10) {
        ADD_FAILURE() << "0x" << std::hex << ((hi << 16) | lo) << " gave 0x" << got << ", want 0x"
                      << want;
      }
    }
  }
  EXPECT_EQ(mismatches, 0u);
}

TEST(Convert, F32ToF16RoundsToNearestEvenLikeTheReference) {
  expect_rounds_like_reference(kF16, [](float x) { return std::uint32_t{fk::f32_to_f16(x)}; });
}

TEST(Convert, F32ToE4m3RoundsToNearestEvenAndSaturates) {
  expect_rounds_like_reference(kE4M3, [](float x) { return std::uint32_t{fk::f32_to_e4m3(x)}; });
}

TEST(Convert, F32ToE5m2RoundsToNearestEvenLikeTheReference) {
  expect_rounds_like_reference(kE5M2, [](float x) { return std::uint32_t{fk::f32_to_e5m2(x)}; });
}

TEST(Convert, F64SourcesRoundOnceWithoutDoubleRounding) {
  // Just above a midpoint by less than a float32 step: rounding through float32 would land on the
  // midpoint and then round to even, the wrong way.
  for (const Format* f : {&kF16, &kBF16, &kE4M3, &kE5M2}) {
    const Table t = make_table(*f);
    std::size_t checked = 0;
    for (std::size_t i = 1; i + 1 < t.values.size(); ++i) {
      const double mid = (t.values[i] + t.values[i + 1]) / 2;
      for (double x : {mid, std::nextafter(mid, 0.0), std::nextafter(mid, 1e300), -mid,
                       -std::nextafter(mid, 1e300), mid * (1 + 1e-12)}) {
        std::uint32_t got = 0;
        if (f == &kF16) got = fk::bits::f64_to_f16(x);
        if (f == &kBF16) got = fk::bits::f64_to_bf16(x);
        if (f == &kE4M3) got = fk::bits::f64_to_e4m3(x);
        if (f == &kE5M2) got = fk::bits::f64_to_e5m2(x);
        ASSERT_EQ(got, reference_round(t, x)) << f->name << " x=" << x;
        ++checked;
      }
    }
    EXPECT_EQ(checked, 6 * (t.values.size() - 2)) << f->name;
  }
}

TEST(Convert, SpecialValuesFollowEachFormatsRules) {
  const float inf = std::numeric_limits<float>::infinity();
  const float nan = std::numeric_limits<float>::quiet_NaN();
  // Largest finite values and overflow.
  EXPECT_EQ(fk::f32_to_f16(65504.0f), 0x7bff);
  EXPECT_EQ(fk::f32_to_f16(65519.99f), 0x7bff);
  EXPECT_EQ(fk::f32_to_f16(65520.0f), 0x7c00);
  EXPECT_EQ(fk::f32_to_f16(-inf), 0xfc00);
  EXPECT_EQ(fk::f32_to_bf16(inf), 0x7f80);
  EXPECT_EQ(fk::f32_to_bf16(std::numeric_limits<float>::max()), 0x7f80);
  EXPECT_EQ(fk::f32_to_e4m3(448.0f), 0x7e);
  EXPECT_EQ(fk::f32_to_e4m3(464.0f), 0x7e);
  EXPECT_EQ(fk::f32_to_e4m3(1e9f), 0x7e);
  EXPECT_EQ(fk::f32_to_e4m3(inf), 0x7e);
  EXPECT_EQ(fk::f32_to_e4m3(-inf), 0xfe);
  EXPECT_EQ(fk::f32_to_e5m2(57344.0f), 0x7b);
  EXPECT_EQ(fk::f32_to_e5m2(61440.0f), 0x7c);
  EXPECT_EQ(fk::f32_to_e5m2(-inf), 0xfc);
  // Subnormals and underflow (ties go to the even code 0).
  EXPECT_EQ(fk::f32_to_f16(std::ldexp(1.0f, -24)), 0x0001);
  EXPECT_EQ(fk::f32_to_f16(std::ldexp(1.0f, -25)), 0x0000);
  EXPECT_EQ(fk::f32_to_f16(std::ldexp(1.5f, -25)), 0x0001);
  EXPECT_EQ(fk::f32_to_f16(-std::ldexp(1.0f, -30)), 0x8000);
  EXPECT_EQ(fk::f32_to_e4m3(std::ldexp(1.0f, -9)), 0x01);
  EXPECT_EQ(fk::f32_to_e4m3(std::ldexp(1.0f, -10)), 0x00);
  EXPECT_EQ(fk::f32_to_e4m3(std::ldexp(3.0f, -10)), 0x02);  // 1.5 units: tie to even 2
  EXPECT_EQ(fk::f32_to_e4m3(std::ldexp(3.0f, -11)), 0x01);  // 0.75 units: up to 1
  EXPECT_EQ(fk::f32_to_bf16(std::numeric_limits<float>::denorm_min()), 0x0000);
  EXPECT_EQ(fk::bf16_to_f32(0x0001), std::ldexp(1.0f, -133));
  // NaN stays NaN with its sign.
  EXPECT_EQ(fk::f32_to_e4m3(nan), 0x7f);
  EXPECT_EQ(fk::f32_to_e4m3(-nan), 0xff);
  EXPECT_EQ(fk::f32_to_f16(nan) & 0x7c00, 0x7c00);
  EXPECT_NE(fk::f32_to_f16(nan) & 0x03ff, 0);
  // A NaN whose payload is only in the low float32 bits stays a NaN, not an inf.
  const float low_payload_nan = std::bit_cast<float>(0x7f800001u);
  EXPECT_EQ(fk::f32_to_bf16(low_payload_nan), 0x7fc0);
  EXPECT_EQ(fk::f32_to_f16(low_payload_nan), 0x7e00);
  EXPECT_EQ(fk::f32_to_e5m2(low_payload_nan), 0x7e);
  EXPECT_EQ(fk::f32_to_e5m2(-low_payload_nan), 0xfe);
}

TEST(Convert, BulkCastsBetweenFloatTypesEqualTheScalarConversions) {
  const std::vector<float> values = {1.0f,    -2.5f,        3.14159265f, 1e-3f,   -7e-6f, 65000.0f,
                                     448.0f,  1e30f,        -1e-40f,     0.1f,    300.0f, -0.0f,
                                     1.0009765625f, 2.0f / 3.0f};
  const std::size_t n = values.size();
  // F32 -> F16 -> F32 and F32 -> BF16 -> E4M3 via the bulk path, element by element via scalars.
  std::vector<std::uint16_t> f16(n);
  fk::convert_elements(values.data(), FERRY_DTYPE_F32, f16.data(), FERRY_DTYPE_F16, n);
  std::vector<std::uint16_t> bf16(n);
  fk::convert_elements(f16.data(), FERRY_DTYPE_F16, bf16.data(), FERRY_DTYPE_BF16, n);
  std::vector<std::uint8_t> e4m3(n);
  fk::convert_elements(bf16.data(), FERRY_DTYPE_BF16, e4m3.data(), FERRY_DTYPE_F8_E4M3, n);
  std::vector<double> f64(n);
  fk::convert_elements(e4m3.data(), FERRY_DTYPE_F8_E4M3, f64.data(), FERRY_DTYPE_F64, n);
  std::vector<std::uint8_t> e5m2(n);
  fk::convert_elements(f64.data(), FERRY_DTYPE_F64, e5m2.data(), FERRY_DTYPE_F8_E5M2, n);
  for (std::size_t i = 0; i < n; ++i) {
    const std::uint16_t want_f16 = fk::f32_to_f16(values[i]);
    const std::uint16_t want_bf16 = fk::f32_to_bf16(fk::f16_to_f32(want_f16));
    const std::uint8_t want_e4m3 = fk::f32_to_e4m3(fk::bf16_to_f32(want_bf16));
    const double want_f64 = fk::e4m3_to_f32(want_e4m3);
    EXPECT_EQ(f16[i], want_f16) << i;
    EXPECT_EQ(bf16[i], want_bf16) << i;
    EXPECT_EQ(e4m3[i], want_e4m3) << i;
    EXPECT_EQ(f64[i], want_f64) << i;
    EXPECT_EQ(e5m2[i], fk::f32_to_e5m2(static_cast<float>(want_f64))) << i;
  }
  EXPECT_EQ(f16[0], 0x3c00);
  EXPECT_EQ(bf16[1], 0xc020);
}

TEST(Convert, IntegerWideningsKeepValuesAndNarrowingsAreRefused) {
  const std::int8_t i8[] = {-128, -1, 0, 1, 127};
  std::int64_t i64[5] = {};
  fk::convert_elements(i8, FERRY_DTYPE_I8, i64, FERRY_DTYPE_I64, 5);
  EXPECT_EQ(i64[0], -128);
  EXPECT_EQ(i64[1], -1);
  EXPECT_EQ(i64[4], 127);
  const std::uint8_t u8[] = {0, 200, 255};
  std::int16_t i16[3] = {};
  fk::convert_elements(u8, FERRY_DTYPE_U8, i16, FERRY_DTYPE_I16, 3);
  EXPECT_EQ(i16[1], 200);
  EXPECT_EQ(i16[2], 255);
  const std::uint8_t flags[] = {0, 1, 2};
  std::int32_t i32[3] = {-5, -5, -5};
  fk::convert_elements(flags, FERRY_DTYPE_BOOL, i32, FERRY_DTYPE_I32, 3);
  EXPECT_EQ(i32[0], 0);
  EXPECT_EQ(i32[1], 1);
  EXPECT_EQ(i32[2], 1);

  EXPECT_FALSE(fk::cast_supported(FERRY_DTYPE_I64, FERRY_DTYPE_I8));
  EXPECT_FALSE(fk::cast_supported(FERRY_DTYPE_U8, FERRY_DTYPE_I8));
  EXPECT_FALSE(fk::cast_supported(FERRY_DTYPE_I32, FERRY_DTYPE_F32));
  EXPECT_TRUE(fk::cast_supported(FERRY_DTYPE_BF16, FERRY_DTYPE_F8_E4M3));
  try {
    std::int8_t narrowed[1] = {};
    fk::convert_elements(i64, FERRY_DTYPE_I64, narrowed, FERRY_DTYPE_I8, 1);
    FAIL() << "I64 -> I8 was accepted";
  } catch (const ferry::Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_INVALID_ARGUMENT);
    EXPECT_NE(std::string(e.what()).find("I64 -> I8"), std::string::npos) << e.what();
  }
}
