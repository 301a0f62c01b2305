// bench/fingerprint/fingerprint.hpp: `ferry bench fingerprint`: the xxh64-interleaved-v1 rate
// (docs/fingerprint.md) on the GPU against its CPU twin, which must give the same value on the
// same bytes.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "bench/common/report.hpp"

namespace ferry::bench {

// What one run measured. Times are seconds per fingerprint.
struct FingerprintMeasurement {
  std::uint64_t bytes = 0;          // fingerprinted on the device under test
  std::vector<double> gpu_s;        // CUDA runs (empty on the CPU)
  std::uint64_t gpu_value = 0;      // of all `bytes`
  std::uint64_t sample_bytes = 0;   // the prefix the CPU twin hashes
  std::vector<double> cpu_s;        // CPU runs over the sample
  unsigned cpu_threads = 0;
  std::uint64_t cpu_value = 0;      // of the sample
  std::uint64_t check_value = 0;    // the sample's value by the other implementation
  std::string check;                // what the check compared
  bool equal = false;
  // The batched form (CUDA only): the buffer as `many_ranges` ranges of `many_range_bytes` in one
  // fingerprint_many_cuda_async call; the ranges inside the CPU sample checked against the twin.
  std::uint64_t many_ranges = 0;
  std::uint64_t many_range_bytes = 0;
  std::vector<double> many_gpu_s;
  std::uint64_t many_checked = 0;   // ranges compared with fingerprint_cpu
  bool many_equal = true;
};

// On the current CUDA device: `bytes` of the random pattern fingerprinted with
// fingerprint_cuda_async (event-timed), then its first min(bytes, 1 GiB) by fingerprint_cpu on a
// host copy and by fingerprint_cuda; both values must be equal. Then the same buffer as ranges
// of 4 MiB (4096 for 16 GiB) in one fingerprint_many_cuda_async call (event-timed); the ranges
// inside the sample must equal fingerprint_cpu. Built with the cuda feature only.
FingerprintMeasurement measure_fingerprint_cuda(std::uint64_t bytes, int warmup, int repeat,
                                                std::uint64_t seed);

// Runs `ferry bench fingerprint`; appends one record. Returns 0, or 1 when the values differ.
int run_fingerprint_bench(const BenchOptions& options, Json& records);

}  // namespace ferry::bench
