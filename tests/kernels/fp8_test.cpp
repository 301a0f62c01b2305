// Tests of the CPU FP8 e4m3 128x128 block quantization (fp8_block_quant_cpu) against an
// independent float64 statement of the formula, and of the scale-addressing rules that
// check_fp8_plan enforces (ferry/kernels/cpu.hpp).
#include "fp8_reference.hpp"

#include <ferry/kernels/cpu.hpp>
#include <ferry/sdk/error.hpp>
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

namespace {

namespace fk = ferry::kernels;
using namespace ferry::fp8_reference;  // NOLINT: the test speaks the reference's terms

struct Matrix {
  std::uint64_t rows, cols;
  std::vector<std::uint16_t> bf16;  // row-major
  double at(std::uint64_t r, std::uint64_t c) const { return bf16_value(bf16[r * cols + c]); }
};

Quantized reference_quantize(const Matrix& w, bool ue8m0) {
  std::vector<double> values(w.rows * w.cols);
  for (std::uint64_t i = 0; i < values.size(); ++i) values[i] = bf16_value(w.bf16[i]);
  return quantize_matrix(values, w.rows, w.cols, ue8m0);
}

// ---- data ---------------------------------------------------------------------------------

std::uint16_t to_bf16_bits(float f) {
  std::uint32_t u;
  std::memcpy(&u, &f, 4);
  return static_cast<std::uint16_t>(u >> 16);  // truncation: any bf16 value will do
}

// Random bf16 whose magnitude varies per 128x128 block (1e-8 .. 1e6), with one all-zero block
// when the matrix has more than one, and, when `extremes`, the largest finite bf16, infinities
// and a NaN in the last block.
Matrix random_matrix(std::uint64_t rows, std::uint64_t cols, std::uint64_t seed, bool extremes) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 1.0f);
  std::uniform_int_distribution<int> exponent(-27, 20);
  Matrix m{rows, cols, std::vector<std::uint16_t>(rows * cols)};
  const std::uint64_t bc = (cols + 127) / 128, blocks = ((rows + 127) / 128) * bc;
  std::vector<float> magnitude(blocks);
  for (auto& g : magnitude) g = std::ldexp(1.0f, exponent(rng));
  for (std::uint64_t r = 0; r < rows; ++r) {
    for (std::uint64_t c = 0; c < cols; ++c) {
      const std::uint64_t b = (r / 128) * bc + c / 128;
      float v = normal(rng) * magnitude[b];
      if (blocks > 1 && b == 1) v = 0.0f;
      m.bf16[r * cols + c] = to_bf16_bits(v);
    }
  }
  if (extremes) {
    const std::uint64_t last = rows * cols - 1;
    m.bf16[last] = 0x7f7f;        // largest finite bf16
    m.bf16[last - 1] = 0xff7f;    // its negative
    m.bf16[0] = 0x7f80;           // +inf in the first block
    m.bf16[1] = 0xffc1;           // a negative NaN
  }
  return m;
}

fk::EntryView entry_of(const Matrix& m) {
  return {reinterpret_cast<const std::byte*>(m.bf16.data()), FERRY_DTYPE_BF16, m.rows * m.cols};
}

ferry_plan_op_t fp8_op(std::uint32_t src, std::uint64_t src_offset, std::uint64_t src_stride,
                       std::uint32_t dst, std::uint64_t dst_offset, std::uint64_t k,
                       std::uint64_t rows, std::uint64_t cols, std::uint32_t scale,
                       bool ue8m0 = false, ferry_dtype_t src_dtype = FERRY_DTYPE_BF16) {
  ferry_plan_op_t op{};
  op.struct_size = sizeof op;
  op.src_tensor = src;
  op.src_dtype = src_dtype;
  op.src_offset = src_offset;
  op.src_row_stride = src_stride;
  op.dst_param = dst;
  op.dst_dtype = FERRY_DTYPE_F8_E4M3;
  op.dst_offset = dst_offset;
  op.dst_row_stride = k;
  op.rows = rows;
  op.cols = cols;
  op.transform = FERRY_TRANSFORM_FP8_BLOCK_QUANT;
  op.flags = ue8m0 ? static_cast<std::uint32_t>(FERRY_OP_SCALE_UE8M0) : 0u;
  op.scale_param = scale;
  return op;
}

