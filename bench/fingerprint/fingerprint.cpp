// bench/fingerprint/fingerprint.cpp: `ferry bench fingerprint`: the CPU measurement
// (fingerprint_cpu on every thread, checked against one thread) and the report around the CUDA one
// (one buffer and the same bytes as 4 MiB ranges in one batched call).
#include "bench/fingerprint/fingerprint.hpp"

#include <ferry/kernels/cpu.hpp>
#include <ferry/sdk/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <memory>
#include <optional>
#include <thread>

#include "bench/common/data.hpp"
#include "ferry_build_config.h"

namespace ferry::bench {
namespace {

constexpr double kTargetTbps = 1.5;  // shared/PERF.md: fingerprint of all weights

std::string hex(std::uint64_t v) { return fmt::format("{:#018x}", v); }

FingerprintMeasurement measure_fingerprint_cpu(std::uint64_t bytes, int warmup, int repeat,
                                               std::uint64_t seed) {
  Watchdog::phase("preparing the CPU fingerprint case");
  struct FreeDeleter {
    void operator()(unsigned char* p) const noexcept { std::free(p); }
  };
  const std::uint64_t rounded = (bytes + 4095) / 4096 * 4096;
  std::unique_ptr<unsigned char, FreeDeleter> data(
      static_cast<unsigned char*>(std::aligned_alloc(4096, std::max<std::uint64_t>(rounded, 4096))));
  if (!data) {
    fail(FERRY_STATUS_OUT_OF_MEMORY, "bench fingerprint: cannot allocate {} bytes of host memory",
         bytes);
  }
  fill_pattern_cpu(data.get(), bytes, seed);
  FingerprintMeasurement m;
  m.bytes = bytes;
  m.sample_bytes = bytes;
  m.cpu_threads = std::max(1u, std::thread::hardware_concurrency());
  Watchdog::phase("running fingerprint_cpu");
  for (int i = 0; i < warmup; ++i) m.cpu_value = kernels::fingerprint_cpu(data.get(), bytes, 0);
  for (int i = 0; i < repeat; ++i) {
    const auto start = std::chrono::steady_clock::now();
    m.cpu_value = kernels::fingerprint_cpu(data.get(), bytes, 0);
    m.cpu_s.push_back(
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
  }
  Watchdog::phase("checking fingerprint_cpu on one thread");
  m.check_value = kernels::fingerprint_cpu(data.get(), bytes, 1);
  m.check = "fingerprint_cpu on 1 thread gives the value of all threads";
  m.equal = m.check_value == m.cpu_value;
  return m;
}

}  // namespace

#if !FERRY_HAVE_CUDA
FingerprintMeasurement measure_fingerprint_cuda(std::uint64_t, int, int, std::uint64_t) {
  fail(FERRY_STATUS_UNIMPLEMENTED,
       "this ferry was built without CUDA (-Dcuda=disabled or no nvcc): use --device cpu");
}
#endif

int run_fingerprint_bench(const BenchOptions& options, Json& records) {
  const bool cuda = options.device == Device::cuda;
  const int repeat = options.repeat > 0 ? options.repeat : (cuda ? 20 : 5);
  const int warmup = options.warmup > 0 ? options.warmup : (cuda ? 3 : 1);
  const double gib = options.gib > 0 ? options.gib : (cuda ? 8.0 : 1.0);
  const auto bytes = static_cast<std::uint64_t>(std::llround(gib * static_cast<double>(1ull << 30)));
  if (bytes == 0) fail(FERRY_STATUS_INVALID_ARGUMENT, "bench fingerprint: --gib {} is 0 bytes", gib);

  std::printf("fingerprint: %s on %s, %d warm-up + %d timed runs ...\n",
              decimal_bytes(static_cast<double>(bytes)).c_str(), device_name(options.device),
              warmup, repeat);
  std::fflush(stdout);
  Json record = record_header("fingerprint", FERRY_FINGERPRINT_ALGORITHM, options.device);
  const FingerprintMeasurement m = cuda ? measure_fingerprint_cuda(bytes, warmup, repeat, 0x5eed00f1)
                                        : measure_fingerprint_cpu(bytes, warmup, repeat, 0x5eed00f1);

  const double gpu_med = median(m.gpu_s);
  const double cpu_med = median(m.cpu_s);
  const std::optional<double> gpu_tbps =
      gpu_med > 0 ? std::optional<double>(static_cast<double>(m.bytes) / gpu_med / 1e12)
                  : std::nullopt;
  const std::optional<double> cpu_gbps =
      cpu_med > 0 ? std::optional<double>(static_cast<double>(m.sample_bytes) / cpu_med / 1e9)
                  : std::nullopt;

  Table table({"algorithm", "bytes", "GPU TB/s", "GPU ms", "CPU sample", "CPU GB/s", "CPU ms",
               "CPU threads", "values equal"});
  table.add_row({FERRY_FINGERPRINT_ALGORITHM, decimal_bytes(static_cast<double>(m.bytes)),
                 number(gpu_tbps, 3), cuda ? number(gpu_med * 1e3, 3) : "-",
                 decimal_bytes(static_cast<double>(m.sample_bytes)), number(cpu_gbps, 2),
                 number(cpu_med * 1e3, 3), std::to_string(m.cpu_threads),
                 m.equal ? "yes" : "NO"});
  std::printf("\nferry bench fingerprint on %s: median of %d runs after %d warm-up run(s)\n",
              device_name(options.device), repeat, warmup);
  table.print();
  std::printf("\ncheck: %s: %s (%s vs %s)\n", m.check.c_str(), m.equal ? "equal" : "DIFFERENT",
              hex(m.cpu_value).c_str(), hex(m.check_value).c_str());
  std::string verdict = "n/a (a GPU target; this is a CPU run)";
  std::string shown = "-";
  if (cuda && gpu_tbps) {
    verdict = *gpu_tbps >= kTargetTbps ? "met" : "NOT met";
    shown = fmt::format("{:.3f} TB/s", *gpu_tbps);
  } else if (cuda) {
    verdict = "unknown (no measurement)";
  }
  std::printf("target (shared/PERF.md): fingerprint >= %.1f TB/s on the GPU: %s -> %s\n",
              kTargetTbps, shown.c_str(), verdict.c_str());

  // The batched form (what the session and the update engine call), over the same bytes.
  const double many_med = median(m.many_gpu_s);
  const std::optional<double> many_gbps =
      many_med > 0 ? std::optional<double>(static_cast<double>(m.many_ranges * m.many_range_bytes) /
                                           many_med / 1e9)
                   : std::nullopt;
  if (cuda && m.many_ranges > 0) {
    Table batch({"GPU case", "ranges", "bytes", "GPU GB/s", "GPU TB/s", "GPU ms", "equal to CPU"});
    batch.add_row({"one buffer, fingerprint_cuda_async", "1",
                   decimal_bytes(static_cast<double>(m.bytes)),
                   number(gpu_tbps ? std::optional<double>(*gpu_tbps * 1e3) : std::nullopt, 1),
                   number(gpu_tbps, 3), number(gpu_med * 1e3, 3),
                   m.equal ? "yes (value of the sample)" : "NO"});
    batch.add_row({fmt::format("{} ranges of {} in one fingerprint_many_cuda_async call",
                               m.many_ranges, binary_size(m.many_range_bytes)),
                   std::to_string(m.many_ranges),
                   decimal_bytes(static_cast<double>(m.many_ranges * m.many_range_bytes)),
                   number(many_gbps, 1),
                   number(many_gbps ? std::optional<double>(*many_gbps / 1e3) : std::nullopt, 3),
                   number(many_med * 1e3, 3),
                   m.many_equal ? fmt::format("yes ({} ranges checked)", m.many_checked) : "NO"});
    std::printf("\n");
    batch.print();
  }
  std::fflush(stdout);

  record["bytes"] = m.bytes;
  record["warmup"] = warmup;
  record["repeat"] = repeat;
  Json gpu = nullptr;
  if (cuda) {
    gpu = Json::object();
    gpu["median_s"] = gpu_med;
    gpu["tbps"] = gpu_tbps ? Json(*gpu_tbps) : Json(nullptr);
    gpu["runs_s"] = m.gpu_s;
    gpu["value"] = hex(m.gpu_value);
  }
  record["gpu"] = gpu;
  Json gpu_many = nullptr;
  if (cuda && m.many_ranges > 0) {
    gpu_many = Json::object();
    gpu_many["ranges"] = m.many_ranges;
    gpu_many["range_bytes"] = m.many_range_bytes;
    gpu_many["median_s"] = many_med;
    gpu_many["gbps"] = many_gbps ? Json(*many_gbps) : Json(nullptr);
    gpu_many["runs_s"] = m.many_gpu_s;
    gpu_many["checked_ranges"] = m.many_checked;
    gpu_many["values_equal"] = m.many_equal;
  }
  record["gpu_many"] = gpu_many;
  Json cpu;
  cpu["sample_bytes"] = m.sample_bytes;
  cpu["threads"] = m.cpu_threads;
  cpu["median_s"] = cpu_med;
  cpu["gbps"] = cpu_gbps ? Json(*cpu_gbps) : Json(nullptr);
  cpu["runs_s"] = m.cpu_s;
  cpu["value"] = hex(m.cpu_value);
  record["cpu"] = cpu;
  record["check"] = m.check;
  record["check_value"] = hex(m.check_value);
  record["values_equal"] = m.equal;
  Json target;
  target["rule"] = fmt::format("fingerprint >= {:.1f} TB/s on the GPU", kTargetTbps);
  target["value_tbps"] = gpu_tbps ? Json(*gpu_tbps) : Json(nullptr);
  target["met"] = (cuda && gpu_tbps) ? Json(*gpu_tbps >= kTargetTbps) : Json(nullptr);
  record["target"] = target;
  records.push_back(record);
  if (!m.equal) {
    std::printf("VERIFICATION FAILED: the two fingerprints of the same bytes differ\n");
    return 1;
  }
  if (!m.many_equal) {
    std::printf("VERIFICATION FAILED: a batched fingerprint differs from fingerprint_cpu\n");
    return 1;
  }
  return 0;
}

}  // namespace ferry::bench
