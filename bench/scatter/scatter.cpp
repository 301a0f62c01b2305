// bench/scatter/scatter.cpp: `ferry bench scatter`: the cases, their layout and plan, and the
// report (table, PERF.md targets, JSON records) around the CPU and CUDA measurements.
#include "bench/scatter/scatter.hpp"

#include <ferry/sdk/error.hpp>

#include <fmt/format.h>

#include <algorithm>
#include <cstdio>
#include <numeric>
#include <optional>
#include <random>
#include <set>

#include "bench/common/baseline.hpp"
#include "bench/common/data.hpp"
#include "ferry_build_config.h"

namespace ferry::bench {
namespace {

// The target each case is held to (shared/PERF.md, "batched scatter of a bucket").
enum class Target { fraction_of_flat_copy, speedup_over_foreach };

struct ScatterCase {
  const char* name;
  std::uint64_t gpu_count;
  std::uint64_t cpu_count;  // small enough for a 2-core, 24 GiB CI machine
  std::uint64_t tensor_bytes;
  Target target;
  double goal;
  const char* what;
};

constexpr ScatterCase kCases[] = {
    {"moe-3mib", 9216, 64, 3ull << 20, Target::fraction_of_flat_copy, 0.85,
     "MoE-shaped tensors, 3 MiB each"},
    {"tiny-8kib", 20000, 20000, 8ull << 10, Target::speedup_over_foreach, 4.0,
     "tiny tensors, 8 KiB each"},
};

std::optional<double> torch_median(const Baseline& baseline, const char* method) {
  if (!baseline.available || !baseline.data.contains(method)) return std::nullopt;
  const Json& m = baseline.data[method];
  if (!m.is_object() || !m.contains("median_s") || !m["median_s"].is_number()) return std::nullopt;
  const double s = m["median_s"].get<double>();
  if (s <= 0) return std::nullopt;
  return s;
}

std::string torch_method_note(const Baseline& baseline, const char* method) {
  if (!baseline.available || !baseline.data.contains(method)) return "";
  const Json& m = baseline.data[method];
  if (m.is_object() && m.contains("unavailable") && m["unavailable"].is_string()) {
    return m["unavailable"].get<std::string>();
  }
  return "";
}

Json timing_json(const std::vector<double>& runs, double payload) {
  Json t;
  const double med = median(runs);
  t["median_s"] = med;
  t["gbps"] = med > 0 ? payload / med / 1e9 : 0.0;
  t["runs_s"] = runs;
  return t;
}

std::string percent(std::optional<double> fraction) {
  return fraction ? fmt::format("{:.1f}%", *fraction * 100) : "-";
}

std::string times(std::optional<double> factor) {
  return factor ? fmt::format("{:.2f}x", *factor) : "-";
}

std::optional<double> ratio(std::optional<double> a, std::optional<double> b) {
  if (!a || !b || *b <= 0) return std::nullopt;
  return *a / *b;
}

std::optional<double> gbps(double payload, std::optional<double> seconds) {
  if (!seconds || *seconds <= 0) return std::nullopt;
  return payload / *seconds / 1e9;
}

std::string ms(std::optional<double> seconds) {
  return seconds ? fmt::format("{:.3f}", *seconds * 1e3) : "-";
}

}  // namespace

ScatterLayout make_scatter_layout(std::uint64_t count, std::uint64_t tensor_bytes) {
  if (count == 0 || count > 0xFFFFFFFFull) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "bench scatter: {} tensors is outside 1 .. 2^32 - 1",
         count);
  }
  if (tensor_bytes == 0 || tensor_bytes % 2 != 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "bench scatter: tensor size {} bytes is not a positive whole number of bf16 elements",
         tensor_bytes);
  }
  ScatterLayout layout;
  layout.count = count;
  layout.tensor_bytes = tensor_bytes;
  layout.slot_bytes = tensor_bytes + kSlotGapBytes;
  layout.slot_of.resize(count);
  std::iota(layout.slot_of.begin(), layout.slot_of.end(), 0u);
  std::mt19937_64 shuffle_rng(0x5ca77e5ull);
  std::shuffle(layout.slot_of.begin(), layout.slot_of.end(), shuffle_rng);
  const std::uint64_t elements = tensor_bytes / 2;
  layout.ops.resize(count);
  for (std::uint64_t i = 0; i < count; ++i) {
    ferry_plan_op_t& op = layout.ops[i];
    op = ferry_plan_op_t{};
    op.struct_size = FERRY_STRUCT_SIZE(ferry_plan_op_t, scale_param);
    op.src_tensor = static_cast<std::uint32_t>(i);
    op.src_dtype = FERRY_DTYPE_BF16;
    op.src_offset = 0;
    op.src_row_stride = elements;
    op.dst_param = layout.slot_of[i];
    op.dst_dtype = FERRY_DTYPE_BF16;
    op.dst_offset = 0;
    op.dst_row_stride = elements;
    op.rows = 1;
    op.cols = elements;
    op.transform = FERRY_TRANSFORM_COPY;
  }
  return layout;
}

