// bench/scatter/scatter_cpu.cpp: the CPU measurement of `ferry bench scatter`: scatter_cpu against
// a memcpy of the same bytes over the same threads, wall-clock timed, every byte verified.
#include <ferry/kernels/cpu.hpp>
#include <ferry/sdk/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include "bench/common/data.hpp"
#include "bench/scatter/scatter.hpp"

namespace ferry::bench {
namespace {

struct FreeDeleter {
  void operator()(std::byte* p) const noexcept { std::free(p); }
};
using HostBuffer = std::unique_ptr<std::byte[], FreeDeleter>;

HostBuffer allocate(std::uint64_t bytes, const char* what) {
  constexpr std::uint64_t kAlign = 4096;
  const std::uint64_t rounded = (bytes + kAlign - 1) / kAlign * kAlign;
  auto* p = static_cast<std::byte*>(std::aligned_alloc(kAlign, rounded));
  if (p == nullptr) {
    fail(FERRY_STATUS_OUT_OF_MEMORY, "bench scatter: cannot allocate {} bytes of host memory for "
         "the {}", bytes, what);
  }
  return HostBuffer(p);
}

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

// The CPU ceiling: one memcpy of `bytes` split evenly over `threads` threads.
void parallel_copy(std::byte* dst, const std::byte* src, std::uint64_t bytes, unsigned threads) {
  if (threads <= 1) {
    std::memcpy(dst, src, bytes);
    return;
  }
  std::vector<std::thread> workers;
  workers.reserve(threads);
  const std::uint64_t part = (bytes + threads - 1) / threads;
  for (unsigned t = 0; t < threads; ++t) {
    const std::uint64_t begin = std::min<std::uint64_t>(bytes, t * part);
    const std::uint64_t end = std::min<std::uint64_t>(bytes, begin + part);
    if (begin == end) break;
    workers.emplace_back([=] { std::memcpy(dst + begin, src + begin, end - begin); });
  }
  for (std::thread& w : workers) w.join();
}

}  // namespace

ScatterMeasurement measure_scatter_cpu(std::uint64_t count, std::uint64_t tensor_bytes,
                                       int warmup, int repeat, std::uint64_t seed) {
  Watchdog::phase("preparing the CPU scatter case");
  const ScatterLayout layout = make_scatter_layout(count, tensor_bytes);
  HostBuffer bucket = allocate(layout.bucket_bytes(), "source bucket");
  HostBuffer region = allocate(layout.region_bytes(), "destination region");
  fill_pattern_cpu(bucket.get(), layout.bucket_bytes(), seed);
  std::memset(region.get(), kPoisonByte, layout.region_bytes());
  const auto entries = scatter_entries(layout, bucket.get());
  const auto params = scatter_params(layout, region.get());
  const unsigned threads = std::max(1u, std::thread::hardware_concurrency());

  ScatterMeasurement m;
  m.count = count;
  Watchdog::phase("running scatter_cpu");
  for (int i = 0; i < warmup; ++i) kernels::scatter_cpu(layout.ops, entries, params, threads);
  for (int i = 0; i < repeat; ++i) {
    const auto start = std::chrono::steady_clock::now();
    kernels::scatter_cpu(layout.ops, entries, params, threads);
    const double s = seconds_since(start);
    m.ferry_s.push_back(s);
    m.ferry_submit_s.push_back(s);
  }

  // Every tensor against its source, every gap still poison.
  Watchdog::phase("verifying the CPU scatter");
  std::uint64_t bad_tensors = 0;
  std::uint64_t bad_gaps = 0;
  std::uint64_t first_bad = layout.count;
  for (std::uint64_t i = 0; i < layout.count; ++i) {
    const std::byte* dst = region.get() + layout.slot_of[i] * layout.slot_bytes;
    if (std::memcmp(dst, bucket.get() + i * tensor_bytes, tensor_bytes) != 0) {
      ++bad_tensors;
      first_bad = std::min(first_bad, i);
    }
    for (std::uint64_t g = 0; g < kSlotGapBytes; ++g) {
      if (static_cast<unsigned char>(dst[tensor_bytes + g]) != kPoisonByte) {
        ++bad_gaps;
        break;
      }
    }
  }
  const auto samples = sample_tensors(layout.count, 16);
  bool fingerprints_equal = true;
  for (std::uint64_t i : samples) {
    const std::byte* dst = region.get() + layout.slot_of[i] * layout.slot_bytes;
    fingerprints_equal = fingerprints_equal &&
                         kernels::fingerprint_cpu(dst, tensor_bytes, 1) ==
                             kernels::fingerprint_cpu(bucket.get() + i * tensor_bytes,
                                                      tensor_bytes, 1);
  }
  m.verified = bad_tensors == 0 && bad_gaps == 0 && fingerprints_equal;
  if (m.verified) {
    m.verification = fmt::format(
        "all {} tensors byte-equal to their source in their shuffled slots, all {} gaps still "
        "poison, fingerprints of {} sampled tensors equal",
        layout.count, layout.count, samples.size());
  } else {
    m.verification = fmt::format(
        "{} of {} tensors differ from their source (first: tensor {}), {} gaps overwritten, "
        "sampled fingerprints {}",
        bad_tensors, layout.count, first_bad, bad_gaps, fingerprints_equal ? "equal" : "differ");
  }

  Watchdog::phase("running the CPU flat copy");
  for (int i = 0; i < warmup; ++i) {
    parallel_copy(region.get(), bucket.get(), layout.bucket_bytes(), threads);
  }
  for (int i = 0; i < repeat; ++i) {
    const auto start = std::chrono::steady_clock::now();
    parallel_copy(region.get(), bucket.get(), layout.bucket_bytes(), threads);
    m.flat_s.push_back(seconds_since(start));
  }
  // Reading the copy keeps it observable (a copy into memory freed unread may be elided).
  if (std::memcmp(region.get(), bucket.get(), layout.bucket_bytes()) != 0) {
    m.verified = false;
    m.verification += "; the flat copy's destination differs from its source";
  }
  return m;
}

}  // namespace ferry::bench
