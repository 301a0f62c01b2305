// ferry/sdk/bucket_packing.hpp: how tensors are laid into buckets, written once for every side
// that packs them (the sender's push plan, the disk source, the NCCL broadcast layout that every
// rank derives alike): in order, each at the next multiple of FERRY_BUCKET_ALIGNMENT after the
// previous one (plugin.h), a new bucket when the next does not fit.
#pragma once

#include <ferry/plugin.h>

#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

namespace ferry::sdk {

// `offset` rounded up to a multiple of FERRY_BUCKET_ALIGNMENT. Throws INVALID_ARGUMENT when that
// overflows 64 bits.
std::uint64_t bucket_align_up(std::uint64_t offset);

// One bucket of a packing: tensors [first, end) of the packed list.
struct PackedBucket {
  std::size_t first = 0;
  std::size_t end = 0;
  std::uint64_t bytes = 0;  // the end of its last tensor (no trailing padding)
};

struct BucketPacking {
  std::vector<std::uint64_t> offsets;  // per tensor: where it starts in its bucket
  std::vector<PackedBucket> buckets;   // in order; none for no tensors
};

// Lays tensors of `sizes` bytes, in order, into buckets of at most `capacity` bytes: the first
// tensor of a bucket at 0, each next one at bucket_align_up(end of the previous one) when it
// ends within `capacity`, otherwise at 0 of a new bucket (so a tensor larger than `capacity`
// gets a bucket of its own). Pure: every side that packs the same sizes with the same capacity
// gets the same buckets. Throws INVALID_ARGUMENT, naming the tensor's index, when an offset
// overflows 64 bits.
BucketPacking pack_buckets(std::span<const std::uint64_t> sizes, std::uint64_t capacity);

}  // namespace ferry::sdk
