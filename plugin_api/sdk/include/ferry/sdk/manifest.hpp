// ferry/sdk/manifest.hpp: building and reading bucket manifests (tensor_meta.capnp) as plain
// C++ values. decode() is the only way bytes from a plugin or the wire become a Manifest: it
// applies Cap'n Proto traversal and nesting limits and then validate(), so every offset, size and
// shape product a caller sees has been checked (overflow-checked arithmetic, no overlaps, nothing
// past the bucket).
#pragma once

#include <ferry/plugin.h>

#include <cstdint>
#include <optional>
#include <span>
#include <string>
#include <vector>

namespace ferry::manifest {

inline constexpr const char* kFingerprintAlgorithm = FERRY_FINGERPRINT_ALGORITHM;

struct Quantization {
  std::string scheme;  // "fp8-block"
  std::uint32_t block_rows = 0;
  std::uint32_t block_cols = 0;
  ferry_dtype_t scale_dtype = FERRY_DTYPE_F32;
  std::string scale_format;  // "" or "ue8m0"
};

struct Sharding {
  std::uint32_t dim = 0;
  std::uint32_t index = 0;
  std::uint32_t count = 1;
};

// A block of a global tensor (a sharded sender's piece): the entry's shape is the block's extent
// per dimension, `offsets` where it starts in the tensor of `global_shape` (same rank). The
// bytes are the block's own elements, row-major.
struct Block {
  std::vector<std::uint64_t> global_shape;
  std::vector<std::uint64_t> offsets;
  friend bool operator==(const Block&, const Block&) = default;
};

struct Entry {
  std::string name;
  ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
  std::vector<std::uint64_t> shape;
  std::uint64_t offset = 0;  // bytes into the bucket
  std::uint64_t size = 0;    // bytes
  std::optional<std::uint64_t> fingerprint;  // kFingerprintAlgorithm
  std::optional<Quantization> quantization;
  std::optional<Sharding> sharding;
  std::optional<Block> block;
};

struct Manifest {
  std::uint64_t version = 0;
  std::string version_label;
  std::uint32_t bucket_index = 0;
  std::uint32_t bucket_count = 0;  // 0: a catalog (offsets are not checked against a bucket)
  std::uint64_t bucket_bytes = 0;
  std::vector<Entry> tensors;
};

// Limits applied while decoding untrusted bytes.
struct Limits {
  std::uint64_t max_message_bytes = 256ull << 20;
  std::uint64_t traversal_limit_words = 64ull << 20;  // capnp ReaderOptions
  int nesting_limit = 16;                             // capnp ReaderOptions
  std::size_t max_tensors = 1u << 20;
  std::size_t max_name_bytes = 1024;
  std::size_t max_dims = FERRY_MAX_DIMS;
  std::uint64_t max_bucket_gap = 4096;  // alignment padding allowed between tensors
};

// Checks a manifest against the rules (docs/plugin-abi.md, "Manifests"): known dtypes, at most
// max_dims dims, size == product(shape) * dtype size without overflow, non-empty unique names,
// and for a bucket (bucket_count > 0): bucket_index < bucket_count, entries sorted by offset,
// non-overlapping, inside bucket_bytes, gaps no larger than max_bucket_gap. Also: names at most
// max_name_bytes and without NUL bytes, a known quantization scale dtype, sharding index < count
// and dim < ndim, a block of the entry's rank whose offsets + shape lie inside its global shape.
// Throws ferry::Error (CORRUPT_DATA) whose message names the tensor and the rule:
// "manifest: tensor 'x' (index 3): size 12 != product(shape [2, 3]) * 4 = 24".
void validate(const Manifest& manifest, const Limits& limits = {});

// Serializes (after validate) to a flat Cap'n Proto message.
std::vector<std::uint8_t> encode(const Manifest& manifest);

// Parses untrusted bytes with `limits`, then validate(). Throws ferry::Error (CORRUPT_DATA).
// The bytes must be exactly one message (no trailing words); misaligned input is copied. A
// fingerprint whose algorithm is not kFingerprintAlgorithm is rejected.
Manifest decode(std::span<const std::uint8_t> bytes, const Limits& limits = {});

// A stable 64-bit signature of what a plan depends on: each entry's name, dtype and shape, in
// order (not offsets, fingerprints or versions). Equal signatures => the cached plan applies.
// Algorithm (stable across builds and hosts): FNV-1a 64 over little-endian u64 fields: the entry
// count, then per entry the name length, the name bytes, the dtype, ndim and each dim.
std::uint64_t signature(const Manifest& manifest);

// The descriptions' names, dtypes and shapes, in order, as one byte string: equal strings <=>
// equal lists. For caching what depends only on them (compare the strings; a signature could
// collide). A NULL name counts as empty.
std::string catalog_key(std::span<const ferry_tensor_desc_t> descs);

// One tensor as a ferry_tensor_desc_t; its name points into `name`, which must outlive it.
// INVALID_ARGUMENT when the shape has more than FERRY_MAX_DIMS dims.
ferry_tensor_desc_t tensor_desc(const std::string& name, ferry_dtype_t dtype,
                                std::span<const std::uint64_t> shape);

// The entries as ferry_tensor_desc_t (for model plugins). Names point into `manifest`, which
// must outlive the result.
std::vector<ferry_tensor_desc_t> tensor_descs(const Manifest& manifest);

}  // namespace ferry::manifest
