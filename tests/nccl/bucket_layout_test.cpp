// tests/nccl/bucket_layout_test.cpp: the tensor list of a broadcast update (SGLang's names,
// dtypes, shapes) is checked field by field, and both sides' bucket plans are equal, aligned,
// within the bucket size and valid manifests.
#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include <ferry/formats/broadcast_layout.hpp>

namespace ferry::nccl {
namespace {

using Shapes = std::vector<std::vector<std::uint64_t>>;

std::string message_of(const std::vector<std::string>& names,
                       const std::vector<std::string>& dtypes, const Shapes& shapes) {
  try {
    make_tensor_specs(names, dtypes, shapes);
  } catch (const Error& e) {
    EXPECT_EQ(e.code(), FERRY_STATUS_INVALID_ARGUMENT);
    return e.what();
  }
  ADD_FAILURE() << "accepted";
  return "";
}

TEST(BucketLayout, ParsesSafetensorsAndTorchDtypeSpellings) {
  const auto specs = make_tensor_specs({"a", "b", "c"}, {"BF16", "torch.float32", "int8"},
                                       {{2, 3}, {4}, {}});
  ASSERT_EQ(specs.size(), 3u);
  EXPECT_EQ(specs[0].dtype, FERRY_DTYPE_BF16);
  EXPECT_EQ(specs[0].bytes, 12u);
  EXPECT_EQ(specs[1].dtype, FERRY_DTYPE_F32);
  EXPECT_EQ(specs[1].bytes, 16u);
  EXPECT_EQ(specs[2].dtype, FERRY_DTYPE_I8);
  EXPECT_EQ(specs[2].bytes, 1u);  // a scalar
}

TEST(BucketLayout, RefusesBadNames) {
  EXPECT_NE(message_of({}, {}, {}).find("'names' is empty"), std::string::npos);
  EXPECT_NE(message_of({"a", ""}, {"F32", "F32"}, {{1}, {1}}).find("names[1] is empty"),
            std::string::npos);
  EXPECT_NE(message_of({"a", "a"}, {"F32", "F32"}, {{1}, {1}}).find("'a' (names[1]) is listed twice"),
            std::string::npos);
  EXPECT_NE(message_of({std::string("a\0b", 3)}, {"F32"}, {{1}}).find("NUL"), std::string::npos);
  EXPECT_NE(message_of({std::string(2000, 'x')}, {"F32"}, {{1}}).find("2000 bytes"),
            std::string::npos);
}

TEST(BucketLayout, RefusesListsOfDifferentLengths) {
  EXPECT_NE(message_of({"a", "b"}, {"F32"}, {{1}, {1}}).find("(got 2, 1, 2)"), std::string::npos);
}

TEST(BucketLayout, RefusesUnknownDtypes) {
  const auto m = message_of({"w"}, {"float128"}, {{1}});
  EXPECT_NE(m.find("tensor 'w' (index 0): unknown dtype 'float128'"), std::string::npos) << m;
  EXPECT_NE(message_of({"w"}, {""}, {{1}}).find("unknown dtype ''"), std::string::npos);
}

TEST(BucketLayout, RefusesBadShapes) {
  const auto dims = message_of({"w"}, {"F32"}, {{1, 1, 1, 1, 1, 1, 1, 1, 1}});
  EXPECT_NE(dims.find("9 dims (at most 8)"), std::string::npos) << dims;
  const auto big = message_of({"w"}, {"F32"}, {{1ull << 40, 1ull << 40}});
  EXPECT_NE(big.find("overflows"), std::string::npos) << big;
}

TEST(BucketLayout, PacksInOrderAlignedAndWithinTheBucketSize) {
  const std::uint64_t mib = 1 << 20;
  // 0.75 MiB (f32 196608), 0.5 MiB, 3 MiB (alone: larger than a bucket), 100 bytes.
  const auto specs = make_tensor_specs({"a", "b", "big", "tail"}, {"F32", "F16", "U8", "U8"},
                                       {{196608}, {262144}, {3 * mib}, {100}});
  const auto buckets = plan_buckets(specs, mib, 0);
  ASSERT_EQ(buckets.size(), 4u);  // a | b (a+b > 1 MiB) | big | tail
  EXPECT_EQ(buckets[0].tensors.at(0).name, "a");
  EXPECT_EQ(buckets[1].tensors.at(0).name, "b");
  EXPECT_EQ(buckets[2].tensors.at(0).name, "big");
  EXPECT_EQ(buckets[2].bucket_bytes, 3 * mib);
  EXPECT_EQ(largest_bucket(buckets), 3 * mib);
  for (std::uint32_t i = 0; i < buckets.size(); ++i) {
    EXPECT_EQ(buckets[i].bucket_index, i);
    EXPECT_EQ(buckets[i].bucket_count, 4u);
  }

  const auto small = make_tensor_specs({"x", "y", "z"}, {"U8", "U8", "BF16"}, {{10}, {300}, {7}});
  const auto one = plan_buckets(small, mib, 5);
  ASSERT_EQ(one.size(), 1u);
  EXPECT_EQ(one[0].version, 5u);
  ASSERT_EQ(one[0].tensors.size(), 3u);
  EXPECT_EQ(one[0].tensors[0].offset, 0u);
  EXPECT_EQ(one[0].tensors[1].offset, 256u);
  EXPECT_EQ(one[0].tensors[2].offset, 768u);  // 256 + 300 = 556, aligned up
  EXPECT_EQ(one[0].bucket_bytes, 768u + 14u);
}

TEST(BucketLayout, BothSidesDeriveIdenticalManifests) {
  std::vector<std::string> names, dtypes;
  Shapes shapes;
  for (int i = 0; i < 200; ++i) {
    names.push_back("layer." + std::to_string(i) + ".weight");
    dtypes.push_back(i % 2 ? "bfloat16" : "F32");
    shapes.push_back({64, static_cast<std::uint64_t>(100 + i)});
  }
  const auto trainer = plan_buckets(make_tensor_specs(names, dtypes, shapes), 1 << 20, 0);
  const auto receiver = plan_buckets(make_tensor_specs(names, dtypes, shapes), 1 << 20, 0);
  ASSERT_GT(trainer.size(), 1u);
  ASSERT_EQ(trainer.size(), receiver.size());
  std::size_t tensors = 0;
  for (std::size_t i = 0; i < trainer.size(); ++i) {
    EXPECT_EQ(manifest::encode(trainer[i]), manifest::encode(receiver[i]));
    EXPECT_LE(trainer[i].bucket_bytes, 1u << 20);
    // What travels as bytes decodes back to the same manifest.
    const auto decoded = manifest::decode(manifest::encode(trainer[i]));
    EXPECT_EQ(decoded.tensors.size(), trainer[i].tensors.size());
    tensors += trainer[i].tensors.size();
  }
  EXPECT_EQ(tensors, 200u);
}

TEST(BucketLayout, RefusesABucketSizeOutOfRange) {
  const auto specs = make_tensor_specs({"a"}, {"F32"}, {{4}});
  EXPECT_THROW(plan_buckets(specs, 1000, 0), Error);
  EXPECT_THROW(plan_buckets(specs, 64ull << 30, 0), Error);
}

}  // namespace
}  // namespace ferry::nccl