struct Target {
  std::vector<std::uint8_t> q;
  std::vector<float> scales;
  Target(std::uint64_t rows, std::uint64_t cols)
      : q(rows * cols, 0xAA),
        scales(((rows + 127) / 128) * ((cols + 127) / 128), -1.0f) {}
  std::vector<fk::ParamView> views() {
    return {{reinterpret_cast<std::byte*>(q.data()), FERRY_DTYPE_F8_E4M3, q.size()},
            {reinterpret_cast<std::byte*>(scales.data()), FERRY_DTYPE_F32, scales.size()}};
  }
};

void expect_equal(const Target& got, const Quantized& want) {
  ASSERT_EQ(got.q.size(), want.q.size());
  std::size_t bad = 0;
  for (std::size_t i = 0; i < want.q.size(); ++i) {
    if (got.q[i] != want.q[i] && bad++ < 5) {
      ADD_FAILURE() << "element " << i << ": got 0x" << std::hex << int{got.q[i]} << ", want 0x"
                    << int{want.q[i]};
    }
  }
  EXPECT_EQ(bad, 0u);
  ASSERT_EQ(got.scales.size(), want.scales.size());
  for (std::size_t i = 0; i < want.scales.size(); ++i) {
    EXPECT_EQ(got.scales[i], want.scales[i]) << "scale " << i;
  }
}

// ---- tests --------------------------------------------------------------------------------

TEST(Fp8Reference, KnownCodes) {
  EXPECT_EQ(e4m3_reference(1.0), 0x38);
  EXPECT_EQ(e4m3_reference(448.0), 0x7e);
  EXPECT_EQ(e4m3_reference(1e9), 0x7e);
  EXPECT_EQ(e4m3_reference(-1e9), 0xfe);
  EXPECT_EQ(e4m3_reference(std::ldexp(1.0, -9)), 0x01);
  EXPECT_EQ(e4m3_reference(std::ldexp(1.0, -10)), 0x00);  // a tie between 0 and 2^-9: even
  EXPECT_EQ(e4m3_reference(1.0625), 0x38);                 // tie between 1 and 1.125: even
  EXPECT_EQ(reference_scale(448.0, false), 1.0f);
  EXPECT_EQ(reference_scale(0.0, false), 1e-4f / 448.0f);
  EXPECT_EQ(reference_scale(449.0, true), 2.0f);
  EXPECT_EQ(reference_scale(448.0, true), 1.0f);
}

struct Shape {
  std::uint64_t rows, cols;
  bool ue8m0;
};

class Fp8Cpu : public ::testing::TestWithParam<Shape> {};

TEST_P(Fp8Cpu, MatchesFloat64ReferenceBitForBit) {
  const Shape s = GetParam();
  const Matrix w = random_matrix(s.rows, s.cols, s.rows * 7 + s.cols, true);
  Target t(s.rows, s.cols);
  const std::vector<fk::EntryView> entries = {entry_of(w)};
  const auto views = t.views();
  const std::vector<ferry_plan_op_t> ops = {
      fp8_op(0, 0, s.cols, 0, 0, s.cols, s.rows, s.cols, 1, s.ue8m0)};
  fk::fp8_block_quant_cpu(ops, entries, views, 2);
  expect_equal(t, reference_quantize(w, s.ue8m0));
  // The all-zero block (block 1) gets the floor scale and zero codes.
  if (t.scales.size() > 2) {  // (with two blocks the extremes sit in block 1)
    EXPECT_EQ(t.scales[1], reference_scale(0.0, s.ue8m0));
  }
}

INSTANTIATE_TEST_SUITE_P(Shapes, Fp8Cpu,
                         ::testing::Values(Shape{128, 128, false}, Shape{256, 384, false},
                                           Shape{300, 200, false}, Shape{1, 130, false},
                                           Shape{130, 1, false}, Shape{257, 129, true},
                                           Shape{384, 256, true}),
                         [](const ::testing::TestParamInfo<Shape>& info) {
                           return std::to_string(info.param.rows) + "x" +
                                  std::to_string(info.param.cols) +
                                  (info.param.ue8m0 ? "_ue8m0" : "");
                         });

