// bench/moe/moe.cpp: `ferry bench moe`: the plans from the MoE plugin, the CPU measurement and
// the report (table, JSON records) around the CUDA measurement (moe_cuda.cpp).
#include "bench/moe/moe.hpp"

#include <ferry/sdk/error.hpp>
#include <ferry/sdk/manifest.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <chrono>
#include <cstdio>
#include <cstring>

#include "bench/common/baseline.hpp"
#include "bench/common/data.hpp"
#include "cli/plugin_search.hpp"
#include "ferry_build_config.h"
#include "registry/registry.hpp"
#include "update/model_binding.hpp"

namespace ferry::bench {
namespace {

double seconds_since(std::chrono::steady_clock::time_point t) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
}

// A bf16 tensor's description; its name points into `name`.
ferry_tensor_desc_t desc(const std::string& name, const std::vector<std::uint64_t>& shape) {
  return manifest::tensor_desc(name, FERRY_DTYPE_BF16, shape);
}

std::string expert_name(std::uint64_t l, std::uint64_t e, int part) {
  static const char* parts[] = {"gate_proj", "up_proj", "down_proj"};
  return fmt::format("model.layers.{}.mlp.experts.{}.{}.weight", l, e, parts[part]);
}

// The baseline method's median seconds, or 0 when it did not run.
double torch_seconds(const Baseline& b, const char* method) {
  if (!b.available || !b.data.contains(method) || !b.data[method].is_object()) return 0;
  const Json& m = b.data[method];
  if (!m.contains("median_s") || !m["median_s"].is_number()) return 0;
  return m["median_s"].get<double>();
}

}  // namespace

MoePlans make_moe_plans(const MoeShape& s, const GlobalOptions& globals) {
  // The full catalog (names and shapes only) of a Qwen3-MoE model with these shapes.
  std::vector<std::pair<std::string, std::vector<std::uint64_t>>> names;
  const std::uint64_t q = 32 * 128, kv = 4 * 128;
  names.push_back({"model.embed_tokens.weight", {s.vocab, s.hidden}});
  for (std::uint64_t l = 0; l < s.layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    names.push_back({p + "input_layernorm.weight", {s.hidden}});
    names.push_back({p + "self_attn.q_proj.weight", {q, s.hidden}});
    names.push_back({p + "self_attn.k_proj.weight", {kv, s.hidden}});
    names.push_back({p + "self_attn.v_proj.weight", {kv, s.hidden}});
    names.push_back({p + "self_attn.q_norm.weight", {128}});
    names.push_back({p + "self_attn.k_norm.weight", {128}});
    names.push_back({p + "self_attn.o_proj.weight", {s.hidden, q}});
    names.push_back({p + "post_attention_layernorm.weight", {s.hidden}});
    names.push_back({p + "mlp.gate.weight", {s.experts, s.hidden}});
    for (std::uint64_t e = 0; e < s.experts; ++e) {
      names.push_back({expert_name(l, e, 0), {s.inter, s.hidden}});
      names.push_back({expert_name(l, e, 1), {s.inter, s.hidden}});
      names.push_back({expert_name(l, e, 2), {s.hidden, s.inter}});
    }
  }
  names.push_back({"model.norm.weight", {s.hidden}});
  names.push_back({"lm_head.weight", {s.vocab, s.hidden}});
  std::vector<ferry_tensor_desc_t> catalog;
  for (const auto& [n, shape] : names) catalog.push_back(desc(n, shape));

  const registry::Registry reg(plugin_search_path(globals, {}));
  const auto plugin = reg.model("moe");
  const std::string config =
      nlohmann::json{{"num_experts", s.experts}, {"num_hidden_layers", s.layers},
                     {"num_attention_heads", 32}, {"num_key_value_heads", 4}}
          .dump();
  ferry_model_create_args_t args{};
  args.struct_size = FERRY_STRUCT_SIZE(ferry_model_create_args_t, num_options);
  args.layout = "engine";
  args.tp_size = 1;
  args.ep_size = 1;
  args.config_json = config.c_str();
  auto binding = update::ModelBinding::create(plugin->model(), "moe", args, plugin);
  const auto& layout = binding->target_layout(catalog);
  MoePlans plans;
  plans.layout_size = layout.size();
  for (std::uint64_t l = 0; l < s.layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.mlp.experts.", l);
    for (std::size_t i = 0; i < layout.size(); ++i) {
      if (layout[i].name == p + "w13_weight") plans.w13.push_back(static_cast<std::uint32_t>(i));
      if (layout[i].name == p + "w2_weight") plans.w2.push_back(static_cast<std::uint32_t>(i));
    }
    std::vector<std::string> entry_names;
    for (std::uint64_t e = 0; e < s.experts; ++e) {
      for (int part = 0; part < 3; ++part) entry_names.push_back(expert_name(l, e, part));
    }
    std::vector<ferry_tensor_desc_t> entries;
    for (std::uint64_t e = 0; e < s.experts; ++e) {
      entries.push_back(desc(entry_names[3 * e], {s.inter, s.hidden}));
      entries.push_back(desc(entry_names[3 * e + 1], {s.inter, s.hidden}));
      entries.push_back(desc(entry_names[3 * e + 2], {s.hidden, s.inter}));
    }
    plans.ops.push_back(binding->plan(entries));
  }
  if (plans.w13.size() != s.layers || plans.w2.size() != s.layers) {
    fail(FERRY_STATUS_INTERNAL, "bench moe: the moe plugin's layout has no stacked experts");
  }
  return plans;
}

