// ferry/sdk/fingerprint.hpp: the definition of ferry's fingerprint, xxh64-interleaved-v1
// (docs/fingerprint.md), as __host__ __device__ building blocks: its name and constants, the
// hash of one chunk's 64 accumulators, and a plain sequential reference of a chunk's hash. The
// CPU fingerprint (kernels/cpu/fingerprint.cpp), the CUDA kernels (kernels/cuda/fingerprint.cu,
// through ferry/sdk/fingerprint_cuda.cuh) and transport plugins that fingerprint what they copy
// all compute the value from these, so they cannot drift apart.
#pragma once

#include "ferry/sdk/xxh64.hpp"

#include <ferry/plugin.h>

#include <cstdint>

namespace ferry::sdk::fingerprint {

// The algorithm's name: it travels with every fingerprint a manifest carries. A different
// definition gets a different name, never a changed one.
inline constexpr const char* kAlgorithm = FERRY_FINGERPRINT_ALGORITHM;

// C: a fingerprint hashes its input in independent chunks of this many bytes (the last shorter).
inline constexpr std::uint64_t kChunkBytes = 1ull << 20;
// A chunk is read as rows of kRowBytes bytes, each row as kAccumulators little-endian 8-byte
// words; accumulator k takes word k of every row (on a GPU: lane j of a warp takes the 16-byte
// unit j of every row, words 2j and 2j + 1).
inline constexpr std::uint64_t kUnitBytes = 16;
inline constexpr unsigned kLanes = 32;
inline constexpr unsigned kAccumulators = 2 * kLanes;  // 64
inline constexpr std::uint64_t kRowBytes = kUnitBytes * kLanes;  // 512

// Accumulator k's starting value in chunk `index`: XXH64's first accumulator for the seed
// 64 * index + k.
FERRY_XXH_HD std::uint64_t initial_accumulator(std::uint64_t index, unsigned k) {
  return xxh64::initial_accumulator(0, index * kAccumulators + k);
}

// The chunk's hash from its 64 accumulators and its tail (the last `len % 16` bytes, which no
// accumulator took): XXH64 of the accumulators as 512 little-endian bytes followed by the tail,
// seeded with the chunk's length `len`. 512 is a multiple of XXH64's 32-byte stripe, so the
// accumulators are whole stripes and the tail goes to XXH64's finish.
FERRY_XXH_HD std::uint64_t hash_accumulators(const std::uint64_t acc[kAccumulators],
                                             const unsigned char* tail, std::uint64_t tail_len,
                                             std::uint64_t len) {
  std::uint64_t v[4];
  for (int i = 0; i < 4; ++i) v[i] = xxh64::initial_accumulator(i, len);
  for (unsigned s = 0; s < kAccumulators; s += 4) {
    for (unsigned i = 0; i < 4; ++i) v[i] = xxh64::accumulate(v[i], acc[s + i]);
  }
  return xxh64::finish(xxh64::converge(v), kAccumulators * 8 + tail_len, tail, tail_len);
}

// The hash of chunk `index` (`len` <= kChunkBytes bytes at `p`, any alignment), sequentially, as
// the definition reads: the reference the fast implementations are tested against.
FERRY_XXH_HD std::uint64_t chunk_hash(const unsigned char* p, std::uint64_t len,
                                      std::uint64_t index) {
  std::uint64_t acc[kAccumulators];
  for (unsigned k = 0; k < kAccumulators; ++k) acc[k] = initial_accumulator(index, k);
  const std::uint64_t units = len / kUnitBytes;
  for (std::uint64_t u = 0; u < units; ++u) {
    const unsigned k = 2 * static_cast<unsigned>(u % kLanes);
    acc[k] = xxh64::accumulate(acc[k], xxh64::read64(p + kUnitBytes * u));
    acc[k + 1] = xxh64::accumulate(acc[k + 1], xxh64::read64(p + kUnitBytes * u + 8));
  }
  return hash_accumulators(acc, p + units * kUnitBytes, len - units * kUnitBytes, len);
}

}  // namespace ferry::sdk::fingerprint