TEST(Fp8CpuValues, DequantizedErrorWithinHalfAnE4m3Step) {
  const Matrix w = random_matrix(256, 256, 5, false);
  Target t(256, 256);
  const std::vector<fk::EntryView> entries = {entry_of(w)};
  const auto views = t.views();
  fk::fp8_block_quant_cpu(std::vector{fp8_op(0, 0, 256, 0, 0, 256, 256, 256, 1)}, entries, views);
  for (std::uint64_t r = 0; r < 256; ++r) {
    for (std::uint64_t c = 0; c < 256; ++c) {
      const double s = t.scales[(r / 128) * 2 + c / 128];
      const double x = w.at(r, c);
      const std::uint8_t code = t.q[r * 256 + c];
      const double deq = (code & 0x80 ? -1 : 1) * e4m3_code_value(code & 0x7f) * s;
      // e4m3 keeps 3 mantissa bits: relative error <= 2^-4 for normals; below 2^-6 the spacing
      // is 2^-9 absolute (in units of s).
      const double bound = std::max(std::fabs(x) * std::ldexp(1.0, -4), s * std::ldexp(1.0, -10));
      ASSERT_LE(std::fabs(deq - x), bound * (1 + 1e-12)) << r << "," << c;
    }
  }
}

TEST(Fp8CpuValues, SaturatesWhereTheScaleRoundedDown) {
  // amax / 448 rounded to float32 can land below the exact quotient; amax / s then exceeds 448
  // and must saturate to 448 (0x7e), not overflow.
  for (std::uint16_t bits = 0x3f80; bits < 0x3fff; ++bits) {
    Matrix w{1, 1, {bits}};
    Target t(1, 1);
    const std::vector<fk::EntryView> entries = {entry_of(w)};
    const auto views = t.views();
    fk::fp8_block_quant_cpu(std::vector{fp8_op(0, 0, 1, 0, 0, 1, 1, 1, 1)}, entries, views, 1);
    EXPECT_EQ(t.q[0], 0x7e) << std::hex << bits;
    EXPECT_EQ(t.scales[0], static_cast<float>(w.at(0, 0) / 448.0));
  }
}

TEST(Fp8CpuValues, F16AndF32SourcesUseTheSameFormula) {
  std::vector<float> f32(128 * 200);
  std::mt19937_64 rng(3);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  for (auto& v : f32) v = normal(rng);
  Target t(128, 200);
  const std::vector<fk::EntryView> entries = {
      {reinterpret_cast<const std::byte*>(f32.data()), FERRY_DTYPE_F32, f32.size()}};
  const auto views = t.views();
  fk::fp8_block_quant_cpu(
      std::vector{fp8_op(0, 0, 200, 0, 0, 200, 128, 200, 1, false, FERRY_DTYPE_F32)}, entries,
      views, 2);
  for (std::uint64_t j = 0; j < 2; ++j) {
    double amax = 0;
    for (std::uint64_t r = 0; r < 128; ++r) {
      for (std::uint64_t c = j * 128; c < std::min<std::uint64_t>(200, j * 128 + 128); ++c) {
        amax = std::max(amax, std::fabs(static_cast<double>(f32[r * 200 + c])));
      }
    }
    const float s = reference_scale(amax, false);
    EXPECT_EQ(t.scales[j], s);
    for (std::uint64_t r = 0; r < 128; ++r) {
      for (std::uint64_t c = j * 128; c < std::min<std::uint64_t>(200, j * 128 + 128); ++c) {
        const float q = static_cast<float>(static_cast<double>(f32[r * 200 + c]) / s);
        ASSERT_EQ(t.q[r * 200 + c], e4m3_reference(q)) << r << "," << c;
      }
    }
  }
}

TEST(Fp8CpuPlans, StackedExpertsAndStridedShardsAddressTheirOwnScales) {
  // Two "experts" of [256, 160] stacked into [2, 256, 160]; expert 1 is a column shard (cols
  // 160 of a 320-wide source, a row-parallel TP shard); expert 0 is written as two ops of 128
  // rows each (fused parts).
  const Matrix a = random_matrix(256, 160, 11, false);
  const Matrix b = random_matrix(256, 320, 12, false);
  Target t(512, 160);
  const std::vector<fk::EntryView> entries = {entry_of(a), entry_of(b)};
  const auto views = t.views();
  const std::vector<ferry_plan_op_t> ops = {
      fp8_op(0, 0, 160, 0, 0, 160, 128, 160, 1),
      fp8_op(0, 128 * 160, 160, 0, 128 * 160, 160, 128, 160, 1),
      fp8_op(1, 160, 320, 0, 256 * 160, 160, 256, 160, 1),
  };
  fk::fp8_block_quant_cpu(ops, entries, views, 2);
  Matrix b_shard{256, 160, {}};
  for (std::uint64_t r = 0; r < 256; ++r) {
    for (std::uint64_t c = 0; c < 160; ++c) b_shard.bf16.push_back(b.bf16[r * 320 + 160 + c]);
  }
  const Quantized qa = reference_quantize(a, false), qb = reference_quantize(b_shard, false);
  for (std::size_t i = 0; i < qa.q.size(); ++i) ASSERT_EQ(t.q[i], qa.q[i]) << i;
  for (std::size_t i = 0; i < qb.q.size(); ++i) ASSERT_EQ(t.q[qa.q.size() + i], qb.q[i]) << i;
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(t.scales[i], qa.scales[i]);
  for (std::size_t i = 0; i < 4; ++i) EXPECT_EQ(t.scales[4 + i], qb.scales[i]);
}

