// ferry/formats/broadcast_layout.hpp: the tensors of one broadcast update (SGLang's names / dtypes / shapes)
// checked, and packed into buckets by a pure function that rank 0 and every receiver evaluate
// alike, so no manifest has to travel: both sides derive the same bucket manifests from the same
// request (same tensors in the same order, same bucket size).
#pragma once

#include <ferry/plugin.h>
#include <ferry/sdk/manifest.hpp>

#include <cstdint>
#include <string>
#include <vector>

namespace ferry::nccl {

inline constexpr std::uint64_t kDefaultBucketBytes = 256ull << 20;
inline constexpr std::uint64_t kMinBucketBytes = 1ull << 20;
inline constexpr std::uint64_t kMaxBucketBytes = 16ull << 30;

struct TensorSpec {
  std::string name;
  ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
  std::vector<std::uint64_t> shape;
  std::uint64_t bytes = 0;  // product(shape) * dtype size, overflow-checked
};

// Builds the tensor list from the three parallel lists of an update request. INVALID_ARGUMENT,
// naming the index and tensor, when the lists differ in length or are empty, a name is empty,
// longer than 1024 bytes, holds a NUL or repeats, a dtype is unknown (safetensors or torch
// spelling: "BF16", "bfloat16", "torch.bfloat16"), a shape has more than FERRY_MAX_DIMS dims or
// its byte size overflows.
std::vector<TensorSpec> make_tensor_specs(const std::vector<std::string>& names,
                                          const std::vector<std::string>& dtypes,
                                          const std::vector<std::vector<std::uint64_t>>& shapes);

// Checks a bucket size (INVALID_ARGUMENT outside kMinBucketBytes..kMaxBucketBytes).
void check_bucket_bytes(std::uint64_t bucket_bytes);

// Packs `tensors`, in order, into buckets of at most `bucket_bytes` (a tensor larger than that
// gets a bucket of its own) with sdk::pack_buckets: every tensor starts at a multiple of
// FERRY_BUCKET_ALIGNMENT. The manifests carry `version`, bucket_index / bucket_count and
// bucket_bytes (the end of the last tensor), and pass manifest::validate.
std::vector<manifest::Manifest> plan_buckets(const std::vector<TensorSpec>& tensors,
                                             std::uint64_t bucket_bytes, std::uint64_t version);

// The largest bucket_bytes of a plan (the staging size each side needs).
std::uint64_t largest_bucket(const std::vector<manifest::Manifest>& buckets);

}  // namespace ferry::nccl
