// Tests of the CPU scatter kernel: copies (whole, strided, tensor-parallel shards on dim 0 and
// dim 1, fused), casts for every supported pair, many tiny ops beside one huge op, and bad ops
// refused up front with the poisoned destination left untouched.
#include "ferry/kernels/cpu.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <gtest/gtest.h>

#include <bit>
#include <cstring>
#include <random>
#include <string>
#include <vector>

namespace fk = ferry::kernels;

namespace {

constexpr std::byte kPoison{0xA5};

ferry_plan_op_t make_op(std::uint32_t src_tensor, ferry_dtype_t src_dtype,
                        std::uint64_t src_offset, std::uint64_t src_row_stride,
                        std::uint32_t dst_param, ferry_dtype_t dst_dtype,
                        std::uint64_t dst_offset, std::uint64_t dst_row_stride,
                        std::uint64_t rows, std::uint64_t cols,
                        ferry_transform_t transform = FERRY_TRANSFORM_COPY) {
  ferry_plan_op_t op{};
  op.struct_size = FERRY_STRUCT_SIZE(ferry_plan_op_t, scale_param);
  op.src_tensor = src_tensor;
  op.src_dtype = src_dtype;
  op.src_offset = src_offset;
  op.src_row_stride = src_row_stride;
  op.dst_param = dst_param;
  op.dst_dtype = dst_dtype;
  op.dst_offset = dst_offset;
  op.dst_row_stride = dst_row_stride;
  op.rows = rows;
  op.cols = cols;
  op.transform = transform;
  return op;
}

// A tensor's bytes with random, never-zero, non-NaN contents.
struct Buffer {
  ferry_dtype_t dtype;
  std::uint64_t elements;
  std::vector<std::byte> bytes;

  Buffer(ferry_dtype_t d, std::uint64_t n) : dtype(d), elements(n), bytes(n * ferry::dtype_size(d)) {}

  std::byte* at(std::uint64_t element) { return bytes.data() + element * ferry::dtype_size(dtype); }
  const std::byte* at(std::uint64_t element) const {
    return bytes.data() + element * ferry::dtype_size(dtype);
  }
  fk::EntryView entry() const { return fk::EntryView{bytes.data(), dtype, elements}; }
  fk::ParamView param() { return fk::ParamView{bytes.data(), dtype, elements}; }
};

// Fills with random float values in [-1000, 1000] \ {0} converted to the dtype (finite in every
// float type), or random non-zero integers for integer types.
Buffer random_buffer(ferry_dtype_t dtype, std::uint64_t n, unsigned seed) {
  Buffer b(dtype, n);
  std::mt19937 rng(seed);
  const bool is_int = dtype == FERRY_DTYPE_I64 || dtype == FERRY_DTYPE_I32 ||
                      dtype == FERRY_DTYPE_I16 || dtype == FERRY_DTYPE_I8 ||
                      dtype == FERRY_DTYPE_U8 || dtype == FERRY_DTYPE_BOOL;
  if (dtype == FERRY_DTYPE_BOOL) {
    for (auto& x : b.bytes) x = std::byte{static_cast<unsigned char>(rng() % 2 + 1)};  // 1 or 2
    return b;
  }
  if (is_int) {
    std::vector<std::uint8_t> v(n);
    for (auto& x : v) x = static_cast<std::uint8_t>(rng() % 255 + 1);
    // Through U8 or I8 so that negative values appear in the signed types.
    const ferry_dtype_t from = dtype == FERRY_DTYPE_U8 ? FERRY_DTYPE_U8 : FERRY_DTYPE_I8;
    fk::convert_elements(v.data(), from, b.bytes.data(), dtype, n);
    return b;
  }
  std::uniform_real_distribution<float> dist(0.5f, 400.0f);
  std::vector<float> v(n);
  for (auto& x : v) x = (rng() & 1 ? 1.0f : -1.0f) * dist(rng);
  fk::convert_elements(v.data(), FERRY_DTYPE_F32, b.bytes.data(), dtype, n);
  return b;
}

Buffer poisoned(ferry_dtype_t dtype, std::uint64_t n) {
  Buffer b(dtype, n);
  std::fill(b.bytes.begin(), b.bytes.end(), kPoison);
  return b;
}

bool element_equals(const Buffer& a, std::uint64_t i, const Buffer& b, std::uint64_t j) {
  return std::memcmp(a.at(i), b.at(j), ferry::dtype_size(a.dtype)) == 0;
}

bool is_poison(const Buffer& b, std::uint64_t i) {
  for (std::size_t k = 0; k < ferry::dtype_size(b.dtype); ++k) {
    if (b.at(i)[k] != kPoison) return false;
  }
  return true;
}

// Applies one op element by element with convert_elements (the reference), into `expected`.
void reference_apply(const ferry_plan_op_t& op, const Buffer& src, Buffer& expected) {
  for (std::uint64_t r = 0; r < op.rows; ++r) {
    for (std::uint64_t c = 0; c < op.cols; ++c) {
      fk::convert_elements(src.at(op.src_offset + r * op.src_row_stride + c), src.dtype,
                           expected.at(op.dst_offset + r * op.dst_row_stride + c),
                           expected.dtype, 1);
    }
  }
}

void run(const std::vector<ferry_plan_op_t>& ops, const std::vector<const Buffer*>& entries,
         std::vector<Buffer*> params, unsigned threads = 4) {
  std::vector<fk::EntryView> ev;
  for (const Buffer* e : entries) ev.push_back(e->entry());
  std::vector<fk::ParamView> pv;
  for (Buffer* p : params) pv.push_back(p->param());
  fk::scatter_cpu(ops, ev, pv, threads);
}

}  // namespace

