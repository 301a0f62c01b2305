// bench/common/data.hpp: the bytes `ferry bench` moves: a random-looking source pattern
// (splitmix64, the same bytes on the CPU and in the CUDA fill kernel) and the poison that
// destinations hold before a run, so that a byte the kernel never wrote cannot pass for a correct
// one.
#pragma once

#include <cstddef>
#include <cstdint>
#include <cstring>

#if defined(__CUDACC__)
#define FERRY_BENCH_HOST_DEVICE __host__ __device__
#else
#define FERRY_BENCH_HOST_DEVICE
#endif

namespace ferry::bench {

// Every destination byte before the first run. Not a value the source pattern favours.
inline constexpr unsigned char kPoisonByte = 0xA5;

// Bytes between two destination slots of a scatter case: parameters are separate allocations
// in an engine, and the gaps must still hold the poison after the scatter (no overrun).
inline constexpr std::uint64_t kSlotGapBytes = 512;

// Word `index` of the pattern seeded by `seed` (splitmix64 of seed + index).
FERRY_BENCH_HOST_DEVICE inline std::uint64_t pattern_word(std::uint64_t seed,
                                                          std::uint64_t index) {
  std::uint64_t z = seed + (index + 1) * 0x9E3779B97F4A7C15ull;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Fills `bytes` bytes at `data` with the pattern: byte i is byte (i % 8) of word i / 8, in
// little-endian order. The CUDA fill kernel writes the same bytes.
inline void fill_pattern_cpu(void* data, std::uint64_t bytes, std::uint64_t seed) {
  auto* out = static_cast<unsigned char*>(data);
  const std::uint64_t words = bytes / 8;
  for (std::uint64_t w = 0; w < words; ++w) {
    const std::uint64_t v = pattern_word(seed, w);
    for (int b = 0; b < 8; ++b) out[w * 8 + b] = static_cast<unsigned char>(v >> (8 * b));
  }
  const std::uint64_t last = pattern_word(seed, words);
  for (std::uint64_t i = words * 8; i < bytes; ++i) {
    out[i] = static_cast<unsigned char>(last >> (8 * (i - words * 8)));
  }
}

}  // namespace ferry::bench