std::vector<kernels::EntryView> moe_entries(const MoeShape& s, const std::byte* bucket) {
  std::vector<kernels::EntryView> out(s.experts * 3);
  for (std::uint64_t i = 0; i < out.size(); ++i) {
    out[i] = {bucket + i * s.tensor_elements() * 2, FERRY_DTYPE_BF16, s.tensor_elements()};
  }
  return out;
}

MoeMeasurement measure_moe_cpu(const MoeShape& s, const MoePlans& plans, int warmup, int repeat) {
  MoeMeasurement m;
  m.layers = s.layers;
  std::vector<std::byte> bucket(s.bucket_bytes());
  fill_pattern_cpu(bucket.data(), bucket.size(), 7);
  const std::uint64_t param_bytes = s.experts * 2 * s.inter * s.hidden * 2;
  std::vector<std::vector<std::byte>> w13(s.layers), w2(s.layers);
  std::vector<kernels::ParamView> params(plans.layout_size);
  for (std::uint64_t l = 0; l < s.layers; ++l) {
    w13[l].assign(param_bytes, std::byte{kPoisonByte});
    w2[l].assign(param_bytes / 2, std::byte{kPoisonByte});
    params[plans.w13[l]] = {w13[l].data(), FERRY_DTYPE_BF16, param_bytes / 2};
    params[plans.w2[l]] = {w2[l].data(), FERRY_DTYPE_BF16, param_bytes / 4};
  }
  const auto entries = moe_entries(s, bucket.data());
  Watchdog::phase("running scatter_cpu over every layer");
  for (int i = 0; i < warmup + repeat; ++i) {
    const auto t = std::chrono::steady_clock::now();
    for (std::uint64_t l = 0; l < s.layers; ++l) kernels::scatter_cpu(plans.ops[l], entries, params);
    if (i >= warmup) m.ferry_s.push_back(seconds_since(t));
  }
  // Expert e's up_proj is rows [I, 2I) of slot e of w13; its down_proj is slot e of w2.
  const std::uint64_t t = s.tensor_elements() * 2;
  bool ok = true;
  for (std::uint64_t l = 0; l < s.layers; ++l) {
    for (std::uint64_t e = 0; e < s.experts; ++e) {
      ok = ok && std::memcmp(w13[l].data() + (2 * e + 1) * t, bucket.data() + (3 * e + 1) * t, t) == 0;
      ok = ok && std::memcmp(w2[l].data() + e * t, bucket.data() + (3 * e + 2) * t, t) == 0;
    }
  }
  m.verified = ok;
  m.verification = ok ? "every expert's up_proj and down_proj found in its stacked slot"
                      : "an expert is not in its stacked slot";
  return m;
}

#if !FERRY_HAVE_CUDA
MoeMeasurement measure_moe_cuda(const MoeShape&, const MoePlans&, int, int) {
  fail(FERRY_STATUS_UNIMPLEMENTED, "this ferry was built without CUDA: use --device cpu");
}
#endif

