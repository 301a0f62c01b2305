// bench/fp8/fp8.cpp: `ferry bench fp8`: the layout, the CPU measurement, and the report (table,
// targets, JSON records) around the CUDA measurement (fp8_cuda.cpp).
#include "bench/fp8/fp8.hpp"

#include <ferry/sdk/error.hpp>

#include <fmt/format.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <random>
#include <thread>

#include "bench/common/baseline.hpp"
#include "ferry_build_config.h"

namespace ferry::bench {
namespace {

constexpr std::uint64_t kRows = 4096, kCols = 7168;  // a DeepSeek-V3-sized projection: 56 MiB
constexpr double kSpeedupGoal = 8.0, kRooflineGoal = 0.60;

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// The baseline's median seconds, or 0 when it did not run.
double torch_seconds(const Baseline& b) {
  if (!b.available || !b.data.contains("fp8") || !b.data["fp8"].is_object()) return 0;
  const Json& m = b.data["fp8"];
  if (!m.contains("median_s") || !m["median_s"].is_number()) return 0;
  return m["median_s"].get<double>();
}

}  // namespace

Fp8Layout make_fp8_layout(std::uint64_t count, std::uint64_t rows, std::uint64_t cols) {
  if (count == 0 || count > (1u << 30) || rows == 0 || cols == 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "bench fp8: bad layout {} x [{}, {}]", count, rows, cols);
  }
  Fp8Layout l{count, rows, cols, {}};
  l.ops.resize(count);
  for (std::uint64_t i = 0; i < count; ++i) {
    ferry_plan_op_t& op = l.ops[i];
    op = ferry_plan_op_t{};
    op.struct_size = FERRY_STRUCT_SIZE(ferry_plan_op_t, scale_param);
    op.src_tensor = static_cast<std::uint32_t>(i);
    op.src_dtype = FERRY_DTYPE_BF16;
    op.src_row_stride = cols;
    op.dst_param = static_cast<std::uint32_t>(2 * i);
    op.dst_dtype = FERRY_DTYPE_F8_E4M3;
    op.dst_row_stride = cols;
    op.rows = rows;
    op.cols = cols;
    op.transform = FERRY_TRANSFORM_FP8_BLOCK_QUANT;
    op.scale_param = static_cast<std::uint32_t>(2 * i + 1);
  }
  return l;
}

std::vector<kernels::EntryView> fp8_entries(const Fp8Layout& l, const std::byte* bucket) {
  std::vector<kernels::EntryView> out(l.count);
  for (std::uint64_t i = 0; i < l.count; ++i) {
    out[i] = {bucket + i * l.elements() * 2, FERRY_DTYPE_BF16, l.elements()};
  }
  return out;
}

std::vector<kernels::ParamView> fp8_params(const Fp8Layout& l, std::byte* q, std::byte* scales) {
  std::vector<kernels::ParamView> out(2 * l.count);
  for (std::uint64_t i = 0; i < l.count; ++i) {
    out[2 * i] = {q + i * l.elements(), FERRY_DTYPE_F8_E4M3, l.elements()};
    out[2 * i + 1] = {scales + i * l.scales() * 4, FERRY_DTYPE_F32, l.scales()};
  }
  return out;
}

std::vector<std::uint16_t> fp8_source_pattern(std::uint64_t elements, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> normal(0.0f, 0.02f);
  std::vector<std::uint16_t> out(elements);
  for (std::uint64_t i = 0; i < elements; ++i) {
    float v = normal(rng);
    if (rng() % 1000 < 3) v *= 40.0f;  // outliers make block scales differ
    std::uint32_t u;
    std::memcpy(&u, &v, 4);
    out[i] = static_cast<std::uint16_t>(u >> 16);
  }
  return out;
}

