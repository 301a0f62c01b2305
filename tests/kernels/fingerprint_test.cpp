// Tests of the xxh64-interleaved-v1 fingerprint: the test vectors of docs/fingerprint.md, the
// definition restated lane by lane against the CPU fingerprint and the SDK's reference chunk hash
// (the one the CUDA kernels are built from), chunk, row and unit boundaries, independence from the
// thread count, and the device-side XXH64 (ferry/sdk/xxh64.hpp) against libxxhash on the host.
#include "ferry/kernels/cpu.hpp"
#include "ferry/sdk/fingerprint.hpp"
#include "ferry/sdk/xxh64.hpp"

#include <gtest/gtest.h>
#include <xxhash.h>

#include <cstring>
#include <initializer_list>
#include <random>
#include <vector>

namespace fk = ferry::kernels;
namespace xxh64 = ferry::sdk::xxh64;
namespace fpd = ferry::sdk::fingerprint;

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

std::uint64_t le64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// One chunk's hash restated as docs/fingerprint.md reads, lane by lane: lane j's two
// accumulators (seeds 64 i + 2j and 64 i + 2j + 1) over the words of units j, j + 32, ..; XXH64
// (libxxhash) of the 64 accumulators as little-endian bytes and the tail, seeded with the length.
std::uint64_t restated_chunk(const unsigned char* p, std::uint64_t len, std::uint64_t i) {
  const std::uint64_t units = len / 16;
  std::vector<unsigned char> block;
  for (std::uint64_t j = 0; j < 32; ++j) {
    std::uint64_t acc[2] = {64 * i + 2 * j + xxh64::kPrime1 + xxh64::kPrime2,
                            64 * i + 2 * j + 1 + xxh64::kPrime1 + xxh64::kPrime2};
    for (std::uint64_t u = j; u < units; u += 32) {
      for (int w = 0; w < 2; ++w) acc[w] = xxh64::accumulate(acc[w], le64(p + 16 * u + 8 * w));
    }
    for (std::uint64_t a : acc) {
      for (int b = 0; b < 8; ++b) block.push_back(static_cast<unsigned char>(a >> (8 * b)));
    }
  }
  block.insert(block.end(), p + 16 * units, p + len);
  return XXH64(block.data(), block.size(), len);
}

// The whole definition restated: each 1 MiB chunk's hash, then XXH64 of the little-endian hash
// array seeded with the total length.
std::uint64_t restated(const std::vector<unsigned char>& data) {
  std::vector<unsigned char> hashes;
  for (std::uint64_t begin = 0, i = 0; begin < data.size(); begin += kMiB, ++i) {
    const std::uint64_t len = std::min<std::uint64_t>(kMiB, data.size() - begin);
    const std::uint64_t h = restated_chunk(data.data() + begin, len, i);
    for (int b = 0; b < 8; ++b) hashes.push_back(static_cast<unsigned char>(h >> (8 * b)));
  }
  return XXH64(hashes.data(), hashes.size(), data.size());
}

}  // namespace

TEST(Fingerprint, TestVectorsOfTheDocumentHold) {
  // Values from docs/fingerprint.md ("Test vectors"); changing them is a format change.
  EXPECT_EQ(fk::fingerprint_cpu(nullptr, 0), 0xef46db3751d8e999ull);
  const auto p1 = pattern(1);
  EXPECT_EQ(fk::fingerprint_cpu(p1.data(), p1.size()), 0x85c5f45c3b577d87ull);
  const auto p1000 = pattern(1000);
  EXPECT_EQ(fk::fingerprint_cpu(p1000.data(), p1000.size()), 0xc902bacc6de8da7full);
  const auto p_mib = pattern(kMiB);
  EXPECT_EQ(fk::fingerprint_cpu(p_mib.data(), p_mib.size()), 0x013883e45bf006f9ull);
  const auto p_big = pattern(3 * kMiB + 12345);
  EXPECT_EQ(fk::fingerprint_cpu(p_big.data(), p_big.size()), 0x24eb819fe11702bfull);
  EXPECT_STREQ(fpd::kAlgorithm, "xxh64-interleaved-v1");
}