int run_moe_bench(const BenchOptions& options, const GlobalOptions& globals, Json& records) {
  const bool cuda = options.device == Device::cuda;
  const int repeat = options.repeat > 0 ? options.repeat : (cuda ? 10 : 3);
  const int warmup = options.warmup > 0 ? options.warmup : (cuda ? 2 : 1);
  MoeShape shape;
  if (!cuda) shape = MoeShape{2, 8, 256, 128, 1024};
  if (options.count > 0) shape.layers = options.count;
  std::printf("moe: %llu layers x %llu experts, hidden %llu, moe_intermediate %llu (bf16, %s per "
              "layer bucket) on %s ...\n",
              static_cast<unsigned long long>(shape.layers),
              static_cast<unsigned long long>(shape.experts),
              static_cast<unsigned long long>(shape.hidden),
              static_cast<unsigned long long>(shape.inter),
              decimal_bytes(static_cast<double>(shape.bucket_bytes())).c_str(),
              device_name(options.device));
  std::fflush(stdout);
  Watchdog::phase("planning with the moe plugin");
  const auto planned = std::chrono::steady_clock::now();
  MoePlans plans = make_moe_plans(shape, globals);
  const double plan_s = seconds_since(planned);
  MoeMeasurement m = cuda ? measure_moe_cuda(shape, plans, warmup, repeat)
                          : measure_moe_cpu(shape, plans, warmup, repeat);
  const double payload = static_cast<double>(m.layers * shape.bucket_bytes());
  const double ferry_s = median(m.ferry_s);

  Baseline baseline;
  if (options.no_torch) {
    baseline.reason = "skipped (--no-torch)";
  } else {
    baseline = run_torch_baseline(
        options, {"--case", "moe", "--device", device_name(options.device), "--layers",
                  std::to_string(m.layers), "--experts", std::to_string(shape.experts),
                  "--hidden", std::to_string(shape.hidden), "--inter", std::to_string(shape.inter),
                  "--repeat", std::to_string(std::min(repeat, 5)), "--warmup", "1"});
  }
  const auto loop_s = torch_seconds(baseline, "loop");
  const auto foreach_s = torch_seconds(baseline, "foreach");
  auto vs = [&](double t) {
    return t > 0 && ferry_s > 0 ? fmt::format("{:.1f}x", t / ferry_s) : std::string("-");
  };
  auto ms = [](double t) { return t > 0 ? fmt::format("{:.2f}", t * 1e3) : std::string("-"); };
  Table table({"case", "layers", "tensors", "payload", "ferry ms", "ferry GB/s", "loop ms",
               "foreach ms", "vs loop", "vs foreach", "verified"});
  table.add_row({"qwen3-30b-a3b", std::to_string(m.layers),
                 std::to_string(m.layers * shape.experts * 3), decimal_bytes(payload),
                 ms(ferry_s), fmt::format("{:.1f}", ferry_s > 0 ? payload / ferry_s / 1e9 : 0.0),
                 ms(loop_s), ms(foreach_s), vs(loop_s), vs(foreach_s),
                 m.verified ? "yes" : "FAILED"});
  std::printf("\nferry bench moe on %s: median of %d runs after %d warm-up run(s); GB/s = payload / "
              "time\n",
              device_name(options.device), repeat, warmup);
  table.print();
  std::printf("plans from the moe plugin: %.1f ms for all layers (once per manifest; cached)\n",
              plan_s * 1e3);
  if (!m.note.empty()) std::printf("note: %s\n", m.note.c_str());
  if (!baseline.available) std::printf("torch baseline unavailable: %s\n", baseline.reason.c_str());
  std::printf("verification: %s\n", m.verification.c_str());
  std::printf("ferry = one scatter launch per layer bucket (384 expert tensors -> w13/w2), plans "
              "prepared once like the update engine caches them.\n");

  Json record = record_header("moe", "qwen3-30b-a3b", options.device);
  record["layers"] = m.layers;
  record["experts"] = shape.experts;
  record["hidden"] = shape.hidden;
  record["moe_intermediate"] = shape.inter;
  record["tensors"] = m.layers * shape.experts * 3;
  record["payload_bytes"] = payload;
  record["warmup"] = warmup;
  record["repeat"] = repeat;
  record["plan_s"] = plan_s;
  record["ferry"] = {{"median_s", ferry_s}, {"gbps", ferry_s > 0 ? payload / ferry_s / 1e9 : 0.0},
                     {"runs_s", m.ferry_s}};
  record["torch"] = {{"available", baseline.available}, {"reason", baseline.reason},
                     {"result", baseline.available ? baseline.data : Json(nullptr)}};
  record["speedup_vs_loop"] = loop_s > 0 && ferry_s > 0 ? Json(loop_s / ferry_s) : Json(nullptr);
  record["speedup_vs_foreach"] =
      foreach_s > 0 && ferry_s > 0 ? Json(foreach_s / ferry_s) : Json(nullptr);
  record["note"] = m.note;
  record["verified"] = m.verified;
  record["verification"] = m.verification;
  records.push_back(record);
  std::fflush(stdout);
  return m.verified ? 0 : 1;
}

}  // namespace ferry::bench