TEST(Fp8CpuPlans, ReapplyingGivesIdenticalBytes) {
  const Matrix w = random_matrix(300, 260, 21, true);
  Target first(300, 260), second(300, 260);
  const std::vector<fk::EntryView> entries = {entry_of(w)};
  const auto op = fp8_op(0, 0, 260, 0, 0, 260, 300, 260, 1);
  fk::fp8_block_quant_cpu(std::vector{op}, entries, first.views(), 2);
  fk::fp8_block_quant_cpu(std::vector{op}, entries, second.views(), 1);
  const auto again = first.views();
  fk::fp8_block_quant_cpu(std::vector{op}, entries, again, 2);
  EXPECT_EQ(first.q, second.q);
  EXPECT_EQ(std::memcmp(first.scales.data(), second.scales.data(), first.scales.size() * 4), 0);
}

struct BadFp8 {
  const char* what;
  ferry_plan_op_t op;
  const char* message_part;
};

TEST(Fp8CpuPlans, OpsBreakingTheTileConventionAreRefusedBeforeWriting) {
  const Matrix w = random_matrix(256, 256, 31, false);
  const BadFp8 bad[] = {
      {"row start off a tile", fp8_op(0, 0, 256, 0, 64 * 256, 256, 128, 256, 1),
       "not on a 128 x 128 tile corner"},
      {"rows end inside a tile", fp8_op(0, 0, 256, 0, 0, 256, 100, 256, 1),
       "end inside a 128-row tile"},
      {"cols end inside a tile", fp8_op(0, 0, 256, 0, 0, 256, 128, 100, 1),
       "end inside a 128-column tile"},
      {"stride not dividing", fp8_op(0, 0, 256, 0, 0, 300, 1, 256, 1), "must be the parameter's"},
      {"scale not f32", fp8_op(0, 0, 256, 0, 0, 256, 128, 256, 0), "is not a F32 parameter"},
      {"copy op", [] {
         auto op = fp8_op(0, 0, 256, 0, 0, 256, 128, 256, 1);
         op.transform = FERRY_TRANSFORM_COPY;
         return op;
       }(), "COPY needs equal dtypes"},
  };
  for (const auto& b : bad) {
    Target t(256, 256);
    const std::vector<fk::EntryView> entries = {entry_of(w)};
    const auto views = t.views();
    const auto good = fp8_op(0, 0, 256, 0, 0, 256, 128, 256, 1);
    try {
      fk::fp8_block_quant_cpu(std::vector{good, b.op}, entries, views, 1);
      ADD_FAILURE() << b.what << ": accepted";
    } catch (const ferry::Error& e) {
      EXPECT_EQ(e.code(), FERRY_STATUS_INVALID_ARGUMENT) << b.what;
      EXPECT_NE(std::string(e.what()).find(b.message_part), std::string::npos)
          << b.what << ": " << e.what();
    }
    for (auto v : t.q) ASSERT_EQ(v, 0xAA) << b.what;
    for (auto v : t.scales) ASSERT_EQ(v, -1.0f) << b.what;
  }
  // A scale parameter too small for the matrix.
  Target t(256, 256);
  t.scales.resize(3);
  const std::vector<fk::EntryView> entries = {entry_of(w)};
  EXPECT_THROW(fk::fp8_block_quant_cpu(std::vector{fp8_op(0, 0, 256, 0, 0, 256, 256, 256, 1)},
                                       entries, t.views()),
               ferry::Error);
}

TEST(Fp8CpuPlans, ScatterRefusesFp8OpsAndNamesTheFp8Kernel) {
  const Matrix w = random_matrix(128, 128, 41, false);
  Target t(128, 128);
  const std::vector<fk::EntryView> entries = {entry_of(w)};
  try {
    fk::scatter_cpu(std::vector{fp8_op(0, 0, 128, 0, 0, 128, 128, 128, 1)}, entries, t.views());
    ADD_FAILURE() << "accepted";
  } catch (const ferry::Error& e) {
    EXPECT_NE(std::string(e.what()).find("fp8_block_quant_cpu"), std::string::npos) << e.what();
  }
}

}  // namespace
