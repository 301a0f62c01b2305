// Element conversions on the CPU: the scalar conversion entry points of cpu.hpp and the bulk
// converter (convert_elements) the scatter kernel uses for FERRY_TRANSFORM_CAST.
#include "ferry/kernels/cpu.hpp"
#include "ferry/kernels/float_bits.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <array>
#include <cstring>

namespace ferry::kernels {

float bf16_to_f32(std::uint16_t v) noexcept { return bits::bf16_to_f32(v); }
std::uint16_t f32_to_bf16(float v) noexcept { return bits::f32_to_bf16(v); }
float f16_to_f32(std::uint16_t v) noexcept { return bits::f16_to_f32(v); }
std::uint16_t f32_to_f16(float v) noexcept { return bits::f32_to_f16(v); }
float e4m3_to_f32(std::uint8_t v) noexcept { return bits::e4m3_to_f32(v); }
std::uint8_t f32_to_e4m3(float v) noexcept { return bits::f32_to_e4m3(v); }
float e5m2_to_f32(std::uint8_t v) noexcept { return bits::e5m2_to_f32(v); }
std::uint8_t f32_to_e5m2(float v) noexcept { return bits::f32_to_e5m2(v); }

namespace {

// Per-dtype storage and conversions to and from the wide types. Every float type widens to
// float32 exactly except F64; narrowing from float64 rounds once (float_bits.hpp).
template <ferry_dtype_t D>
struct Elem;

template <>
struct Elem<FERRY_DTYPE_F64> {
  using Storage = double;
  static constexpr bool kFloat = true;
  static double to_f64(Storage v) { return v; }
  static float to_f32(Storage v) { return static_cast<float>(v); }  // unused: F64 reads as f64
  static Storage from_f32(float v) { return v; }
  static Storage from_f64(double v) { return v; }
};
template <>
struct Elem<FERRY_DTYPE_F32> {
  using Storage = float;
  static constexpr bool kFloat = true;
  static double to_f64(Storage v) { return v; }
  static float to_f32(Storage v) { return v; }
  static Storage from_f32(float v) { return v; }
  static Storage from_f64(double v) { return static_cast<float>(v); }  // RNE (default mode)
};
template <>
struct Elem<FERRY_DTYPE_F16> {
  using Storage = std::uint16_t;
  static constexpr bool kFloat = true;
  static double to_f64(Storage v) { return bits::f16_to_f32(v); }
  static float to_f32(Storage v) { return bits::f16_to_f32(v); }
  static Storage from_f32(float v) { return bits::f32_to_f16(v); }
  static Storage from_f64(double v) { return bits::f64_to_f16(v); }
};
template <>
struct Elem<FERRY_DTYPE_BF16> {
  using Storage = std::uint16_t;
  static constexpr bool kFloat = true;
  static double to_f64(Storage v) { return bits::bf16_to_f32(v); }
  static float to_f32(Storage v) { return bits::bf16_to_f32(v); }
  static Storage from_f32(float v) { return bits::f32_to_bf16(v); }
  static Storage from_f64(double v) { return bits::f64_to_bf16(v); }
};
template <>
struct Elem<FERRY_DTYPE_F8_E4M3> {
  using Storage = std::uint8_t;
  static constexpr bool kFloat = true;
  static double to_f64(Storage v) { return bits::e4m3_to_f32(v); }
  static float to_f32(Storage v) { return bits::e4m3_to_f32(v); }
  static Storage from_f32(float v) { return bits::f32_to_e4m3(v); }
  static Storage from_f64(double v) { return bits::f64_to_e4m3(v); }
};
template <>
struct Elem<FERRY_DTYPE_F8_E5M2> {
  using Storage = std::uint8_t;
  static constexpr bool kFloat = true;
  static double to_f64(Storage v) { return bits::e5m2_to_f32(v); }
  static float to_f32(Storage v) { return bits::e5m2_to_f32(v); }
  static Storage from_f32(float v) { return bits::f32_to_e5m2(v); }
  static Storage from_f64(double v) { return bits::f64_to_e5m2(v); }
};

template <typename T>
struct IntElem {
  using Storage = T;
  static constexpr bool kFloat = false;
};
template <>
struct Elem<FERRY_DTYPE_I64> : IntElem<std::int64_t> {};
template <>
struct Elem<FERRY_DTYPE_I32> : IntElem<std::int32_t> {};
template <>
struct Elem<FERRY_DTYPE_I16> : IntElem<std::int16_t> {};
template <>
struct Elem<FERRY_DTYPE_I8> : IntElem<std::int8_t> {};
template <>
struct Elem<FERRY_DTYPE_U8> : IntElem<std::uint8_t> {};
template <>
struct Elem<FERRY_DTYPE_BOOL> : IntElem<std::uint8_t> {};

// Unaligned loads and stores: bucket entries need not be aligned to their element size.
template <typename T>
T load(const std::byte* p, std::uint64_t i) {
  T v;
  std::memcpy(&v, p + i * sizeof(T), sizeof(T));
  return v;
}
template <typename T>
void store(std::byte* p, std::uint64_t i, T v) {
  std::memcpy(p + i * sizeof(T), &v, sizeof(T));
}

using ConvertFn = void (*)(const std::byte* src, std::byte* dst, std::uint64_t count);

template <ferry_dtype_t S, ferry_dtype_t D>
void convert_float(const std::byte* src, std::byte* dst, std::uint64_t count) {
  using SrcT = typename Elem<S>::Storage;
  for (std::uint64_t i = 0; i < count; ++i) {
    const SrcT v = load<SrcT>(src, i);
    if constexpr (S == FERRY_DTYPE_F64) {
      store(dst, i, Elem<D>::from_f64(Elem<S>::to_f64(v)));
    } else {
      store(dst, i, Elem<D>::from_f32(Elem<S>::to_f32(v)));
    }
  }
}

template <ferry_dtype_t S, ferry_dtype_t D>
void convert_int(const std::byte* src, std::byte* dst, std::uint64_t count) {
  using SrcT = typename Elem<S>::Storage;
  using DstT = typename Elem<D>::Storage;
  for (std::uint64_t i = 0; i < count; ++i) {
    const SrcT v = load<SrcT>(src, i);
    if constexpr (S == FERRY_DTYPE_BOOL) {
      store(dst, i, static_cast<DstT>(v != 0 ? 1 : 0));
    } else {
      store(dst, i, static_cast<DstT>(v));
    }
  }
}

void copy_bytes_of(const std::byte* src, std::byte* dst, std::uint64_t bytes) {
  std::memcpy(dst, src, bytes);
}

template <ferry_dtype_t S, ferry_dtype_t D>
void copy_same(const std::byte* src, std::byte* dst, std::uint64_t count) {
  copy_bytes_of(src, dst, count * sizeof(typename Elem<S>::Storage));
}

constexpr std::array<ferry_dtype_t, 6> kFloatTypes = {
    FERRY_DTYPE_F64, FERRY_DTYPE_F32, FERRY_DTYPE_F16,
    FERRY_DTYPE_BF16, FERRY_DTYPE_F8_E4M3, FERRY_DTYPE_F8_E5M2};

constexpr bool is_widening(ferry_dtype_t s, ferry_dtype_t d) {
  auto rank = [](ferry_dtype_t t) {
    switch (t) {
      case FERRY_DTYPE_BOOL: return 0;
      case FERRY_DTYPE_U8:
      case FERRY_DTYPE_I8: return 1;
      case FERRY_DTYPE_I16: return 2;
      case FERRY_DTYPE_I32: return 3;
      case FERRY_DTYPE_I64: return 4;
      default: return -1;
    }
  };
  if (rank(s) < 0 || rank(d) < 0) return false;
  if (s == d) return true;
  // U8 and I8 are not each other's widening; BOOL widens to every integer type.
  if (s == FERRY_DTYPE_BOOL) return true;
  return rank(d) > rank(s) && d != FERRY_DTYPE_U8 && d != FERRY_DTYPE_I8;
}

constexpr bool is_float(ferry_dtype_t t) {
  for (auto f : kFloatTypes) {
    if (f == t) return true;
  }
  return false;
}

constexpr int kDtypeSlots = 13;  // enum values 0..12

template <ferry_dtype_t S, ferry_dtype_t D>
constexpr ConvertFn pick() {
  if constexpr (S == D) {
    return &copy_same<S, D>;
  } else if constexpr (is_float(S) && is_float(D)) {
    return &convert_float<S, D>;
  } else if constexpr (is_widening(S, D)) {
    return &convert_int<S, D>;
  } else {
    return nullptr;
  }
}

template <ferry_dtype_t S>
constexpr void fill_row(std::array<ConvertFn, kDtypeSlots>& row) {
  row[FERRY_DTYPE_F64] = pick<S, FERRY_DTYPE_F64>();
  row[FERRY_DTYPE_F32] = pick<S, FERRY_DTYPE_F32>();
  row[FERRY_DTYPE_F16] = pick<S, FERRY_DTYPE_F16>();
  row[FERRY_DTYPE_BF16] = pick<S, FERRY_DTYPE_BF16>();
  row[FERRY_DTYPE_I64] = pick<S, FERRY_DTYPE_I64>();
  row[FERRY_DTYPE_I32] = pick<S, FERRY_DTYPE_I32>();
  row[FERRY_DTYPE_I16] = pick<S, FERRY_DTYPE_I16>();
  row[FERRY_DTYPE_I8] = pick<S, FERRY_DTYPE_I8>();
  row[FERRY_DTYPE_U8] = pick<S, FERRY_DTYPE_U8>();
  row[FERRY_DTYPE_BOOL] = pick<S, FERRY_DTYPE_BOOL>();
  row[FERRY_DTYPE_F8_E4M3] = pick<S, FERRY_DTYPE_F8_E4M3>();
  row[FERRY_DTYPE_F8_E5M2] = pick<S, FERRY_DTYPE_F8_E5M2>();
}

constexpr std::array<std::array<ConvertFn, kDtypeSlots>, kDtypeSlots> make_table() {
  std::array<std::array<ConvertFn, kDtypeSlots>, kDtypeSlots> t{};
  fill_row<FERRY_DTYPE_F64>(t[FERRY_DTYPE_F64]);
  fill_row<FERRY_DTYPE_F32>(t[FERRY_DTYPE_F32]);
  fill_row<FERRY_DTYPE_F16>(t[FERRY_DTYPE_F16]);
  fill_row<FERRY_DTYPE_BF16>(t[FERRY_DTYPE_BF16]);
  fill_row<FERRY_DTYPE_I64>(t[FERRY_DTYPE_I64]);
  fill_row<FERRY_DTYPE_I32>(t[FERRY_DTYPE_I32]);
  fill_row<FERRY_DTYPE_I16>(t[FERRY_DTYPE_I16]);
  fill_row<FERRY_DTYPE_I8>(t[FERRY_DTYPE_I8]);
  fill_row<FERRY_DTYPE_U8>(t[FERRY_DTYPE_U8]);
  fill_row<FERRY_DTYPE_BOOL>(t[FERRY_DTYPE_BOOL]);
  fill_row<FERRY_DTYPE_F8_E4M3>(t[FERRY_DTYPE_F8_E4M3]);
  fill_row<FERRY_DTYPE_F8_E5M2>(t[FERRY_DTYPE_F8_E5M2]);
  return t;
}

constexpr auto kConvertTable = make_table();

ConvertFn find_converter(ferry_dtype_t src, ferry_dtype_t dst) noexcept {
  const auto s = static_cast<unsigned>(src);
  const auto d = static_cast<unsigned>(dst);
  if (s >= kDtypeSlots || d >= kDtypeSlots) return nullptr;
  return kConvertTable[s][d];
}

}  // namespace

bool cast_supported(ferry_dtype_t src, ferry_dtype_t dst) noexcept {
  return find_converter(src, dst) != nullptr;
}

void convert_elements(const void* src, ferry_dtype_t src_dtype, void* dst, ferry_dtype_t dst_dtype,
                      std::uint64_t count) {
  const ConvertFn fn = find_converter(src_dtype, dst_dtype);
  if (fn == nullptr) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "cast {} -> {} is not supported", dtype_name(src_dtype),
         dtype_name(dst_dtype));
  }
  if (count == 0) return;
  fn(static_cast<const std::byte*>(src), static_cast<std::byte*>(dst), count);
}

}  // namespace ferry::kernels
