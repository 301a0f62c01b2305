// The CPU fingerprint: xxh64-chunked-v1 (docs/fingerprint.md) with libxxhash, chunks hashed in
// parallel on a per-call thread pool.
#include "ferry/kernels/cpu.hpp"

#include <xxhash.h>

#include <algorithm>
#include <atomic>
#include <bit>
#include <thread>
#include <vector>

namespace ferry::kernels {
namespace {

static_assert(std::endian::native == std::endian::little,
              "xxh64-chunked-v1 combines the chunk hashes as little-endian u64; add a byte swap");

// Below this many chunks per thread the thread start costs more than it saves.
constexpr std::uint64_t kMinChunksPerThread = 4;

}  // namespace

std::uint64_t fingerprint_cpu(const void* data, std::uint64_t bytes, unsigned threads) {
  const auto* base = static_cast<const unsigned char*>(data);
  const std::uint64_t chunks = (bytes + kFingerprintChunkBytes - 1) / kFingerprintChunkBytes;
  std::vector<std::uint64_t> hashes(chunks);

  auto hash_chunk = [&](std::uint64_t i) {
    const std::uint64_t begin = i * kFingerprintChunkBytes;
    const std::uint64_t len = std::min(kFingerprintChunkBytes, bytes - begin);
    hashes[i] = XXH64(base + begin, len, i);
  };

  if (threads == 0) threads = std::max(1u, std::thread::hardware_concurrency());
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
  return XXH64(hashes.data(), hashes.size() * sizeof(std::uint64_t), bytes);
}

}  // namespace ferry::kernels