TEST(Scatter, CopyOfAWholeTensorEqualsTheSource) {
  const Buffer src = random_buffer(FERRY_DTYPE_BF16, 10007, 1);
  Buffer dst = poisoned(FERRY_DTYPE_BF16, 10007);
  run({make_op(0, FERRY_DTYPE_BF16, 0, 10007, 0, FERRY_DTYPE_BF16, 0, 10007, 1, 10007)}, {&src},
      {&dst});
  EXPECT_EQ(dst.bytes, src.bytes);
}

TEST(Scatter, StridedBlockCopyWritesOnlyTheBlock) {
  // Source [8, 10] f32, block rows 2..5, cols 3..7 -> destination [6, 9] at row 1, col 2.
  const Buffer src = random_buffer(FERRY_DTYPE_F32, 80, 2);
  Buffer dst = poisoned(FERRY_DTYPE_F32, 54);
  const auto op = make_op(0, FERRY_DTYPE_F32, 2 * 10 + 3, 10, 0, FERRY_DTYPE_F32, 1 * 9 + 2, 9,
                          4, 5);
  run({op}, {&src}, {&dst});
  for (std::uint64_t r = 0; r < 6; ++r) {
    for (std::uint64_t c = 0; c < 9; ++c) {
      const bool inside = r >= 1 && r < 5 && c >= 2 && c < 7;
      if (inside) {
        EXPECT_TRUE(element_equals(dst, r * 9 + c, src, (r + 1) * 10 + (c + 1))) << r << "," << c;
      } else {
        EXPECT_TRUE(is_poison(dst, r * 9 + c)) << r << "," << c;
      }
    }
  }
}