std::vector<kernels::EntryView> scatter_entries(const ScatterLayout& layout,
                                                const std::byte* bucket) {
  std::vector<kernels::EntryView> entries(layout.count);
  for (std::uint64_t i = 0; i < layout.count; ++i) {
    entries[i] = {bucket + i * layout.tensor_bytes, FERRY_DTYPE_BF16, layout.tensor_bytes / 2};
  }
  return entries;
}

std::vector<kernels::ParamView> scatter_params(const ScatterLayout& layout, std::byte* region) {
  std::vector<kernels::ParamView> params(layout.count);
  for (std::uint64_t j = 0; j < layout.count; ++j) {
    params[j] = {region + j * layout.slot_bytes, FERRY_DTYPE_BF16, layout.tensor_bytes / 2};
  }
  return params;
}

std::vector<std::uint64_t> sample_tensors(std::uint64_t count, std::size_t how_many) {
  std::set<std::uint64_t> picked = {0, count - 1};
  std::mt19937_64 rng(0xbe4c4ull);
  for (std::size_t tries = 0; picked.size() < std::min<std::uint64_t>(how_many, count) &&
                              tries < 16 * how_many;
       ++tries) {
    picked.insert(rng() % count);
  }
  return {picked.begin(), picked.end()};
}

#if !FERRY_HAVE_CUDA
ScatterMeasurement measure_scatter_cuda(std::uint64_t, std::uint64_t, int, int, std::uint64_t) {
  fail(FERRY_STATUS_UNIMPLEMENTED,
       "this ferry was built without CUDA (-Dcuda=disabled or no nvcc): use --device cpu");
}
#endif

