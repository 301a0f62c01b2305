// The CPU fingerprint: xxh64-interleaved-v1 (docs/fingerprint.md; definitions in
// ferry/sdk/fingerprint.hpp), chunks hashed in parallel on a per-call thread pool, each chunk row
// by row (a row's 64 words feed 64 independent accumulators, so the multiplies overlap); the
// chunk hashes are combined with libxxhash.
#include "ferry/kernels/cpu.hpp"

#include "ferry/sdk/fingerprint.hpp"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <cstring>
#include <thread>
#include <vector>

namespace ferry::kernels {
namespace {

namespace fpd = ferry::sdk::fingerprint;
namespace xxh64 = ferry::sdk::xxh64;

static_assert(std::endian::native == std::endian::little,
              "xxh64-interleaved-v1 reads little-endian words; add a byte swap");
static_assert(kFingerprintChunkBytes == fpd::kChunkBytes);

// Below this many chunks per thread the thread start costs more than it saves.
constexpr std::uint64_t kMinChunksPerThread = 4;

std::uint64_t load64(const unsigned char* p) {
  std::uint64_t v;
  std::memcpy(&v, p, sizeof v);
  return v;
}

// fpd::chunk_hash, row by row.
std::uint64_t chunk_hash(const unsigned char* p, std::uint64_t len, std::uint64_t index) {
  std::uint64_t acc[fpd::kAccumulators];
  for (unsigned k = 0; k < fpd::kAccumulators; ++k) acc[k] = fpd::initial_accumulator(index, k);
  const std::uint64_t rows = len / fpd::kRowBytes;
  for (std::uint64_t r = 0; r < rows; ++r) {
    const unsigned char* row = p + r * fpd::kRowBytes;
    for (unsigned k = 0; k < fpd::kAccumulators; ++k) {
      acc[k] = xxh64::accumulate(acc[k], load64(row + 8 * k));
    }
  }
  // The last row's whole units, then the tail.
  const unsigned char* row = p + rows * fpd::kRowBytes;
  const std::uint64_t words = 2 * ((len - rows * fpd::kRowBytes) / fpd::kUnitBytes);
  for (unsigned k = 0; k < words; ++k) acc[k] = xxh64::accumulate(acc[k], load64(row + 8 * k));
  const std::uint64_t done = rows * fpd::kRowBytes + 8 * words;
  return fpd::hash_accumulators(acc, p + done, len - done, len);
}

}  // namespace

std::vector<std::uint64_t> fingerprint_chunks_cpu(const void* data, std::uint64_t bytes,
                                                  std::uint64_t first_index, unsigned threads) {
  const auto* base = static_cast<const unsigned char*>(data);
  const std::uint64_t chunks = (bytes + kFingerprintChunkBytes - 1) / kFingerprintChunkBytes;
  std::vector<std::uint64_t> hashes(chunks);

  auto hash_chunk = [&](std::uint64_t i) {
    const std::uint64_t begin = i * kFingerprintChunkBytes;
    const std::uint64_t len = std::min(kFingerprintChunkBytes, bytes - begin);
    hashes[i] = chunk_hash(base + begin, len, first_index + i);
  };

  if (threads == 0) threads = hardware_threads();
  const std::uint64_t useful = std::max<std::uint64_t>(chunks / kMinChunksPerThread, 1);
  const auto workers = static_cast<unsigned>(std::min<std::uint64_t>(threads, useful));
  if (workers <= 1) {
    for (std::uint64_t i = 0; i < chunks; ++i) hash_chunk(i);
  } else {
    std::atomic<std::uint64_t> next{0};
    auto work = [&] {
      for (std::uint64_t i = next.fetch_add(1); i < chunks; i = next.fetch_add(1)) hash_chunk(i);
    };
    std::vector<std::jthread> pool;
    pool.reserve(workers - 1);
    for (unsigned t = 1; t < workers; ++t) pool.emplace_back(work);
    work();
  }
  return hashes;
}

std::uint64_t combine_chunk_hashes(std::span<const std::uint64_t> hashes, std::uint64_t bytes) {
  return XXH64(hashes.data(), hashes.size() * sizeof(std::uint64_t), bytes);
}

std::uint64_t fingerprint_cpu(const void* data, std::uint64_t bytes, unsigned threads) {
  return combine_chunk_hashes(fingerprint_chunks_cpu(data, bytes, 0, threads), bytes);
}

}  // namespace ferry::kernels
