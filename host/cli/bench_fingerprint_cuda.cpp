// cli/bench_fingerprint_cuda.cpp: the CUDA measurement of `ferry bench fingerprint` (built with
// the cuda feature): fingerprint_cuda_async timed with CUDA events over the whole buffer, then the
// CPU twin on a host copy of its first GiB, which must give the GPU's value for the same bytes.
#include <ferry/kernels/cuda.hpp>

#include <algorithm>
#include <chrono>
#include <thread>

#include "cli/bench_cuda.hpp"
#include "cli/bench_fingerprint.hpp"

namespace ferry::cli::bench {

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
  return m;
}

}  // namespace ferry::cli::bench
