// Tensors laid into buckets at FERRY_BUCKET_ALIGNMENT (see ferry/sdk/bucket_packing.hpp).
#include "ferry/sdk/bucket_packing.hpp"

#include "ferry/sdk/dtype.hpp"
#include "ferry/sdk/error.hpp"

namespace ferry::sdk {

static_assert((FERRY_BUCKET_ALIGNMENT & (FERRY_BUCKET_ALIGNMENT - 1)) == 0,
              "the bucket alignment is a power of two");

std::uint64_t bucket_align_up(std::uint64_t offset) {
  const auto padded = checked_add(offset, FERRY_BUCKET_ALIGNMENT - 1);
  if (!padded) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "bucket offset {} overflows when aligned to {} bytes",
         offset, FERRY_BUCKET_ALIGNMENT);
  }
  return *padded / FERRY_BUCKET_ALIGNMENT * FERRY_BUCKET_ALIGNMENT;
}

BucketPacking pack_buckets(std::span<const std::uint64_t> sizes, std::uint64_t capacity) {
  BucketPacking packing;
  packing.offsets.reserve(sizes.size());
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    const std::uint64_t size = sizes[i];
    std::uint64_t start = 0;
    bool fits = false;
    if (!packing.buckets.empty()) {
      const std::uint64_t end = packing.buckets.back().bytes;
      const auto padded = checked_add(end, FERRY_BUCKET_ALIGNMENT - 1);
      if (!padded) {
        fail(FERRY_STATUS_INVALID_ARGUMENT,
             "bucket packing: tensor {} ({} bytes) would start past a 64-bit offset (the tensor "
             "before it ends at {}): its offset overflows",
             i, size, end);
      }
      start = *padded / FERRY_BUCKET_ALIGNMENT * FERRY_BUCKET_ALIGNMENT;
      fits = start <= capacity && size <= capacity - start;
    }
    if (!fits) {  // the first tensor, or one that does not fit: a new bucket
      packing.buckets.push_back(PackedBucket{i, i, 0});
      start = 0;
    }
    PackedBucket& bucket = packing.buckets.back();
    packing.offsets.push_back(start);
    bucket.end = i + 1;
    bucket.bytes = start + size;
  }
  return packing;
}

}  // namespace ferry::sdk