TEST(Scatter, TensorParallelShardsOnDim0AndDim1TakeTheRightSlices) {
  // Full tensor [6, 8] f16; two ranks.
  const Buffer full = random_buffer(FERRY_DTYPE_F16, 48, 3);
  for (std::uint64_t rank = 0; rank < 2; ++rank) {
    // Dim 0: rows 3*rank .. 3*rank+2, contiguous.
    Buffer row_shard = poisoned(FERRY_DTYPE_F16, 24);
    run({make_op(0, FERRY_DTYPE_F16, rank * 24, 24, 0, FERRY_DTYPE_F16, 0, 24, 1, 24)}, {&full},
        {&row_shard});
    for (std::uint64_t i = 0; i < 24; ++i) {
      EXPECT_TRUE(element_equals(row_shard, i, full, rank * 24 + i)) << rank << " " << i;
    }
    // Dim 1: columns 4*rank .. 4*rank+3 of every row.
    Buffer col_shard = poisoned(FERRY_DTYPE_F16, 24);
    run({make_op(0, FERRY_DTYPE_F16, rank * 4, 8, 0, FERRY_DTYPE_F16, 0, 4, 6, 4)}, {&full},
        {&col_shard});
    for (std::uint64_t r = 0; r < 6; ++r) {
      for (std::uint64_t c = 0; c < 4; ++c) {
        EXPECT_TRUE(element_equals(col_shard, r * 4 + c, full, r * 8 + rank * 4 + c))
            << rank << " " << r << "," << c;
      }
    }
  }
}

TEST(Scatter, FusedParameterReceivesEachPartAtItsOffset) {
  // q [4, 6] and k [2, 6] into qkv [6, 6], plus v's dim-1 shard into a second parameter.
  const Buffer q = random_buffer(FERRY_DTYPE_BF16, 24, 4);
  const Buffer k = random_buffer(FERRY_DTYPE_BF16, 12, 5);
  Buffer qkv = poisoned(FERRY_DTYPE_BF16, 36);
  run({make_op(0, FERRY_DTYPE_BF16, 0, 6, 0, FERRY_DTYPE_BF16, 0, 6, 4, 6),
       make_op(1, FERRY_DTYPE_BF16, 0, 6, 0, FERRY_DTYPE_BF16, 24, 6, 2, 6)},
      {&q, &k}, {&qkv});
  EXPECT_EQ(0, std::memcmp(qkv.bytes.data(), q.bytes.data(), q.bytes.size()));
  EXPECT_EQ(0, std::memcmp(qkv.at(24), k.bytes.data(), k.bytes.size()));
}

TEST(Scatter, CastBetweenEveryFloatPairMatchesElementwiseConversion) {
  const ferry_dtype_t types[] = {FERRY_DTYPE_F64,  FERRY_DTYPE_F32,     FERRY_DTYPE_F16,
                                 FERRY_DTYPE_BF16, FERRY_DTYPE_F8_E4M3, FERRY_DTYPE_F8_E5M2};
  unsigned seed = 10;
  for (ferry_dtype_t s : types) {
    for (ferry_dtype_t d : types) {
      // A strided block: [5, 33] source, 5 rows x 31 cols into a [5, 40] destination.
      const Buffer src = random_buffer(s, 5 * 33, ++seed);
      Buffer dst = poisoned(d, 5 * 40);
      Buffer expected = poisoned(d, 5 * 40);
      const auto op = make_op(0, s, 1, 33, 0, d, 3, 40, 5, 31, FERRY_TRANSFORM_CAST);
      run({op}, {&src}, {&dst});
      reference_apply(op, src, expected);
      EXPECT_EQ(dst.bytes, expected.bytes) << ferry::dtype_name(s) << " -> " << ferry::dtype_name(d);
      // The result is not trivially the poison: some element was written.
      EXPECT_FALSE(is_poison(dst, 3)) << ferry::dtype_name(s) << " -> " << ferry::dtype_name(d);
    }
  }
}

TEST(Scatter, CastBetweenSpecificValuesRoundsToNearestEven) {
  const float values[] = {1.0f, 1.00390625f, 1.01171875f, -3.0f};  // bf16 ties at 1+2^-8, 1+3*2^-8
  Buffer src(FERRY_DTYPE_F32, 4);
  std::memcpy(src.bytes.data(), values, sizeof values);
  Buffer dst = poisoned(FERRY_DTYPE_BF16, 4);
  run({make_op(0, FERRY_DTYPE_F32, 0, 4, 0, FERRY_DTYPE_BF16, 0, 4, 1, 4, FERRY_TRANSFORM_CAST)},
      {&src}, {&dst});
  std::uint16_t out[4];
  std::memcpy(out, dst.bytes.data(), sizeof out);
  EXPECT_EQ(out[0], 0x3f80);
  EXPECT_EQ(out[1], 0x3f80);  // tie -> even (down)
  EXPECT_EQ(out[2], 0x3f82);  // tie -> even (up)
  EXPECT_EQ(out[3], 0xc040);
}

