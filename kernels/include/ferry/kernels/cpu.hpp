// ferry/kernels/cpu.hpp: the CPU data-movement kernels. They are the reference twins of the CUDA
// kernels (kernels/cuda/): a CUDA kernel must produce the same bytes for the same inputs.
//
//  - scatter: executes a plan (ferry_plan_op_t list) from one bucket into many parameters, with
//    dtype casts (round-to-nearest-even), in one call per bucket, parallel over threads.
//  - fingerprint: the xxh64-interleaved-v1 algorithm of docs/fingerprint.md.
#pragma once

#include <ferry/plugin.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace ferry::kernels {

// One manifest entry in a bucket: its first byte, its element type and its element count.
// dtype = FERRY_DTYPE_INVALID means "not known": then the op's src_dtype is trusted.
struct EntryView {
  const std::byte* data = nullptr;
  ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
  std::uint64_t elements = 0;
};

// Where one parameter of the target layout lives.
struct ParamView {
  std::byte* data = nullptr;
  ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
  std::uint64_t elements = 0;
};

// Executes `ops` reading from the bucket entries (`entries[i]` = first byte of manifest entry i,
// with `entry_elements[i]` elements) into `params`. Every op is bounds-checked against its source
// entry and destination parameter before any byte is written; a bad op throws ferry::Error
// (INVALID_ARGUMENT) naming the op and nothing is written. `threads` = 0 uses the hardware count.
// The entries' dtypes are not known here, so each op's src_dtype is trusted (the EntryView
// overload below checks it too). Threading: any thread; calls share nothing.
void scatter_cpu(std::span<const ferry_plan_op_t> ops, std::span<const std::byte* const> entries,
                 std::span<const std::uint64_t> entry_elements, std::span<const ParamView> params,
                 unsigned threads = 0);

// The same, with the entries' dtypes known: an op whose src_dtype differs from its entry's dtype
// is refused too.
void scatter_cpu(std::span<const ferry_plan_op_t> ops, std::span<const EntryView> entries,
                 std::span<const ParamView> params, unsigned threads = 0);

// The checks scatter_cpu (and the CUDA scatter) make before writing anything: every index in
// range, the op's dtypes equal to its entry's (when known) and parameter's dtypes, a supported
// transform and dtype pair, rows > 1 only with dst_row_stride >= cols (rows of one op never
// overlap), and the last element touched inside the entry and the parameter (checked
// arithmetic). Throws ferry::Error(INVALID_ARGUMENT) naming the op index, entry, parameter and the
// rule. Ops with rows == 0 or cols == 0 touch nothing and pass. Destinations of *different* ops
// are not checked for overlap: a plan must not write one element twice (the order between ops
// is unspecified).
void check_plan(std::span<const ferry_plan_op_t> ops, std::span<const EntryView> entries,
                std::span<const ParamView> params);

// Whether FERRY_TRANSFORM_CAST supports src -> dst: any pair of F64, F32, F16, BF16, F8_E4M3,
// F8_E5M2, and the lossless integer widenings (BOOL, U8, I8 -> I16/I32/I64, I16 -> I32/I64,
// I32 -> I64, BOOL -> U8/I8). Equal dtypes are supported (a plain copy).
bool cast_supported(ferry_dtype_t src, ferry_dtype_t dst) noexcept;

// Converts `count` elements from `src` (dtype `src_dtype`) to `dst` (dtype `dst_dtype`), with the
// rules of ferry/kernels/float_bits.hpp. Pointers need no alignment. Throws INVALID_ARGUMENT when
// !cast_supported(src_dtype, dst_dtype).
void convert_elements(const void* src, ferry_dtype_t src_dtype, void* dst, ferry_dtype_t dst_dtype,
                      std::uint64_t count);

// Bytes of the fingerprint chunking (docs/fingerprint.md).
inline constexpr std::uint64_t kFingerprintChunkBytes = 1ull << 20;

