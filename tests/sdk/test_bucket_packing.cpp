// Tests of the SDK's bucket packing (ferry/sdk/bucket_packing.hpp), the one layout every sender,
// source and broadcast group uses: tensors in order at FERRY_BUCKET_ALIGNMENT, a new bucket when
// the next does not fit.
#include <ferry/sdk/bucket_packing.hpp>
#include <ferry/sdk/error.hpp>
#include <gtest/gtest.h>

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace {

namespace sdk = ferry::sdk;

// The alignment is part of the wire contract (plugin.h): a receiver of an older build lays out
// and checks buckets with this value, so changing it is an ABI major change.
static_assert(FERRY_BUCKET_ALIGNMENT == 256);

std::string error_of(const std::function<void()>& body) {
  try {
    body();
  } catch (const ferry::Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_INVALID_ARGUMENT);
    return e.what();
  }
  return "";
}

TEST(BucketAlignUp, RoundsUpToTheAlignmentAndRefusesOverflow) {
  EXPECT_EQ(sdk::bucket_align_up(0), 0u);
  EXPECT_EQ(sdk::bucket_align_up(1), 256u);
  EXPECT_EQ(sdk::bucket_align_up(256), 256u);
  EXPECT_EQ(sdk::bucket_align_up(257), 512u);
  EXPECT_EQ(sdk::bucket_align_up(UINT64_MAX - 255), UINT64_MAX - 255);
  EXPECT_NE(error_of([] { sdk::bucket_align_up(UINT64_MAX - 254); }).find("overflows"),
            std::string::npos);
}

TEST(PackBuckets, PacksInOrderAlignedAndWithinTheCapacity) {
  // 100 + pad to 256, 300 ends at 556, 200 at 768 ends at 968; 100 more does not fit 1024
  // (1024 + 100): a new bucket; 2000 is larger than the capacity: a bucket of its own; 1 after it.
  const std::vector<std::uint64_t> sizes = {100, 300, 200, 100, 2000, 1};
  const sdk::BucketPacking p = sdk::pack_buckets(sizes, 1024);
  EXPECT_EQ(p.offsets, (std::vector<std::uint64_t>{0, 256, 768, 0, 0, 0}));
  ASSERT_EQ(p.buckets.size(), 4u);
  EXPECT_EQ(p.buckets[0].first, 0u);
  EXPECT_EQ(p.buckets[0].end, 3u);
  EXPECT_EQ(p.buckets[0].bytes, 968u);
  EXPECT_EQ(p.buckets[1].first, 3u);
  EXPECT_EQ(p.buckets[1].end, 4u);
  EXPECT_EQ(p.buckets[1].bytes, 100u);
  EXPECT_EQ(p.buckets[2].first, 4u);
  EXPECT_EQ(p.buckets[2].end, 5u);
  EXPECT_EQ(p.buckets[2].bytes, 2000u);
  EXPECT_EQ(p.buckets[3].bytes, 1u);
  for (std::size_t i = 0; i < sizes.size(); ++i) {
    EXPECT_EQ(p.offsets[i] % FERRY_BUCKET_ALIGNMENT, 0u) << i;
  }
}

TEST(PackBuckets, ATensorThatEndsExactlyAtTheCapacityStaysInTheBucket) {
  const sdk::BucketPacking p = sdk::pack_buckets(std::vector<std::uint64_t>{10, 768}, 1024);
  ASSERT_EQ(p.buckets.size(), 1u);
  EXPECT_EQ(p.offsets[1], 256u);
  EXPECT_EQ(p.buckets[0].bytes, 1024u);
}

TEST(PackBuckets, EmptyTensorsShareTheirBucketAndNoTensorsGiveNoBucket) {
  const sdk::BucketPacking p = sdk::pack_buckets(std::vector<std::uint64_t>{0, 0, 5}, 1024);
  ASSERT_EQ(p.buckets.size(), 1u);
  EXPECT_EQ(p.offsets, (std::vector<std::uint64_t>{0, 0, 0}));
  EXPECT_EQ(p.buckets[0].bytes, 5u);
  EXPECT_TRUE(sdk::pack_buckets(std::vector<std::uint64_t>{}, 1024).buckets.empty());
}

TEST(PackBuckets, AnOffsetThatOverflowsIsRefusedNamingTheTensor) {
  const std::string message = error_of(
      [] { sdk::pack_buckets(std::vector<std::uint64_t>{8, UINT64_MAX - 10, 1}, 1024); });
  EXPECT_NE(message.find("tensor 2"), std::string::npos) << message;
  EXPECT_NE(message.find("overflows"), std::string::npos) << message;
}

}  // namespace