TEST(Scatter, IntegerWideningCastsKeepValues) {
  const ferry_dtype_t ints[] = {FERRY_DTYPE_BOOL, FERRY_DTYPE_U8, FERRY_DTYPE_I8,
                                FERRY_DTYPE_I16,  FERRY_DTYPE_I32, FERRY_DTYPE_I64};
  int pairs = 0;
  for (ferry_dtype_t s : ints) {
    for (ferry_dtype_t d : ints) {
      if (!fk::cast_supported(s, d)) continue;
      const Buffer src = random_buffer(s, 64, 100 + pairs);
      Buffer dst = poisoned(d, 64);
      Buffer expected = poisoned(d, 64);
      const auto op = make_op(0, s, 0, 64, 0, d, 0, 64, 1, 64, FERRY_TRANSFORM_CAST);
      run({op}, {&src}, {&dst});
      reference_apply(op, src, expected);
      EXPECT_EQ(dst.bytes, expected.bytes) << ferry::dtype_name(s) << " -> " << ferry::dtype_name(d);
      ++pairs;
    }
  }
  EXPECT_EQ(pairs, 6 + 5 + 3 + 3 + 2 + 1);
  // Spot values: U8 255 -> I64 255, I8 -1 -> I32 -1, BOOL 2 -> I16 1.
  Buffer u8(FERRY_DTYPE_U8, 1);
  u8.bytes[0] = std::byte{255};
  Buffer i64 = poisoned(FERRY_DTYPE_I64, 1);
  run({make_op(0, FERRY_DTYPE_U8, 0, 1, 0, FERRY_DTYPE_I64, 0, 1, 1, 1, FERRY_TRANSFORM_CAST)},
      {&u8}, {&i64});
  std::int64_t v = 0;
  std::memcpy(&v, i64.bytes.data(), 8);
  EXPECT_EQ(v, 255);
}

TEST(Scatter, ManyTinyOpsAndOneHugeOpAllLand) {
  // Entry 0: 5000 tiny tensors of 3 elements packed; entry 1: one 6 Mi-element bf16 tensor
  // (12 MiB) cast to f32 (24 MiB) so it is split across threads.
  constexpr std::uint64_t kTiny = 5000;
  constexpr std::uint64_t kHuge = 6ull << 20;
  const Buffer tiny_src = random_buffer(FERRY_DTYPE_F32, kTiny * 3, 7);
  const Buffer huge_src = random_buffer(FERRY_DTYPE_BF16, kHuge, 8);
  Buffer tiny_dst = poisoned(FERRY_DTYPE_F32, kTiny * 4);  // each lands in a slot of 4
  Buffer huge_dst = poisoned(FERRY_DTYPE_F32, kHuge);
  std::vector<ferry_plan_op_t> ops;
  for (std::uint64_t i = 0; i < kTiny; ++i) {
    ops.push_back(make_op(0, FERRY_DTYPE_F32, i * 3, 3, 0, FERRY_DTYPE_F32, i * 4, 3, 1, 3));
  }
  ops.insert(ops.begin() + 2500, make_op(1, FERRY_DTYPE_BF16, 0, 4096, 1, FERRY_DTYPE_F32, 0,
                                         4096, kHuge / 4096, 4096, FERRY_TRANSFORM_CAST));
  run(ops, {&tiny_src, &huge_src}, {&tiny_dst, &huge_dst}, 4);
  for (std::uint64_t i = 0; i < kTiny; ++i) {
    for (std::uint64_t c = 0; c < 3; ++c) {
      ASSERT_TRUE(element_equals(tiny_dst, i * 4 + c, tiny_src, i * 3 + c)) << i;
    }
    ASSERT_TRUE(is_poison(tiny_dst, i * 4 + 3)) << i;
  }
  std::uint64_t wrong = 0;
  for (std::uint64_t i = 0; i < kHuge; ++i) {
    std::uint16_t b;
    float f;
    std::memcpy(&b, huge_src.at(i), 2);
    std::memcpy(&f, huge_dst.at(i), 4);
    if (std::bit_cast<std::uint32_t>(f) != (std::uint32_t{b} << 16)) ++wrong;
  }
  EXPECT_EQ(wrong, 0u);
}