TEST(Fingerprint, ReferenceChunkHashFollowsTheDefinition) {
  // Every unit count of the first rows, a unit's inner bytes (the tail), a row's edges, and a
  // whole chunk; from a misaligned start too.
  const auto data = random_bytes(kMiB + 64, 7);
  std::vector<std::uint64_t> lengths;
  for (std::uint64_t n = 0; n <= 1100; ++n) lengths.push_back(n);
  for (std::uint64_t n :
       std::initializer_list<std::uint64_t>{4095, 4096, 4097, 65536 + 15, kMiB - 1, kMiB}) {
    lengths.push_back(n);
  }
  for (std::uint64_t offset : std::initializer_list<std::uint64_t>{0, 3, 8}) {
    for (std::uint64_t n : lengths) {
      const unsigned char* p = data.data() + offset;
      ASSERT_EQ(fpd::chunk_hash(p, n, 5), restated_chunk(p, n, 5)) << n << " at +" << offset;
    }
  }
  // The index seeds every accumulator: the same bytes as another chunk hash differently.
  EXPECT_NE(fpd::chunk_hash(data.data(), 100, 0), fpd::chunk_hash(data.data(), 100, 1));
  EXPECT_NE(fpd::chunk_hash(data.data(), 5, 0), fpd::chunk_hash(data.data(), 5, 1));
}

TEST(Fingerprint, ChunkBoundariesFollowTheDefinition) {
  const auto data = random_bytes(kMiB + 600, 1);
  for (std::uint64_t n : std::initializer_list<std::uint64_t>{
           0, 1, 15, 16, 17, 511, 512, 513, 527, 1000, kMiB - 1, kMiB, kMiB + 1, kMiB + 16,
           kMiB + 528}) {
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

// A range written in pieces that start on chunk boundaries: each piece's chunk hashes, taken
// with the index of its first chunk in the range, are the range's own, so the range's
// fingerprint is made from them without reading it again; a piece's own chunk numbering (0)
// and a piece that ends inside a chunk of the range give other hashes.
TEST(Fingerprint, PiecesOnChunkBoundariesMakeTheRangesFingerprint) {
  const auto data = random_bytes(7 * kMiB + 300, 5);
  const std::uint64_t whole = fk::fingerprint_cpu(data.data(), data.size());
  const std::vector<std::uint64_t> cuts = {0, 2 * kMiB, 3 * kMiB, 6 * kMiB, data.size()};
  std::vector<std::uint64_t> hashes;
  for (std::size_t k = 0; k + 1 < cuts.size(); ++k) {
    const auto piece = fk::fingerprint_chunks_cpu(data.data() + cuts[k], cuts[k + 1] - cuts[k],
                                                  cuts[k] / kMiB, k % 2 ? 1 : 3);
    hashes.insert(hashes.end(), piece.begin(), piece.end());
  }
  EXPECT_EQ(fk::combine_chunk_hashes(hashes, data.size()), whole);
  EXPECT_EQ(hashes, fk::fingerprint_chunks_cpu(data.data(), data.size(), 0));
  // Numbered from 0, the second piece's hashes differ from the range's.
  const auto own = fk::fingerprint_chunks_cpu(data.data() + 2 * kMiB, kMiB, 0);
  EXPECT_NE(own[0], hashes[2]);
  // A piece ending half-way through chunk 3: its last hash is not chunk 3's.
  const auto short_piece = fk::fingerprint_chunks_cpu(data.data() + 3 * kMiB, kMiB / 2, 3);
  EXPECT_NE(short_piece[0], hashes[3]);
  // The range's last, shorter chunk is the same from a piece that ends with the range.
  const auto tail = fk::fingerprint_chunks_cpu(data.data() + 7 * kMiB, 300, 7);
  EXPECT_EQ(tail[0], hashes[7]);
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
  // Two 16-byte units swapped within a chunk: of one lane (j and j + 32), and of two lanes.
  for (std::uint64_t other : std::initializer_list<std::uint64_t>{16 * 32, 16 * 5}) {
    auto units = data;
    std::memcpy(units.data() + 1024, data.data() + 1024 + other, 16);
    std::memcpy(units.data() + 1024 + other, data.data() + 1024, 16);
    EXPECT_NE(fk::fingerprint_cpu(units.data(), units.size()), base) << other;
  }
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
