// Element type tables and checked shape arithmetic (see ferry/sdk/dtype.hpp).
#include "ferry/sdk/dtype.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <array>
#include <string>

namespace ferry {
namespace {

struct DtypeInfo {
  ferry_dtype_t dtype;
  std::size_t size;
  const char* name;
  const char* torch_name;
};

constexpr std::array<DtypeInfo, 12> kDtypes = {{
    {FERRY_DTYPE_F64, 8, "F64", "float64"},
    {FERRY_DTYPE_F32, 4, "F32", "float32"},
    {FERRY_DTYPE_F16, 2, "F16", "float16"},
    {FERRY_DTYPE_BF16, 2, "BF16", "bfloat16"},
    {FERRY_DTYPE_I64, 8, "I64", "int64"},
    {FERRY_DTYPE_I32, 4, "I32", "int32"},
    {FERRY_DTYPE_I16, 2, "I16", "int16"},
    {FERRY_DTYPE_I8, 1, "I8", "int8"},
    {FERRY_DTYPE_U8, 1, "U8", "uint8"},
    {FERRY_DTYPE_BOOL, 1, "BOOL", "bool"},
    {FERRY_DTYPE_F8_E4M3, 1, "F8_E4M3", "float8_e4m3fn"},
    {FERRY_DTYPE_F8_E5M2, 1, "F8_E5M2", "float8_e5m2"},
}};

const DtypeInfo* find(ferry_dtype_t dtype) noexcept {
  for (const auto& info : kDtypes) {
    if (info.dtype == dtype) return &info;
  }
  return nullptr;
}

}  // namespace

std::size_t dtype_size(ferry_dtype_t dtype) noexcept {
  const DtypeInfo* info = find(dtype);
  return info ? info->size : 0;
}

const char* dtype_name(ferry_dtype_t dtype) noexcept {
  const DtypeInfo* info = find(dtype);
  return info ? info->name : "INVALID";
}

std::optional<ferry_dtype_t> dtype_from_name(std::string_view name) noexcept {
  for (const auto& info : kDtypes) {
    if (name == info.name || name == info.torch_name) return info.dtype;
  }
  if (name == "torch.bfloat16") return FERRY_DTYPE_BF16;
  if (name == "torch.float32") return FERRY_DTYPE_F32;
  if (name == "torch.float16") return FERRY_DTYPE_F16;
  return std::nullopt;
}

std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) noexcept {
  std::uint64_t out = 0;
  if (__builtin_mul_overflow(a, b, &out)) return std::nullopt;
  return out;
}

std::optional<std::uint64_t> checked_add(std::uint64_t a, std::uint64_t b) noexcept {
  std::uint64_t out = 0;
  if (__builtin_add_overflow(a, b, &out)) return std::nullopt;
  return out;
}

std::optional<std::uint64_t> element_count(std::span<const std::uint64_t> shape) noexcept {
  std::uint64_t n = 1;
  for (std::uint64_t d : shape) {
    auto next = checked_mul(n, d);
    if (!next) return std::nullopt;
    n = *next;
  }
  return n;
}

std::optional<std::uint64_t> byte_size(ferry_dtype_t dtype,
                                       std::span<const std::uint64_t> shape) noexcept {
  const std::size_t size = dtype_size(dtype);
  if (size == 0) return std::nullopt;
  auto n = element_count(shape);
  if (!n) return std::nullopt;
  return checked_mul(*n, size);
}

std::string shape_string(std::span<const std::uint64_t> shape) {
  return fmt::format("[{}]", fmt::join(shape, ", "));
}

}  // namespace ferry