// The hardware's thread count (at least 1), read once per process: what `threads` = 0 means
// below.
unsigned hardware_threads() noexcept;

// xxh64-interleaved-v1 of `bytes` bytes at `data`. `threads` = 0 uses the hardware count.
std::uint64_t fingerprint_cpu(const void* data, std::uint64_t bytes, unsigned threads = 0);

// The chunk hashes of `bytes` bytes at `data` taken as chunks first_index, first_index + 1, ..
// of a longer range (docs/fingerprint.md, "Fingerprints of a range written in pieces"): the
// range's own chunk hashes when `data` starts first_index * kFingerprintChunkBytes bytes into it
// (the last one only where the range ends with `data`).
std::vector<std::uint64_t> fingerprint_chunks_cpu(const void* data, std::uint64_t bytes,
                                                  std::uint64_t first_index, unsigned threads = 0);
// The fingerprint of a range of `bytes` bytes from its chunk hashes, in order (step 4 of the
// definition): fingerprint_cpu(data, bytes) ==
// combine_chunk_hashes(fingerprint_chunks_cpu(data, bytes, 0), bytes).
std::uint64_t combine_chunk_hashes(std::span<const std::uint64_t> hashes, std::uint64_t bytes);

// FP8 block quantization (FERRY_TRANSFORM_FP8_BLOCK_QUANT; arithmetic in fp8_block.hpp).
// Scale addressing, the convention every FP8 op follows (the ABI has only scale_param):
//  - the destination parameter (dtype F8_E4M3) is viewed as a row-major matrix of K =
//    op.dst_row_stride columns and M = param.elements / K rows (K must divide the element count);
//    a stacked [E, N, K] parameter is the matrix [E*N, K] (so its N must be a multiple of 128);
//  - the op's block starts at row dst_offset / K, column dst_offset % K and covers whole 128x128
//    tiles of that matrix: both start at multiples of 128, and rows (cols) is a multiple of 128
//    or reaches the last row M (column K): only the matrix's own edges make partial tiles;
//  - scale_param names a F32 parameter holding at least ceil(M/128) * ceil(K/128) elements; the
//    scale of tile (i, j) is element i * ceil(K/128) + j (shape [ceil(N/128), ceil(K/128)], or
//    [E, ceil(N/128), ceil(K/128)] stacked).
// So the tiles of different ops never overlap and an op writes each of its tiles' scales.
// check_fp8_plan throws INVALID_ARGUMENT naming the op and the rule broken (after check_plan).
void check_fp8_plan(std::span<const ferry_plan_op_t> ops, std::span<const EntryView> entries,
                    std::span<const ParamView> params);

// Executes FP8 ops only (any other transform is refused): per tile the source is read once from
// memory (the amax pass and the quantize pass share the cached tile) and written once as e4m3,
// plus one float32 scale. Validates everything first (check_fp8_plan); nothing is written on a
// bad plan. `threads` = 0 uses the hardware count. Any thread; calls share nothing.
void fp8_block_quant_cpu(std::span<const ferry_plan_op_t> ops, std::span<const EntryView> entries,
                         std::span<const ParamView> params, unsigned threads = 0);

// Scalar conversions shared by scatter and tests (round-to-nearest-even, NaN preserved; the exact
// rules are in ferry/kernels/float_bits.hpp).
float bf16_to_f32(std::uint16_t v) noexcept;
std::uint16_t f32_to_bf16(float v) noexcept;
float f16_to_f32(std::uint16_t v) noexcept;
std::uint16_t f32_to_f16(float v) noexcept;
// FP8 e4m3fn: saturates to +-448 (inf included), one NaN per sign. FP8 e5m2: IEEE-like.
float e4m3_to_f32(std::uint8_t v) noexcept;
std::uint8_t f32_to_e4m3(float v) noexcept;
float e5m2_to_f32(std::uint8_t v) noexcept;
std::uint8_t f32_to_e5m2(float v) noexcept;

}  // namespace ferry::kernels
