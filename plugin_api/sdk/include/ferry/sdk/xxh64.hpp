// ferry/sdk/xxh64.hpp: XXH64 written from its specification (xxHash spec, "XXH64 algorithm
// description") as __host__ __device__ building blocks, so device code (ferry's CUDA fingerprint
// kernel, transport plugins that fingerprint while they copy) can hash on the GPU without
// libxxhash. The CPU path uses libxxhash; tests/kernels checks that this implementation equals
// libxxhash on the host.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FERRY_XXH_HD __host__ __device__ __forceinline__
#else
#define FERRY_XXH_HD inline
#endif

namespace ferry::sdk::xxh64 {

inline constexpr std::uint64_t kPrime1 = 0x9E3779B185EBCA87ull;
inline constexpr std::uint64_t kPrime2 = 0xC2B2AE3D27D4EB4Full;
inline constexpr std::uint64_t kPrime3 = 0x165667B19E3779F9ull;
inline constexpr std::uint64_t kPrime4 = 0x85EBCA77C2B2AE63ull;
inline constexpr std::uint64_t kPrime5 = 0x27D4EB2F165667C5ull;
// Bytes consumed per step by the four accumulators together.
inline constexpr std::uint64_t kStripeBytes = 32;

FERRY_XXH_HD std::uint64_t rotl(std::uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

// Little-endian reads from bytes (no alignment needed; the hosts and GPUs we build for are
// little-endian, but reading byte by byte keeps this independent of that).
FERRY_XXH_HD std::uint64_t read64(const unsigned char* p) {
  std::uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}
FERRY_XXH_HD std::uint32_t read32(const unsigned char* p) {
  std::uint32_t v = 0;
  for (int i = 3; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

FERRY_XXH_HD std::uint64_t accumulate(std::uint64_t acc, std::uint64_t lane) {
  acc += lane * kPrime2;
  acc = rotl(acc, 31);
  return acc * kPrime1;
}

FERRY_XXH_HD std::uint64_t merge_accumulator(std::uint64_t acc, std::uint64_t acc_n) {
  acc ^= accumulate(0, acc_n);
  return acc * kPrime1 + kPrime4;
}

// The four accumulators' starting values for `seed` (used when the input has >= 32 bytes).
FERRY_XXH_HD std::uint64_t initial_accumulator(int lane, std::uint64_t seed) {
  switch (lane) {
    case 0: return seed + kPrime1 + kPrime2;
    case 1: return seed + kPrime2;
    case 2: return seed;
    default: return seed - kPrime1;
  }
}

// Converges the four accumulators (only for inputs of >= 32 bytes).
FERRY_XXH_HD std::uint64_t converge(const std::uint64_t v[4]) {
  std::uint64_t acc = rotl(v[0], 1) + rotl(v[1], 7) + rotl(v[2], 12) + rotl(v[3], 18);
  for (int i = 0; i < 4; ++i) acc = merge_accumulator(acc, v[i]);
  return acc;
}

// Adds the total length, consumes the last (< 32) bytes at `tail` and avalanches.
FERRY_XXH_HD std::uint64_t finish(std::uint64_t acc, std::uint64_t total_len,
                                  const unsigned char* tail, std::uint64_t tail_len) {
  acc += total_len;
  while (tail_len >= 8) {
    acc ^= accumulate(0, read64(tail));
    acc = rotl(acc, 27) * kPrime1 + kPrime4;
    tail += 8;
    tail_len -= 8;
  }
  if (tail_len >= 4) {
    acc ^= static_cast<std::uint64_t>(read32(tail)) * kPrime1;
    acc = rotl(acc, 23) * kPrime2 + kPrime3;
    tail += 4;
    tail_len -= 4;
  }
  while (tail_len > 0) {
    acc ^= static_cast<std::uint64_t>(*tail) * kPrime5;
    acc = rotl(acc, 11) * kPrime1;
    ++tail;
    --tail_len;
  }
  acc ^= acc >> 33;
  acc *= kPrime2;
  acc ^= acc >> 29;
  acc *= kPrime3;
  acc ^= acc >> 32;
  return acc;
}

// The whole hash of `len` bytes, sequentially.
FERRY_XXH_HD std::uint64_t hash(const void* data, std::uint64_t len, std::uint64_t seed) {
  const auto* p = static_cast<const unsigned char*>(data);
  std::uint64_t acc;
  std::uint64_t done = 0;
  if (len >= kStripeBytes) {
    std::uint64_t v[4];
    for (int i = 0; i < 4; ++i) v[i] = initial_accumulator(i, seed);
    for (; done + kStripeBytes <= len; done += kStripeBytes) {
      for (int i = 0; i < 4; ++i) v[i] = accumulate(v[i], read64(p + done + 8 * i));
    }
    acc = converge(v);
  } else {
    acc = seed + kPrime5;
  }
  return finish(acc, len, p + done, len - done);
}

}  // namespace ferry::sdk::xxh64