Fp8Measurement measure_fp8_cpu(const Fp8Layout& l, int warmup, int repeat) {
  Fp8Measurement m;
  m.count = l.count;
  const std::vector<std::uint16_t> pattern = fp8_source_pattern(l.elements(), 42);
  std::vector<std::uint16_t> bucket(l.count * l.elements());
  for (std::uint64_t i = 0; i < l.count; ++i) {
    std::memcpy(bucket.data() + i * l.elements(), pattern.data(), l.elements() * 2);
  }
  std::vector<std::byte> q(l.count * l.elements());
  std::vector<std::byte> scales(l.count * l.scales() * 4);
  const auto entries = fp8_entries(l, reinterpret_cast<const std::byte*>(bucket.data()));
  const auto params = fp8_params(l, q.data(), scales.data());
  Watchdog::phase("running fp8_block_quant_cpu");
  for (int i = 0; i < warmup + repeat; ++i) {
    const auto t = std::chrono::steady_clock::now();
    kernels::fp8_block_quant_cpu(l.ops, entries, params);
    if (i >= warmup) m.ferry_s.push_back(seconds_since(t));
  }
  std::vector<std::uint16_t> copy(bucket.size());
  for (int i = 0; i < warmup + repeat; ++i) {
    const auto t = std::chrono::steady_clock::now();
    std::memcpy(copy.data(), bucket.data(), bucket.size() * 2);
    if (i >= warmup) m.copy_s.push_back(seconds_since(t));
  }
  // Every matrix holds the same source, so every matrix's codes and scales must be equal.
  bool same = true;
  for (std::uint64_t i = 1; i < l.count; ++i) {
    same = same && std::memcmp(q.data(), q.data() + i * l.elements(), l.elements()) == 0;
  }
  m.verified = same;
  m.verification = same ? fmt::format("all {} matrices (same source) quantized identically", l.count)
                        : "matrices with the same source quantized differently";
  m.note = "CPU memcpy is single-threaded; the CPU run is a smoke test, not a roofline";
  return m;
}

#if !FERRY_HAVE_CUDA
Fp8Measurement measure_fp8_cuda(Fp8Layout, int, int) {
  fail(FERRY_STATUS_UNIMPLEMENTED, "this ferry was built without CUDA: use --device cpu");
}
#endif

