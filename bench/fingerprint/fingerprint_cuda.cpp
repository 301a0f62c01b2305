// bench/fingerprint/fingerprint_cuda.cpp: the CUDA measurement of `ferry bench fingerprint` (built
// with the cuda feature): fingerprint_cuda_async timed with CUDA events over the whole buffer, then
// the CPU twin on a host copy of its first GiB, which must give the GPU's value for the same bytes;
// then the buffer as 4 MiB ranges in one fingerprint_many_cuda_async call, checked the same way.
#include <ferry/kernels/cuda.hpp>

#include <algorithm>
#include <chrono>
#include <thread>
#include <vector>

#include "bench/common/cuda.hpp"
#include "bench/fingerprint/fingerprint.hpp"

namespace ferry::bench {
namespace {

constexpr std::uint64_t kManyRangeBytes = 4ull << 20;

// The batched form: `data` as ranges of 4 MiB in one fingerprint_many_cuda_async call per run;
// the ranges inside the host copy of the sample are checked against fingerprint_cpu.
void measure_many(const DeviceBuffer& data, FingerprintMeasurement& m, const PinnedBuffer& host,
                  int warmup, int repeat, const Stream& stream) {
  Watchdog::phase("running fingerprint_many_cuda_async");
  m.many_range_bytes = std::min<std::uint64_t>(m.bytes, kManyRangeBytes);
  m.many_ranges = m.bytes / m.many_range_bytes;
  const auto n = static_cast<std::size_t>(m.many_ranges);
  std::vector<const void*> ranges(n);
  for (std::size_t i = 0; i < n; ++i) ranges[i] = data.data() + i * m.many_range_bytes;
  const std::vector<std::uint64_t> sizes(n, m.many_range_bytes);
  DeviceBuffer results(n * sizeof(std::uint64_t), "fingerprint_many results");
  auto* out = reinterpret_cast<std::uint64_t*>(results.data());
  for (int i = 0; i < warmup; ++i) {
    kernels::fingerprint_many_cuda_async(ranges, sizes, out, stream.get());
  }
  stream.synchronize("the warm-up batched fingerprints");
  Event start;
  Event end;
  for (int i = 0; i < repeat; ++i) {
    start.record(stream.get());
    kernels::fingerprint_many_cuda_async(ranges, sizes, out, stream.get());
    end.record(stream.get());
    m.many_gpu_s.push_back(elapsed_seconds(start, end));
  }
  std::vector<std::uint64_t> values(n);
  cuda_check(cudaMemcpyAsync(values.data(), out, n * sizeof(std::uint64_t),
                             cudaMemcpyDeviceToHost, stream.get()),
             "copying the batched fingerprints to the host");
  stream.synchronize("the timed batched fingerprints");

  Watchdog::phase("checking the batched fingerprints on the CPU");
  const std::uint64_t checked = std::min<std::uint64_t>(n, m.sample_bytes / m.many_range_bytes);
  std::vector<std::uint64_t> expected(checked);
  std::vector<std::jthread> pool;
  const unsigned workers = std::max(1u, std::thread::hardware_concurrency());
  for (unsigned w = 0; w < workers; ++w) {
    pool.emplace_back([&, w] {
      for (std::uint64_t i = w; i < checked; i += workers) {
        const auto* p = host.data() + i * m.many_range_bytes;
        expected[i] = kernels::fingerprint_cpu(p, m.many_range_bytes, 1);
      }
    });
  }
  pool.clear();  // joins
  m.many_checked = checked;
  m.many_equal = std::equal(expected.begin(), expected.end(), values.begin());
}

}  // namespace

FingerprintMeasurement measure_fingerprint_cuda(std::uint64_t bytes, int warmup, int repeat,
                                                std::uint64_t seed) {
  FingerprintMeasurement m;
  m.bytes = bytes;
  Watchdog::phase("allocating the CUDA fingerprint case");
  Stream stream;
  DeviceBuffer data(bytes, "fingerprinted buffer");
  DeviceBuffer result(sizeof(std::uint64_t), "fingerprint result");
  auto* value = reinterpret_cast<std::uint64_t*>(result.data());
  fill_pattern_cuda(data.data(), bytes, seed, stream.get());
  stream.synchronize("filling the fingerprinted buffer");

  Watchdog::phase("running fingerprint_cuda");
  for (int i = 0; i < warmup; ++i) {
    kernels::fingerprint_cuda_async(data.data(), bytes, value, stream.get());
  }
  stream.synchronize("the warm-up fingerprints");
  Event start;
  Event end;
  for (int i = 0; i < repeat; ++i) {
    start.record(stream.get());
    kernels::fingerprint_cuda_async(data.data(), bytes, value, stream.get());
    end.record(stream.get());
    m.gpu_s.push_back(elapsed_seconds(start, end));
  }
  cuda_check(cudaMemcpyAsync(&m.gpu_value, value, sizeof m.gpu_value, cudaMemcpyDeviceToHost,
                             stream.get()),
             "copying the fingerprint to the host");
  stream.synchronize("the timed fingerprints");

  Watchdog::phase("fingerprinting the sample on the CPU");
  m.sample_bytes = std::min<std::uint64_t>(bytes, 1ull << 30);
  PinnedBuffer host(m.sample_bytes, "host copy of the sample");
  cuda_check(cudaMemcpyAsync(host.data(), data.data(), m.sample_bytes, cudaMemcpyDeviceToHost,
                             stream.get()),
             "copying the sample to the host");
  stream.synchronize("copying the sample to the host");
  m.check_value = m.sample_bytes == bytes
                      ? m.gpu_value
                      : kernels::fingerprint_cuda(data.data(), m.sample_bytes, stream.get());
  m.cpu_threads = std::max(1u, std::thread::hardware_concurrency());
  const int cpu_repeat = std::min(repeat, 3);
  for (int i = 0; i < cpu_repeat; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    m.cpu_value = kernels::fingerprint_cpu(host.data(), m.sample_bytes, 0);
    m.cpu_s.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  }
  m.check = "fingerprint_cpu of the first " + binary_size(m.sample_bytes) +
            " (host copy) equals fingerprint_cuda of the same device bytes";
  m.equal = m.cpu_value == m.check_value;
  measure_many(data, m, host, warmup, repeat, stream);
  return m;
}

}  // namespace ferry::bench