int run_scatter_bench(const BenchOptions& options, Json& records) {
  const bool cuda = options.device == Device::cuda;
  const int repeat = options.repeat > 0 ? options.repeat : (cuda ? 20 : 5);
  const int warmup = options.warmup > 0 ? options.warmup : (cuda ? 3 : 1);

  std::vector<const ScatterCase*> cases;
  for (const ScatterCase& c : kCases) {
    if (options.only.empty() || options.only == c.name) cases.push_back(&c);
  }
  if (cases.empty()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "bench scatter: no case named '{}' (cases: {}, {})",
         options.only, kCases[0].name, kCases[1].name);
  }

  Table table({"case", "tensors", "size", "payload", "ferry GB/s", "flat GB/s", "ferry/flat",
               "foreach GB/s", "loop GB/s", "vs foreach", "verified"});
  Table time_table({"case", "ferry ms", "ferry host submit ms", "flat ms", "foreach ms",
                    "loop ms"});
  std::vector<std::string> target_lines;
  std::vector<std::string> notes;
  int exit_code = 0;
  std::uint64_t seed = 0x5eed0001;

  for (const ScatterCase* c : cases) {
    const std::uint64_t requested = options.count > 0 ? options.count : (cuda ? c->gpu_count
                                                                           : c->cpu_count);
    std::printf("scatter %s: %llu x %s bf16 on %s, %d warm-up + %d timed runs ...\n", c->name,
                static_cast<unsigned long long>(requested), binary_size(c->tensor_bytes).c_str(),
                device_name(options.device), warmup, repeat);
    std::fflush(stdout);
    Json record = record_header("scatter", c->name, options.device);
    ScatterMeasurement m =
        cuda ? measure_scatter_cuda(requested, c->tensor_bytes, warmup, repeat, seed++)
             : measure_scatter_cpu(requested, c->tensor_bytes, warmup, repeat, seed++);
    if (!m.note.empty()) {
      std::printf("  note: %s\n", m.note.c_str());
      notes.push_back(fmt::format("{}: {}", c->name, m.note));
    }
    if (!m.verified) {
      std::printf("  VERIFICATION FAILED: %s\n", m.verification.c_str());
      exit_code = 1;
    }
    std::fflush(stdout);

    Baseline baseline;
    if (options.no_torch) {
      baseline.reason = "skipped (--no-torch)";
    } else {
      baseline = run_torch_baseline(
          options, {"--case", "scatter", "--device", device_name(options.device), "--count",
                    std::to_string(m.count), "--bytes", std::to_string(c->tensor_bytes), "--gap",
                    std::to_string(kSlotGapBytes), "--repeat", std::to_string(repeat),
                    "--warmup", std::to_string(warmup)});
    }
    if (!baseline.available) {
      notes.push_back(fmt::format("{}: torch baseline: unavailable ({})", c->name,
                                  baseline.reason));
    } else {
      for (const char* method : {"foreach", "loop"}) {
        const std::string why = torch_method_note(baseline, method);
        if (!why.empty()) notes.push_back(fmt::format("{}: torch {}: unavailable ({})", c->name,
                                                      method, why));
      }
      if (baseline.data.contains("verified") && baseline.data["verified"] != true) {
        notes.push_back(fmt::format("{}: the torch baseline's own check FAILED: {}", c->name,
                                    baseline.data.value("verification", std::string("?"))));
      }
    }

    const double payload = static_cast<double>(m.count) * static_cast<double>(c->tensor_bytes);
    const std::optional<double> ferry_s = median(m.ferry_s);
    const std::optional<double> flat_s = median(m.flat_s);
    const std::optional<double> foreach_s = torch_median(baseline, "foreach");
    const std::optional<double> loop_s = torch_median(baseline, "loop");
    const std::optional<double> ferry_rate = gbps(payload, ferry_s);
    const std::optional<double> flat_rate = gbps(payload, flat_s);
    const std::optional<double> to_flat = ratio(ferry_rate, flat_rate);
    const std::optional<double> vs_foreach = ratio(foreach_s, ferry_s);
    const std::optional<double> vs_loop = ratio(loop_s, ferry_s);

    table.add_row({c->name, std::to_string(m.count), binary_size(c->tensor_bytes),
                   decimal_bytes(payload), number(ferry_rate, 1), number(flat_rate, 1),
                   percent(to_flat), number(gbps(payload, foreach_s), 1),
                   number(gbps(payload, loop_s), 1), times(vs_foreach),
                   m.verified ? "yes" : "FAILED"});
    time_table.add_row({c->name, ms(ferry_s), ms(median(m.ferry_submit_s)), ms(flat_s),
                        ms(foreach_s), ms(loop_s)});

    Json target;
    std::optional<double> value;
    if (c->target == Target::fraction_of_flat_copy) {
      target["rule"] = fmt::format("ferry >= {:.0f}% of the flat D2D copy of the same bytes",
                                   c->goal * 100);
      value = to_flat;
    } else {
      target["rule"] = fmt::format("ferry >= {:.0f}x faster than torch._foreach_copy_", c->goal);
      value = vs_foreach;
    }
    target["goal"] = c->goal;
    target["value"] = value ? Json(*value) : Json(nullptr);
    target["met"] = value ? Json(*value >= c->goal) : Json(nullptr);
    target["applies_to"] = "cuda";
    const std::string shown = c->target == Target::fraction_of_flat_copy ? percent(value)
                                                                         : times(value);
    std::string verdict = !value ? "unknown (no measurement)" : (*value >= c->goal ? "met"
                                                                                    : "NOT met");
    if (!cuda) verdict += " (a GPU target; this CPU run is for reference only)";
    target_lines.push_back(fmt::format("  {:<10} {}: {} -> {}", c->name,
                                       target["rule"].get<std::string>(), shown, verdict));

    record["what"] = c->what;
    record["tensors"] = m.count;
    record["requested_tensors"] = requested;
    record["note"] = m.note;
    record["dtype"] = "bf16";
    record["tensor_bytes"] = c->tensor_bytes;
    record["slot_gap_bytes"] = kSlotGapBytes;
    record["payload_bytes"] = static_cast<std::uint64_t>(payload);
    record["warmup"] = warmup;
    record["repeat"] = repeat;
    record["bandwidth_convention"] = "payload bytes / median seconds (read + write not doubled)";
    record["ferry"] = timing_json(m.ferry_s, payload);
    record["ferry"]["host_submit_median_s"] = median(m.ferry_submit_s);
    record["flat_copy"] = timing_json(m.flat_s, payload);
    record["ratio_to_flat_copy"] = to_flat ? Json(*to_flat) : Json(nullptr);
    Json torch;
    torch["available"] = baseline.available;
    torch["reason"] = baseline.reason;
    torch["script"] = baseline.script;
    torch["foreach_gbps"] = foreach_s ? Json(payload / *foreach_s / 1e9) : Json(nullptr);
    torch["loop_gbps"] = loop_s ? Json(payload / *loop_s / 1e9) : Json(nullptr);
    torch["result"] = baseline.available ? baseline.data : Json(nullptr);
    record["torch"] = torch;
    record["speedup_vs_foreach"] = vs_foreach ? Json(*vs_foreach) : Json(nullptr);
    record["speedup_vs_loop"] = vs_loop ? Json(*vs_loop) : Json(nullptr);
    record["target"] = target;
    record["verified"] = m.verified;
    record["verification"] = m.verification;
    records.push_back(record);
  }

  std::printf("\nferry bench scatter on %s: median of %d runs after %d warm-up run(s); GB/s = "
              "payload bytes / time\n",
              device_name(options.device), repeat, warmup);
  table.print();
  std::printf("\ntimes (median):\n");
  time_table.print();
  std::printf("\ntargets (shared/PERF.md):\n");
  for (const std::string& line : target_lines) std::printf("%s\n", line.c_str());
  if (!notes.empty()) {
    std::printf("\nnotes:\n");
    for (const std::string& line : notes) std::printf("  %s\n", line.c_str());
  }
  std::printf("\nferry = scatter_%s of one plan (one COPY op per tensor into shuffled, separate "
              "destination slots)%s; flat = the same bytes by %s.\n",
              device_name(options.device),
              cuda ? ", prepared once (plan check and op-table upload, in the notes) as the update "
                     "engine caches it with the plan, then one launch per run"
                   : ", including its host-side plan check",
              cuda ? "one cudaMemcpyAsync D2D" : "memcpy split over the same threads");
  std::fflush(stdout);
  return exit_code;
}

}  // namespace ferry::bench
