// ferry/sdk/dtype.hpp: element types: sizes, names as safetensors and the manifest spell them,
// and checked shape arithmetic (every product is overflow-checked).
#pragma once

#include <ferry/plugin.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string_view>

namespace ferry {

// Bytes per element; 0 for FERRY_DTYPE_INVALID or an out-of-range value.
std::size_t dtype_size(ferry_dtype_t dtype) noexcept;

// "F32", "BF16", "F8_E4M3", ... (the safetensors spelling). "INVALID" for unknown values.
const char* dtype_name(ferry_dtype_t dtype) noexcept;

// Parses the safetensors spelling; also accepts the lower-case torch names ("bfloat16",
// "float32", "float8_e4m3fn", ...). std::nullopt when unknown.
std::optional<ferry_dtype_t> dtype_from_name(std::string_view name) noexcept;

// a * b, or std::nullopt on uint64 overflow.
std::optional<std::uint64_t> checked_mul(std::uint64_t a, std::uint64_t b) noexcept;
// a + b, or std::nullopt on uint64 overflow.
std::optional<std::uint64_t> checked_add(std::uint64_t a, std::uint64_t b) noexcept;

// Product of the dims (1 for a scalar), or std::nullopt on overflow.
std::optional<std::uint64_t> element_count(std::span<const std::uint64_t> shape) noexcept;
// element_count * dtype_size, or std::nullopt on overflow or invalid dtype.
std::optional<std::uint64_t> byte_size(ferry_dtype_t dtype,
                                       std::span<const std::uint64_t> shape) noexcept;

// "[4096, 128]" for messages.
std::string shape_string(std::span<const std::uint64_t> shape);

}  // namespace ferry