int run_fp8_bench(const BenchOptions& options, Json& records) {
  const bool cuda = options.device == Device::cuda;
  const int repeat = options.repeat > 0 ? options.repeat : (cuda ? 20 : 3);
  const int warmup = options.warmup > 0 ? options.warmup : (cuda ? 3 : 1);
  const double gib = options.gib > 0 ? options.gib : (cuda ? 4.0 : 0.125);
  const std::uint64_t rows = cuda ? kRows : 1024, cols = cuda ? kCols : 1536;
  const std::uint64_t count = std::max<std::uint64_t>(
      1, static_cast<std::uint64_t>(gib * (1ull << 30) / static_cast<double>(rows * cols * 2)));
  const Fp8Layout layout = make_fp8_layout(count, rows, cols);
  std::printf("fp8: %llu bf16 matrices of [%llu, %llu] (%s) on %s, %d warm-up + %d timed runs ...\n",
              static_cast<unsigned long long>(count), static_cast<unsigned long long>(rows),
              static_cast<unsigned long long>(cols),
              decimal_bytes(static_cast<double>(count * rows * cols * 2)).c_str(),
              device_name(options.device), warmup, repeat);
  std::fflush(stdout);
  Fp8Measurement m = cuda ? measure_fp8_cuda(layout, warmup, repeat)
                          : measure_fp8_cpu(layout, warmup, repeat);
  const double elements = static_cast<double>(m.count * rows * cols);
  const double src_bytes = elements * 2;
  // Traffic: read bf16 (2 B), write e4m3 (1 B), plus the scales; the copy reads and writes 2 B.
  const double traffic = elements * 3 + static_cast<double>(m.count * layout.scales() * 4);
  const double ferry_s = median(m.ferry_s);
  const double copy_s = median(m.copy_s);
  const double ferry_bw = ferry_s > 0 ? traffic / ferry_s : 0;
  const double copy_bw = copy_s > 0 ? 2 * src_bytes / copy_s : 0;
  const double roofline = copy_bw > 0 ? ferry_bw / copy_bw : 0;

  Baseline baseline;
  if (options.no_torch) {
    baseline.reason = "skipped (--no-torch)";
  } else {
    baseline = run_torch_baseline(
        options, {"--case", "fp8", "--device", device_name(options.device), "--count",
                  std::to_string(m.count), "--rows", std::to_string(rows), "--cols",
                  std::to_string(cols), "--repeat", std::to_string(std::min(repeat, 10)),
                  "--warmup", std::to_string(std::min(warmup, 2))});
  }
  const double torch_s = torch_seconds(baseline);
  const double speedup = torch_s > 0 && ferry_s > 0 ? torch_s / ferry_s : 0;  // 0: unknown

  Table table({"case", "matrices", "bf16 bytes", "ferry ms", "ferry GB/s (r+w)", "copy GB/s (r+w)",
               "of roofline", "torch ms", "vs torch", "verified"});
  table.add_row({"fp8-block-128", std::to_string(m.count), decimal_bytes(src_bytes),
                 fmt::format("{:.3f}", ferry_s * 1e3), fmt::format("{:.1f}", ferry_bw / 1e9),
                 fmt::format("{:.1f}", copy_bw / 1e9), fmt::format("{:.1f}%", roofline * 100),
                 torch_s > 0 ? fmt::format("{:.3f}", torch_s * 1e3) : "-",
                 speedup > 0 ? fmt::format("{:.1f}x", speedup) : "-", m.verified ? "yes" : "FAILED"});
  std::printf("\nferry bench fp8 on %s: median of %d runs after %d warm-up run(s)\n",
              device_name(options.device), repeat, warmup);
  table.print();
  std::printf("\ntargets (issue 8): >= %.0fx torch -> %s; >= %.0f%% of the memory roofline -> %s%s\n",
              kSpeedupGoal, speedup > 0 ? (speedup >= kSpeedupGoal ? "met" : "NOT met") : "unknown",
              kRooflineGoal * 100, roofline >= kRooflineGoal ? "met" : "NOT met",
              cuda ? "" : " (GPU targets; this CPU run is for reference only)");
  if (!m.note.empty()) std::printf("note: %s\n", m.note.c_str());
  if (!baseline.available) std::printf("torch baseline unavailable: %s\n", baseline.reason.c_str());
  std::printf("verification: %s\n", m.verification.c_str());
  std::printf("roofline = the read+write bandwidth of one flat D2D copy of the bf16 bytes; ferry's "
              "traffic = 2 B read + 1 B written per element + 4 B per 128x128 scale.\n");

  Json record = record_header("fp8", "fp8-block-128", options.device);
  record["matrices"] = m.count;
  record["rows"] = rows;
  record["cols"] = cols;
  record["bf16_bytes"] = src_bytes;
  record["traffic_bytes"] = traffic;
  record["warmup"] = warmup;
  record["repeat"] = repeat;
  record["ferry"] = {{"median_s", ferry_s}, {"gbps_read_write", ferry_bw / 1e9}, {"runs_s", m.ferry_s}};
  record["flat_copy"] = {{"median_s", copy_s}, {"gbps_read_write", copy_bw / 1e9}, {"runs_s", m.copy_s}};
  record["fraction_of_roofline"] = roofline;
  record["torch"] = {{"available", baseline.available}, {"reason", baseline.reason},
                     {"result", baseline.available ? baseline.data : Json(nullptr)}};
  record["speedup_vs_torch"] = speedup > 0 ? Json(speedup) : Json(nullptr);
  record["targets"] = {{"speedup_goal", kSpeedupGoal}, {"roofline_goal", kRooflineGoal}};
  record["note"] = m.note;
  record["verified"] = m.verified;
  record["verification"] = m.verification;
  records.push_back(record);
  std::fflush(stdout);
  return m.verified ? 0 : 1;
}

}  // namespace ferry::bench