TEST(Scatter, ThreadCountDoesNotChangeTheResult) {
  const Buffer src = random_buffer(FERRY_DTYPE_F32, 3 << 20, 9);
  const auto op = make_op(0, FERRY_DTYPE_F32, 5, 1024, 0, FERRY_DTYPE_F16, 0, 1000, 3000, 1000,
                          FERRY_TRANSFORM_CAST);
  Buffer one = poisoned(FERRY_DTYPE_F16, 3000 * 1000);
  run({op}, {&src}, {&one}, 1);
  for (unsigned threads : {2u, 3u, 8u}) {
    Buffer many = poisoned(FERRY_DTYPE_F16, 3000 * 1000);
    run({op}, {&src}, {&many}, threads);
    EXPECT_EQ(many.bytes, one.bytes) << threads;
  }
}

TEST(Scatter, ZeroSizedOpsTouchNothing) {
  const Buffer src = random_buffer(FERRY_DTYPE_F32, 4, 11);
  Buffer dst = poisoned(FERRY_DTYPE_F32, 4);
  run({make_op(0, FERRY_DTYPE_F32, 0, 4, 0, FERRY_DTYPE_F32, 0, 4, 0, 4),
       make_op(0, FERRY_DTYPE_F32, 0, 4, 0, FERRY_DTYPE_F32, 0, 4, 3, 0)},
      {&src}, {&dst});
  for (std::uint64_t i = 0; i < 4; ++i) EXPECT_TRUE(is_poison(dst, i));
}

TEST(Scatter, PointerAndCountOverloadCopiesAndChecksCounts) {
  const Buffer src = random_buffer(FERRY_DTYPE_I32, 16, 12);
  Buffer dst = poisoned(FERRY_DTYPE_I32, 16);
  const std::vector<ferry_plan_op_t> ops = {
      make_op(0, FERRY_DTYPE_I32, 0, 16, 0, FERRY_DTYPE_I32, 0, 16, 1, 16)};
  const std::vector<const std::byte*> entries = {src.bytes.data()};
  const std::vector<std::uint64_t> counts = {16};
  const std::vector<fk::ParamView> params = {dst.param()};
  fk::scatter_cpu(ops, entries, counts, params);
  EXPECT_EQ(dst.bytes, src.bytes);
  const std::vector<std::uint64_t> too_few = {15};
  Buffer dst2 = poisoned(FERRY_DTYPE_I32, 16);
  const std::vector<fk::ParamView> params2 = {dst2.param()};
  EXPECT_THROW(fk::scatter_cpu(ops, entries, too_few, params2), ferry::Error);
  EXPECT_TRUE(is_poison(dst2, 0));
}

struct BadOp {
  const char* what;
  ferry_plan_op_t op;
  const char* message_part;
};

