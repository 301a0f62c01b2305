// Tests of the xxh64-chunked-v1 fingerprint: the test vectors of docs/fingerprint.md, the chunk
// boundaries, independence from the thread count, and the device-side XXH64 (ferry/sdk/xxh64.hpp,
// used by the CUDA kernels) against libxxhash on the host.
#include "ferry/kernels/cpu.hpp"
#include "ferry/sdk/xxh64.hpp"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <random>
#include <vector>

namespace fk = ferry::kernels;
namespace xxh64 = ferry::sdk::xxh64;

namespace {

constexpr std::uint64_t kMiB = 1ull << 20;

// The test-vector input of docs/fingerprint.md: byte i = (i * 7 + 3) mod 251.
std::vector<unsigned char> pattern(std::uint64_t n) {
  std::vector<unsigned char> v(n);
  for (std::uint64_t i = 0; i < n; ++i) v[i] = static_cast<unsigned char>((i * 7 + 3) % 251);
  return v;
}

std::vector<unsigned char> random_bytes(std::uint64_t n, unsigned seed) {
  std::vector<unsigned char> v(n);
  std::mt19937_64 rng(seed);
  for (auto& b : v) b = static_cast<unsigned char>(rng());
  return v;
}

// The definition restated directly: XXH64 of each 1 MiB chunk seeded with its index, then XXH64
// of the little-endian hash array seeded with the total length.
std::uint64_t restated(const std::vector<unsigned char>& data) {
  std::vector<unsigned char> hashes;
  for (std::uint64_t begin = 0, i = 0; begin < data.size(); begin += kMiB, ++i) {
    const std::uint64_t len = std::min<std::uint64_t>(kMiB, data.size() - begin);
    const std::uint64_t h = XXH64(data.data() + begin, len, i);
    for (int b = 0; b < 8; ++b) hashes.push_back(static_cast<unsigned char>(h >> (8 * b)));
  }
  return XXH64(hashes.data(), hashes.size(), data.size());
}

}  // namespace

TEST(Fingerprint, TestVectorsOfTheDocumentHold) {
  // Values from docs/fingerprint.md ("Test vectors"); changing them is a format change.
  EXPECT_EQ(fk::fingerprint_cpu(nullptr, 0), 0xef46db3751d8e999ull);
  const auto p1 = pattern(1);
  EXPECT_EQ(fk::fingerprint_cpu(p1.data(), p1.size()), 0x8f9741c8cbb7349bull);
  const auto p1000 = pattern(1000);
  EXPECT_EQ(fk::fingerprint_cpu(p1000.data(), p1000.size()), 0x091cb5e5820b4070ull);
  const auto p_mib = pattern(kMiB);
  EXPECT_EQ(fk::fingerprint_cpu(p_mib.data(), p_mib.size()), 0xd91d4185da0cf7f0ull);
  const auto p_big = pattern(3 * kMiB + 12345);
  EXPECT_EQ(fk::fingerprint_cpu(p_big.data(), p_big.size()), 0x3863803dd40e5563ull);
}

TEST(Fingerprint, ChunkBoundariesFollowTheDefinition) {
  const auto data = random_bytes(kMiB + 1, 1);
  for (std::uint64_t n : {std::uint64_t{0}, std::uint64_t{1}, kMiB - 1, kMiB, kMiB + 1}) {
    const std::vector<unsigned char> prefix(data.begin(), data.begin() + static_cast<long>(n));
    EXPECT_EQ(fk::fingerprint_cpu(prefix.data(), n), restated(prefix)) << n;
  }
  // One chunk of exactly 1 MiB is still combined (not the chunk hash itself).
  EXPECT_NE(fk::fingerprint_cpu(data.data(), kMiB), XXH64(data.data(), kMiB, 0));
}

TEST(Fingerprint, ThreadCountDoesNotChangeTheValue) {
  const auto data = random_bytes(9 * kMiB + 123, 2);
  const std::uint64_t one = fk::fingerprint_cpu(data.data(), data.size(), 1);
  EXPECT_EQ(one, restated(data));
  for (unsigned threads : {0u, 2u, 3u, 8u, 64u}) {
    EXPECT_EQ(fk::fingerprint_cpu(data.data(), data.size(), threads), one) << threads;
  }
}

TEST(Fingerprint, ChangedSwappedOrTruncatedBytesChangeTheValue) {
  auto data = random_bytes(2 * kMiB + 7, 3);
  const std::uint64_t base = fk::fingerprint_cpu(data.data(), data.size());
  data[kMiB + 5] ^= 1;
  EXPECT_NE(fk::fingerprint_cpu(data.data(), data.size()), base);
  data[kMiB + 5] ^= 1;
  EXPECT_EQ(fk::fingerprint_cpu(data.data(), data.size()), base);
  EXPECT_NE(fk::fingerprint_cpu(data.data(), data.size() - 1), base);
  // Two equal-length chunks swapped: same multiset of bytes, different value (chunk seeds).
  auto swapped = data;
  std::memcpy(swapped.data(), data.data() + kMiB, kMiB);
  std::memcpy(swapped.data() + kMiB, data.data(), kMiB);
  EXPECT_NE(fk::fingerprint_cpu(swapped.data(), swapped.size()), base);
}

TEST(Fingerprint, DeviceXxh64EqualsLibxxhash) {
  const auto data = random_bytes(4096, 4);
  std::mt19937_64 rng(5);
  for (std::uint64_t len = 0; len <= 200; ++len) {
    const std::uint64_t seed = rng();
    ASSERT_EQ(xxh64::hash(data.data() + 3, len, seed), XXH64(data.data() + 3, len, seed))
        << len;
  }
  for (std::uint64_t len : {1000, 1023, 4000}) {
    ASSERT_EQ(xxh64::hash(data.data(), len, len), XXH64(data.data(), len, len)) << len;
  }
  const auto chunk = random_bytes(kMiB, 6);
  EXPECT_EQ(xxh64::hash(chunk.data(), kMiB, 7), XXH64(chunk.data(), kMiB, 7));
}
