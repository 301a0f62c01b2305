// bench/scatter/scatter_cuda.cpp: the CUDA measurement of `ferry bench scatter` (built with the
// cuda feature): scatter_cuda against one cudaMemcpyAsync D2D of the same bytes, timed with CUDA
// events; then every tensor and gap checked by GPU fingerprints and a sample byte by byte on the
// host, where the CPU fingerprint must equal the GPU's.
#include <ferry/kernels/cuda.hpp>
#include <ferry/sdk/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "bench/common/cuda.hpp"
#include "bench/common/data.hpp"
#include "bench/scatter/scatter.hpp"

namespace ferry::bench {
namespace {

// Kept free on the device for the op table, the fingerprint scratch and the CUDA runtime.
constexpr std::uint64_t kHeadroomBytes = 1ull << 30;

double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

std::string gib(std::uint64_t bytes) {
  return fmt::format("{:.1f} GiB", static_cast<double>(bytes) / (1ull << 30));
}

// Checks the scatter's result; returns the verification text and sets *ok.
std::string verify(const ScatterLayout& layout, const DeviceBuffer& bucket,
                   const DeviceBuffer& region, const Stream& stream, bool* ok) {
  const std::uint64_t n = layout.count;
  const std::uint64_t tb = layout.tensor_bytes;
  // Fingerprints on the GPU: [0, n) sources, [n, 2n) destinations of the same tensors,
  // [2n, 3n) the gap after each slot.
  DeviceBuffer values(3 * n * sizeof(std::uint64_t), "per-tensor fingerprints");
  auto* v = reinterpret_cast<std::uint64_t*>(values.data());
  for (std::uint64_t i = 0; i < n; ++i) {
    kernels::fingerprint_cuda_async(bucket.data() + i * tb, tb, v + i, stream.get());
    kernels::fingerprint_cuda_async(region.data() + layout.slot_of[i] * layout.slot_bytes, tb,
                                    v + n + i, stream.get());
    kernels::fingerprint_cuda_async(region.data() + i * layout.slot_bytes + tb, kSlotGapBytes,
                                    v + 2 * n + i, stream.get());
  }
  std::vector<std::uint64_t> host(3 * n);
  cuda_check(cudaMemcpyAsync(host.data(), v, host.size() * sizeof(std::uint64_t),
                             cudaMemcpyDeviceToHost, stream.get()),
             "copying the fingerprints to the host");
  stream.synchronize("computing the per-tensor fingerprints on the GPU");

  const std::vector<unsigned char> poison(kSlotGapBytes, kPoisonByte);
  const std::uint64_t poison_value = kernels::fingerprint_cpu(poison.data(), poison.size(), 1);
  std::uint64_t bad_tensors = 0;
  std::uint64_t bad_gaps = 0;
  std::uint64_t first_bad = n;
  for (std::uint64_t i = 0; i < n; ++i) {
    if (host[i] != host[n + i]) {
      ++bad_tensors;
      first_bad = std::min(first_bad, i);
    }
    if (host[2 * n + i] != poison_value) ++bad_gaps;
  }

  // A sample on the host: bytes equal, gap poison, CPU fingerprint == GPU fingerprint.
  const auto samples = sample_tensors(n, 16);
  std::vector<unsigned char> src(tb);
  std::vector<unsigned char> dst(layout.slot_bytes);
  std::uint64_t bad_samples = 0;
  std::uint64_t cpu_gpu_differ = 0;
  for (std::uint64_t i : samples) {
    cuda_check(cudaMemcpyAsync(src.data(), bucket.data() + i * tb, tb, cudaMemcpyDeviceToHost,
                               stream.get()),
               "copying a sampled source tensor to the host");
    cuda_check(cudaMemcpyAsync(dst.data(), region.data() + layout.slot_of[i] * layout.slot_bytes,
                               layout.slot_bytes, cudaMemcpyDeviceToHost, stream.get()),
               "copying a sampled destination slot to the host");
    stream.synchronize("copying the sampled tensors to the host");
    const bool bytes_equal = std::memcmp(src.data(), dst.data(), tb) == 0;
    const bool gap_poison = std::all_of(dst.begin() + static_cast<std::ptrdiff_t>(tb), dst.end(),
                                        [](unsigned char b) { return b == kPoisonByte; });
    if (!bytes_equal || !gap_poison) ++bad_samples;
    if (kernels::fingerprint_cpu(dst.data(), tb, 1) != host[n + i] ||
        kernels::fingerprint_cpu(src.data(), tb, 1) != host[i]) {
      ++cpu_gpu_differ;
    }
  }

  *ok = bad_tensors == 0 && bad_gaps == 0 && bad_samples == 0 && cpu_gpu_differ == 0;
  if (*ok) {
    return fmt::format(
        "all {} tensors: GPU fingerprint of the destination slot equals the source's; all {} gaps "
        "still poison; {} sampled tensors byte-equal on the host, their CPU fingerprints equal the "
        "GPU's",
        n, n, samples.size());
  }
  return fmt::format(
      "{} of {} tensors differ from their source by GPU fingerprint (first: tensor {} in slot "
      "{}), {} gaps overwritten, {} of {} sampled tensors wrong on the host, {} sampled CPU "
      "fingerprints differ from the GPU's",
      bad_tensors, n, first_bad, first_bad < n ? layout.slot_of[first_bad] : 0, bad_gaps,
      bad_samples, samples.size(), cpu_gpu_differ);
}

}  // namespace

ScatterMeasurement measure_scatter_cuda(std::uint64_t count, std::uint64_t tensor_bytes,
                                        int warmup, int repeat, std::uint64_t seed) {
  ScatterMeasurement m;
  Watchdog::phase("allocating the CUDA scatter case");
  const DeviceMemory memory = device_memory();
  const std::uint64_t per_tensor = 2 * tensor_bytes + kSlotGapBytes;
  const std::uint64_t usable = memory.free > kHeadroomBytes ? memory.free - kHeadroomBytes : 0;
  if (count > usable / per_tensor) {
    const std::uint64_t fits = usable / per_tensor;
    if (fits == 0) {
      fail(FERRY_STATUS_OUT_OF_MEMORY,
           "bench scatter: not even one {}-byte tensor fits: {} free of {} on the GPU",
           tensor_bytes, gib(memory.free), gib(memory.total));
    }
    m.note = fmt::format(
        "scaled down from {} to {} tensors: the case needs {} of GPU memory, {} of {} is free",
        count, fits, gib(count * per_tensor + kHeadroomBytes), gib(memory.free),
        gib(memory.total));
    count = fits;
  }
  m.count = count;
  const ScatterLayout layout = make_scatter_layout(count, tensor_bytes);
  Stream stream;
  DeviceBuffer bucket(layout.bucket_bytes(), "source bucket");
  DeviceBuffer region(layout.region_bytes(), "destination region");
  fill_pattern_cuda(bucket.data(), layout.bucket_bytes(), seed, stream.get());
  cuda_check(cudaMemsetAsync(region.data(), kPoisonByte, layout.region_bytes(), stream.get()),
             "poisoning the destination region");
  stream.synchronize("filling the source and poisoning the destination");
  const auto entries = scatter_entries(layout, bucket.data());
  const auto params = scatter_params(layout, region.data());

  Event start;
  Event end;
  // The plan is checked and its device op table uploaded once, as the update engine does with
  // the plan it caches; every timed run is one launch over that table.
  Watchdog::phase("preparing the scatter plan");
  const auto prepare_started = std::chrono::steady_clock::now();
  const auto prepared =
      kernels::prepare_scatter_cuda(layout.ops, entries, bucket.data(), params);
  const double prepare_s = seconds_since(prepare_started);
  m.note += fmt::format("{}op table checked and uploaded once in {:.3f} ms (cached with the plan)",
                        m.note.empty() ? "" : "; ", prepare_s * 1e3);
  Watchdog::phase("running scatter_cuda");
  for (int i = 0; i < warmup; ++i) kernels::scatter_cuda(*prepared, bucket.data(), stream.get());
  stream.synchronize("the warm-up scatters");
  for (int i = 0; i < repeat; ++i) {
    start.record(stream.get());
    const auto submit = std::chrono::steady_clock::now();
    kernels::scatter_cuda(*prepared, bucket.data(), stream.get());
    m.ferry_submit_s.push_back(seconds_since(submit));
    end.record(stream.get());
    m.ferry_s.push_back(elapsed_seconds(start, end));
  }

  Watchdog::phase("verifying the CUDA scatter");
  m.verification = verify(layout, bucket, region, stream, &m.verified);

  Watchdog::phase("running the flat cudaMemcpyAsync D2D");
  for (int i = 0; i < warmup; ++i) {
    cuda_check(cudaMemcpyAsync(region.data(), bucket.data(), layout.bucket_bytes(),
                               cudaMemcpyDeviceToDevice, stream.get()),
               "the flat D2D copy");
  }
  stream.synchronize("the warm-up flat copies");
  for (int i = 0; i < repeat; ++i) {
    start.record(stream.get());
    cuda_check(cudaMemcpyAsync(region.data(), bucket.data(), layout.bucket_bytes(),
                               cudaMemcpyDeviceToDevice, stream.get()),
               "the flat D2D copy");
    end.record(stream.get());
    m.flat_s.push_back(elapsed_seconds(start, end));
  }
  stream.synchronize("the flat copies");
  Watchdog::phase("freeing the CUDA scatter case");
  return m;
}

}  // namespace ferry::bench