TEST(Scatter, BadOpsAreRefusedBeforeAnythingIsWritten) {
  const Buffer src = random_buffer(FERRY_DTYPE_BF16, 64, 13);  // entry 0: 64 bf16
  const auto good = make_op(0, FERRY_DTYPE_BF16, 0, 8, 0, FERRY_DTYPE_BF16, 0, 8, 8, 8);
  const std::uint64_t huge = std::uint64_t{1} << 62;
  const BadOp bad_ops[] = {
      {"entry index", make_op(1, FERRY_DTYPE_BF16, 0, 8, 0, FERRY_DTYPE_BF16, 0, 8, 1, 8),
       "src_tensor 1 is out of range"},
      {"param index", make_op(0, FERRY_DTYPE_BF16, 0, 8, 2, FERRY_DTYPE_BF16, 0, 8, 1, 8),
       "dst_param 2 is out of range"},
      {"param dtype", make_op(0, FERRY_DTYPE_BF16, 0, 8, 0, FERRY_DTYPE_F32, 0, 8, 1, 8,
                              FERRY_TRANSFORM_CAST),
       "differs from the parameter's dtype BF16"},
      {"entry dtype", make_op(0, FERRY_DTYPE_F16, 0, 8, 0, FERRY_DTYPE_BF16, 0, 8, 1, 8,
                              FERRY_TRANSFORM_CAST),
       "differs from the entry's dtype BF16"},
      {"copy across dtypes", make_op(0, FERRY_DTYPE_BF16, 0, 8, 0, FERRY_DTYPE_F32, 0, 8, 1, 8),
       "COPY needs equal dtypes"},
      {"unsupported cast", make_op(0, FERRY_DTYPE_BF16, 0, 8, 0, FERRY_DTYPE_I32, 0, 8, 1, 8,
                                   FERRY_TRANSFORM_CAST),
       "CAST BF16 -> I32 is not supported"},
      {"fp8 quant", make_op(0, FERRY_DTYPE_BF16, 0, 8, 0, FERRY_DTYPE_F8_E4M3, 0, 8, 1, 8,
                            FERRY_TRANSFORM_FP8_BLOCK_QUANT),
       "scale_param 0 is not a F32 parameter"},
      {"unknown transform", make_op(0, FERRY_DTYPE_BF16, 0, 8, 0, FERRY_DTYPE_BF16, 0, 8, 1, 8,
                                    static_cast<ferry_transform_t>(9)),
       "unknown transform 9"},
      {"source end", make_op(0, FERRY_DTYPE_BF16, 1, 8, 0, FERRY_DTYPE_BF16, 0, 8, 8, 8),
       "ends past the entry's 64 elements"},
      {"destination end", make_op(0, FERRY_DTYPE_BF16, 0, 8, 0, FERRY_DTYPE_BF16, 0, 9, 8, 8),
       "ends past the parameter's 64 elements"},
      {"overflowing stride", make_op(0, FERRY_DTYPE_BF16, 0, huge, 0, FERRY_DTYPE_BF16, 0, 8, 8, 8),
       "ends past the entry's"},
      {"overflowing offset",
       make_op(0, FERRY_DTYPE_BF16, ~std::uint64_t{0}, 8, 0, FERRY_DTYPE_BF16, 0, 8, 1, 8),
       "ends past the entry's"},
      {"overlapping rows", make_op(0, FERRY_DTYPE_BF16, 0, 8, 0, FERRY_DTYPE_BF16, 0, 4, 2, 8),
       "destination rows would overlap"},
  };
  for (const BadOp& bad : bad_ops) {
    Buffer dst = poisoned(FERRY_DTYPE_BF16, 64);
    try {
      // The good op comes first: refusing the second must still leave the destination untouched.
      run({good, bad.op}, {&src}, {&dst});
      ADD_FAILURE() << bad.what << ": accepted";
    } catch (const ferry::Error& e) {
      EXPECT_EQ(e.code(), FERRY_STATUS_INVALID_ARGUMENT) << bad.what;
      const std::string message = e.what();
      EXPECT_NE(message.find("plan op 1"), std::string::npos) << bad.what << ": " << message;
      EXPECT_NE(message.find(bad.message_part), std::string::npos) << bad.what << ": " << message;
    }
    for (std::uint64_t i = 0; i < 64; ++i) ASSERT_TRUE(is_poison(dst, i)) << bad.what << " " << i;
  }
}
