// The MoE model families' mapping and planning logic (see moe_model.hpp). Routed experts, the
// router, shared experts and DeepSeek's MLA attention are mapped here; everything else goes to
// the dense model, which is handed shape-only stand-ins for the dense parts a MoE layer lacks
// (its MLP, or its q/k/v/o for MLA layers) so that its layer rules hold; the stand-ins'
// parameters are dropped from the layout.
#include "moe_model.hpp"
#include "shard_block.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <charconv>
#include <limits>
#include <map>
#include <set>
#include <string_view>
#include <unordered_map>
#include <unordered_set>

namespace ferry::moe {
namespace {

using dense::Block;
using dense::Shard;

// A MoE-specific per-layer tensor (other than the routed experts).
struct Rule {
  std::string_view suffix;  // after "model.layers.<N>."
  Shard shard;
  std::string_view fused;  // engine layout parameter suffix; empty: keeps its own name
};

constexpr std::array<Rule, 9> kMlpRules = {{
    {"mlp.gate.weight", Shard::kReplicated, ""},  // the router
    {"mlp.gate.e_score_correction_bias", Shard::kReplicated, ""},  // DeepSeek-V3
    {"mlp.shared_expert_gate.weight", Shard::kReplicated, ""},     // Qwen2-MoE
    {"mlp.shared_expert.gate_proj.weight", Shard::kDim0, "mlp.shared_expert.gate_up_proj.weight"},
    {"mlp.shared_expert.up_proj.weight", Shard::kDim0, "mlp.shared_expert.gate_up_proj.weight"},
    {"mlp.shared_expert.down_proj.weight", Shard::kDim1, ""},
    {"mlp.shared_experts.gate_proj.weight", Shard::kDim0,
     "mlp.shared_experts.gate_up_proj.weight"},  // DeepSeek-V3
    {"mlp.shared_experts.up_proj.weight", Shard::kDim0, "mlp.shared_experts.gate_up_proj.weight"},
    {"mlp.shared_experts.down_proj.weight", Shard::kDim1, ""},
}};

// DeepSeek multi-head latent attention; a layer is MLA when it has kv_a_proj_with_mqa.
constexpr std::string_view kMlaMarker = "self_attn.kv_a_proj_with_mqa.weight";
constexpr std::string_view kFusedQkvA = "self_attn.fused_qkv_a_proj_with_mqa.weight";
constexpr std::array<Rule, 8> kMlaRules = {{
    {"self_attn.q_a_proj.weight", Shard::kReplicated, kFusedQkvA},
    {"self_attn.q_a_layernorm.weight", Shard::kReplicated, ""},
    {"self_attn.q_b_proj.weight", Shard::kDim0, ""},
    {"self_attn.q_proj.weight", Shard::kDim0, ""},  // MLA without a q LoRA
    {"self_attn.kv_a_proj_with_mqa.weight", Shard::kReplicated, kFusedQkvA},
    {"self_attn.kv_a_layernorm.weight", Shard::kReplicated, ""},
    {"self_attn.kv_b_proj.weight", Shard::kDim0, ""},
    {"self_attn.o_proj.weight", Shard::kDim1, ""},
}};
constexpr std::array<std::string_view, 3> kMlaRequired = {
    "self_attn.kv_a_layernorm.weight", "self_attn.kv_b_proj.weight", "self_attn.o_proj.weight"};

constexpr std::string_view kLayerPrefix = "model.layers.";
constexpr std::string_view kExperts = "mlp.experts.";
constexpr std::string_view kRouter = "mlp.gate.weight";
constexpr std::string_view kCorrectionBias = "mlp.gate.e_score_correction_bias";
constexpr std::array<std::string_view, 3> kProjections = {"gate_proj.weight", "up_proj.weight",
                                                          "down_proj.weight"};
enum Proj : std::size_t { kGate, kUp, kDown };

constexpr std::uint32_t kNoParam = std::numeric_limits<std::uint32_t>::max();
constexpr std::size_t kMaxListed = 20;

std::string name_list(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < kMaxListed; ++i) {
    if (i > 0) out += ", ";
    out += names[i];
  }
  if (names.size() > kMaxListed) out += fmt::format(", ... and {} more", names.size() - kMaxListed);
  return out;
}

std::optional<std::uint64_t> parse_index(std::string_view digits) {
  if (digits.empty() || (digits.size() > 1 && digits[0] == '0')) return std::nullopt;
  std::uint64_t v = 0;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), v);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  return v;
}

struct LayerName {
  std::uint64_t index = 0;
  std::string_view suffix;
};
std::optional<LayerName> parse_layer_name(std::string_view name) {
  if (!name.starts_with(kLayerPrefix)) return std::nullopt;
  const std::string_view rest = name.substr(kLayerPrefix.size());
  const std::size_t dot = rest.find('.');
  if (dot == std::string_view::npos) return std::nullopt;
  auto index = parse_index(rest.substr(0, dot));
  if (!index) return std::nullopt;
  return LayerName{*index, rest.substr(dot + 1)};
}

// "mlp.experts.<e>.<proj>" -> (e, proj); nullopt when the suffix is not an expert tensor name.
struct ExpertName {
  std::uint64_t expert = 0;
  Proj proj = kGate;
};
std::optional<ExpertName> parse_expert(std::string_view suffix) {
  if (!suffix.starts_with(kExperts)) return std::nullopt;
  const std::string_view rest = suffix.substr(kExperts.size());
  const std::size_t dot = rest.find('.');
  if (dot == std::string_view::npos) return std::nullopt;
  auto e = parse_index(rest.substr(0, dot));
  if (!e) return std::nullopt;
  for (std::size_t p = 0; p < kProjections.size(); ++p) {
    if (rest.substr(dot + 1) == kProjections[p]) return ExpertName{*e, static_cast<Proj>(p)};
  }
  return std::nullopt;
}

template <std::size_t N>
const Rule* find_rule(const std::array<Rule, N>& rules, std::string_view suffix) {
  for (const Rule& r : rules) {
    if (r.suffix == suffix) return &r;
  }
  return nullptr;
}

std::optional<std::uint64_t> config_count(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_unsigned()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "moe model: config_json '{}' must be a non-negative "
         "integer, got {}", key, it->dump());
  }
  return it->get<std::uint64_t>();
}

// Where one checkpoint tensor handled here goes (param kNoParam: nowhere on this rank).
struct Placement {
  std::uint32_t param = kNoParam;  // index into the final layout
  Shard shard = Shard::kReplicated;
  std::uint64_t part_offset = 0;  // element offset of this rank's part inside the parameter
  Tensor source;
  std::uint32_t owner_ep_rank = 0;  // for experts of other ranks: who holds them
  bool expert = false;
};

Tensor stand_in(std::string name, ferry_dtype_t dtype, std::uint64_t rows, std::uint64_t cols) {
  return Tensor{std::move(name), dtype, {rows, cols}};
}

}  // namespace

struct MoeModel::Mapping {
  std::vector<Tensor> params;
  std::unordered_map<std::string, Placement> placements;  // tensors handled here, by name
  std::unordered_set<std::string> dense_names;             // tensors the dense model handles
  std::vector<std::uint32_t> dense_to_final;               // kNoParam: a stand-in's parameter
};

MoeConfig make_config(const char* layout, std::uint32_t tp_rank, std::uint32_t tp_size,
                      std::uint32_t ep_rank, std::uint32_t ep_size, const Options& options,
                      const char* config_json) {
  MoeConfig config;
  config.dense = dense::make_config(layout, tp_rank, tp_size, options, config_json);
  if (ep_size == 0) fail(FERRY_STATUS_INVALID_ARGUMENT, "moe model: ep_size must be at least 1");
  if (ep_rank >= ep_size) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "moe model: ep_rank {} is not below ep_size {}", ep_rank,
         ep_size);
  }
  config.ep_rank = ep_rank;
  config.ep_size = ep_size;
  if (config_json != nullptr) {
    config.config_json = config_json;
    const nlohmann::json json = nlohmann::json::parse(config_json);  // dense checked it parses
    config.num_experts = config_count(json, "num_experts");
    if (!config.num_experts) config.num_experts = config_count(json, "n_routed_experts");
    if (config.num_experts == std::uint64_t{0}) config.num_experts.reset();
    config.nextn_layers = config_count(json, "num_nextn_predict_layers").value_or(0);
  }
  return config;
}

MoeModel::MoeModel(MoeConfig config) : config_(std::move(config)), dense_(config_.dense) {}
MoeModel::~MoeModel() = default;

std::vector<Tensor> MoeModel::target_layout(const std::vector<Tensor>& catalog) {
  const std::uint32_t tp = config_.dense.tp_size;
  const std::uint32_t tp_rank = config_.dense.tp_rank;
  const std::uint32_t ep = config_.ep_size;
  const bool engine = config_.dense.layout == Layout::kEngine;
  const std::optional<std::uint64_t> num_layers = config_.dense.num_hidden_layers;

  // 1. Route every tensor: routed expert, MoE/MLA rule, skipped MTP layer, or dense.
  std::set<std::uint64_t> mla_layers;
  for (const Tensor& t : catalog) {
    if (auto l = parse_layer_name(t.name); l && l->suffix == kMlaMarker) mla_layers.insert(l->index);
  }
  struct LayerExperts {
    std::map<std::uint64_t, std::array<const Tensor*, 3>> experts;
  };
  std::map<std::uint64_t, LayerExperts> expert_layers;
  std::map<std::uint64_t, std::vector<std::pair<const Rule*, const Tensor*>>> own;  // by layer
  std::vector<const Tensor*> skipped;  // MTP layers
  std::vector<Tensor> dense_catalog;
  std::map<std::uint64_t, bool> dense_has_mlp;
  std::vector<std::string> malformed;
  std::unordered_set<std::string_view> seen;
  for (const Tensor& t : catalog) {
    if (!seen.insert(t.name).second) {
      malformed.push_back(fmt::format("{} (listed twice)", t.name));
      continue;
    }
    auto layer = parse_layer_name(t.name);
    if (!layer) {
      dense_catalog.push_back(t);
      continue;
    }
    if (num_layers && layer->index >= *num_layers &&
        layer->index < *num_layers + config_.nextn_layers) {
      skipped.push_back(&t);
      continue;
    }
    if (auto e = parse_expert(layer->suffix)) {
      if (dtype_size(t.dtype) == 0) {
        malformed.push_back(fmt::format("{} (invalid dtype {})", t.name, static_cast<int>(t.dtype)));
      }
      auto [it, inserted] = expert_layers[layer->index].experts.try_emplace(e->expert);
      if (inserted) it->second.fill(nullptr);
      it->second[e->proj] = &t;
      continue;
    }
    const Rule* rule = find_rule(kMlpRules, layer->suffix);
    if (rule == nullptr && mla_layers.count(layer->index) != 0) {
      rule = find_rule(kMlaRules, layer->suffix);
    }
    if (rule != nullptr) {
      if (dtype_size(t.dtype) == 0) {
        malformed.push_back(fmt::format("{} (invalid dtype {})", t.name, static_cast<int>(t.dtype)));
      }
      own[layer->index].emplace_back(rule, &t);
      continue;
    }
    if (layer->suffix == "mlp.gate_proj.weight") dense_has_mlp[layer->index] = true;
    dense_catalog.push_back(t);
  }
  if (!malformed.empty()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "moe model: malformed checkpoint catalog: {}",
         name_list(malformed));
  }

  // 2. Experts: complete per layer, consistent shapes, divisible by EP and TP.
  const Tensor* embed = nullptr;
  for (const Tensor& t : dense_catalog) {
    if (t.name == "model.embed_tokens.weight") embed = &t;
  }
  // 0: unknown (no embedding; the dense model reports it missing).
  const std::uint64_t hidden = embed != nullptr && embed->shape.size() == 2 ? embed->shape[1] : 0;
  auto find_own = [&](std::uint64_t layer, std::string_view suffix) -> const Tensor* {
    auto it = own.find(layer);
    if (it == own.end()) return nullptr;
    for (const auto& [rule, t] : it->second) {
      if (rule->suffix == suffix) return t;
    }
    return nullptr;
  };
  std::vector<std::string> missing;
  std::vector<std::string> bad;
  std::map<std::uint64_t, std::uint64_t> experts_of;  // layer -> E
  std::map<std::uint64_t, std::uint64_t> inter_of;    // layer -> I
  for (const auto& [index, layer] : expert_layers) {
    const Tensor* router = find_own(index, kRouter);
    std::uint64_t count = config_.num_experts.value_or(0);
    if (count == 0 && router != nullptr && !router->shape.empty()) count = router->shape[0];
    if (count == 0) count = layer.experts.rbegin()->first + 1;
    experts_of[index] = count;
    const std::string prefix = fmt::format("{}{}.", kLayerPrefix, index);
    if (router == nullptr) missing.push_back(prefix + std::string(kRouter));
    std::vector<std::string> absent;
    for (std::uint64_t e = 0; e < count; ++e) {
      auto it = layer.experts.find(e);
      if (it == layer.experts.end()) {
        absent.push_back(std::to_string(e));
        continue;
      }
      std::string parts;
      for (std::size_t p = 0; p < 3; ++p) {
        if (it->second[p] == nullptr) parts += (parts.empty() ? "" : "/") + std::string(kProjections[p].substr(0, kProjections[p].find('.')));
      }
      if (!parts.empty()) absent.push_back(fmt::format("{} ({})", e, parts));
    }
    if (!absent.empty()) {
      missing.push_back(fmt::format("{}mlp.experts: {} of {} experts missing, by index: {}", prefix,
                                    absent.size(), count, name_list(absent)));
    }
    for (const auto& [e, parts] : layer.experts) {
      if (e >= count) {
        bad.push_back(fmt::format("{}mlp.experts.{} (expert index beyond the {} experts)", prefix,
                                  e, count));
      }
    }
    // Shapes: gate/up [I, H], down [H, I], the same I for every expert of the layer.
    const Tensor* first_gate = nullptr;
    for (const auto& [e, parts] : layer.experts) {
      if (parts[kGate] != nullptr) {
        first_gate = parts[kGate];
        break;
      }
    }
    if (first_gate == nullptr || first_gate->shape.size() != 2) continue;
    const std::uint64_t inter = first_gate->shape[0];
    const std::uint64_t h = hidden != 0 ? hidden : first_gate->shape[1];
    inter_of[index] = inter;
    const ferry_dtype_t dtype = first_gate->dtype;
    for (const auto& [e, parts] : layer.experts) {
      for (std::size_t p = 0; p < 3; ++p) {
        const Tensor* t = parts[p];
        if (t == nullptr) continue;
        const std::vector<std::uint64_t> want =
            p == kDown ? std::vector<std::uint64_t>{h, inter} : std::vector<std::uint64_t>{inter, h};
        if (t->shape != want || inter == 0 || h == 0) {
          bad.push_back(fmt::format("{} (expected {}, got {})", t->name, shape_string(want),
                                    shape_string(t->shape)));
        } else if (engine && !config_.dense.dtype && t->dtype != dtype) {
          bad.push_back(fmt::format("{} is {} but {} is {} (stacked experts share one dtype; set "
                                    "option dtype to cast)",
                                    t->name, dtype_name(t->dtype), first_gate->name,
                                    dtype_name(dtype)));
        }
      }
    }
    if (router != nullptr && router->shape != std::vector<std::uint64_t>{count, h}) {
      bad.push_back(fmt::format("{} (expected [{}, {}], got {})", router->name, count, h,
                                shape_string(router->shape)));
    }
    if (const Tensor* bias = find_own(index, kCorrectionBias);
        bias != nullptr && bias->shape != std::vector<std::uint64_t>{count}) {
      bad.push_back(fmt::format("{} (expected [{}], got {})", bias->name, count,
                                shape_string(bias->shape)));
    }
    if (count % ep != 0) {
      bad.push_back(fmt::format("{}mlp.experts ({} experts are not divisible by ep_size {})",
                                prefix, count, ep));
    }
    if (inter % tp != 0) {
      bad.push_back(fmt::format("{}mlp.experts (moe intermediate size {} is not divisible by "
                                "tp_size {})",
                                prefix, inter, tp));
    }
  }
  // Other MoE / MLA tensors: 1-D or 2-D, the sharded dim divisible by TP; shared gate/up/down
  // and MLA required parts present.
  for (const auto& [index, list] : own) {
    const std::string prefix = fmt::format("{}{}.", kLayerPrefix, index);
    for (const auto& [rule, t] : list) {
      const std::size_t dim = rule->shard == Shard::kDim1 ? 1 : 0;
      const bool ok_rank = t->shape.size() == 2 || (t->shape.size() == 1 && dim == 0);
      if (!ok_rank || !element_count(t->shape) || *element_count(t->shape) == 0) {
        bad.push_back(fmt::format("{} (expected a 2-D tensor, got {})", t->name,
                                  shape_string(t->shape)));
      } else if (rule->shard != Shard::kReplicated && t->shape[dim] % tp != 0) {
        bad.push_back(fmt::format("{} (dim {} of size {} is not divisible by tp_size {})",
                                  t->name, dim, t->shape[dim], tp));
      }
    }
    for (std::string_view group : {std::string_view("mlp.shared_expert."),
                                   std::string_view("mlp.shared_experts.")}) {
      int present = 0;
      for (std::string_view p : kProjections) {
        present += find_own(index, std::string(group) + std::string(p)) != nullptr ? 1 : 0;
      }
      if (present == 0) continue;
      for (std::string_view p : kProjections) {
        const std::string suffix = std::string(group) + std::string(p);
        if (find_own(index, suffix) == nullptr) missing.push_back(prefix + suffix);
      }
    }
    if (mla_layers.count(index) != 0) {
      for (std::string_view s : kMlaRequired) {
        if (find_own(index, s) == nullptr) missing.push_back(prefix + std::string(s));
      }
    }
  }
  if (!missing.empty()) {
    fail(FERRY_STATUS_NOT_FOUND, "moe model: {} required checkpoint part(s) missing: {}",
         missing.size(), name_list(missing));
  }
  if (!bad.empty()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "moe model: {} mis-shaped or indivisible tensor(s): {}",
         bad.size(), name_list(bad));
  }

  // 3. The dense model, with stand-ins for the dense parts MoE / MLA layers do not have.
  std::vector<Tensor> stand_ins;
  if (hidden != 0) {
    const ferry_dtype_t dtype = embed->dtype;
    const std::uint64_t h = hidden;
    std::set<std::uint64_t> layers_needing_mlp;
    for (const auto& [index, layer] : expert_layers) {
      if (!dense_has_mlp.count(index)) layers_needing_mlp.insert(index);
    }
    for (std::uint64_t index : layers_needing_mlp) {
      const std::string prefix = fmt::format("{}{}.", kLayerPrefix, index);
      stand_ins.push_back(stand_in(prefix + "mlp.gate_proj.weight", dtype, tp, h));
      stand_ins.push_back(stand_in(prefix + "mlp.up_proj.weight", dtype, tp, h));
      stand_ins.push_back(stand_in(prefix + "mlp.down_proj.weight", dtype, h, tp));
    }
    for (std::uint64_t index : mla_layers) {
      const std::string prefix = fmt::format("{}{}.", kLayerPrefix, index);
      stand_ins.push_back(stand_in(prefix + "self_attn.q_proj.weight", dtype, tp, h));
      stand_ins.push_back(stand_in(prefix + "self_attn.k_proj.weight", dtype, tp, h));
      stand_ins.push_back(stand_in(prefix + "self_attn.v_proj.weight", dtype, tp, h));
      stand_ins.push_back(stand_in(prefix + "self_attn.o_proj.weight", dtype, h, tp));
    }
  }
  auto mapping = std::make_shared<Mapping>();
  std::vector<Tensor> dense_input = dense_catalog;
  dense_input.insert(dense_input.end(), stand_ins.begin(), stand_ins.end());
  const std::vector<Tensor> dense_params = dense_.target_layout(dense_input);
  std::vector<bool> dropped(dense_params.size(), false);
  for (const Tensor& s : stand_ins) dropped[dense_.locate(Tensor{s.name, s.dtype, {}}).dst_param] = true;
  for (const Tensor& t : dense_catalog) mapping->dense_names.insert(t.name);

  // 4. MoE parameters (indices local to moe_params until the final order is known).
  struct Param {
    Tensor tensor;
    int group;           // 0: before the layers, 1: a layer's, 2: after the layers
    std::uint64_t layer;  // for group 1
    int source;          // 0: dense, 1: here
    std::size_t order;
  };
  std::vector<Param> all;
  std::vector<std::uint32_t> dense_slot(dense_params.size(), kNoParam);
  bool seen_layer = false;
  for (std::size_t i = 0; i < dense_params.size(); ++i) {
    if (dropped[i]) continue;
    auto l = parse_layer_name(dense_params[i].name);
    seen_layer = seen_layer || l.has_value();
    dense_slot[i] = static_cast<std::uint32_t>(all.size());
    all.push_back(Param{dense_params[i], l ? 1 : (seen_layer ? 2 : 0), l ? l->index : 0, 0, i});
  }
  std::unordered_map<std::string, std::uint32_t> own_index;  // parameter name -> slot in `all`
  std::vector<std::pair<std::string, std::uint32_t>> placement_slots;  // tensor -> slot
  auto param_dtype = [&](ferry_dtype_t t) { return config_.dense.dtype.value_or(t); };
  // A MoE / MLA tensor as (part of) a parameter, sharded like the dense plugin shards.
  auto add_part = [&](const Tensor& t, std::uint64_t layer, Shard shard, std::string_view fused) {
    Placement p;
    p.shard = shard;
    p.source = t;
    std::vector<std::uint64_t> shape = t.shape;
    if (shard != Shard::kReplicated) shape[shard == Shard::kDim1 ? 1 : 0] /= tp;
    const std::string name =
        engine && !fused.empty() ? fmt::format("{}{}.{}", kLayerPrefix, layer, fused) : t.name;
    auto [it, inserted] = own_index.try_emplace(name, static_cast<std::uint32_t>(all.size()));
    if (inserted) {
      all.push_back(Param{Tensor{name, param_dtype(t.dtype), shape}, 1, layer, 1, all.size()});
    } else {
      Tensor& param = all[it->second].tensor;
      p.part_offset = *element_count(param.shape);
      param.shape[0] += shape[0];
    }
    p.param = it->second;
    mapping->placements.emplace(t.name, std::move(p));
  };
  for (const auto& [index, list] : own) {
    // Attention (MLA) first, then the MLP parts, each in rule order.
    for (const Rule& rule : kMlaRules) {
      for (const auto& [r, t] : list) {
        if (r == &rule) add_part(*t, index, rule.shard, rule.fused);
      }
    }
    for (const Rule& rule : kMlpRules) {
      for (const auto& [r, t] : list) {
        if (r == &rule) add_part(*t, index, rule.shard, rule.fused);
      }
    }
  }
  for (const auto& [index, layer] : expert_layers) {
    const std::uint64_t count = experts_of.at(index);
    const std::uint64_t local = count / ep;
    const std::uint64_t first = config_.ep_rank * local;
    const std::uint64_t inter = inter_of.at(index);
    const std::uint64_t shard = inter / tp;
    const std::uint64_t h = layer.experts.begin()->second[kGate]->shape[1];
    const ferry_dtype_t dtype = param_dtype(layer.experts.begin()->second[kGate]->dtype);
    std::uint32_t w13 = kNoParam, w2 = kNoParam;
    if (engine) {
      const std::string prefix = fmt::format("{}{}.mlp.experts.", kLayerPrefix, index);
      w13 = static_cast<std::uint32_t>(all.size());
      all.push_back(Param{Tensor{prefix + "w13_weight", dtype, {local, 2 * shard, h}}, 1, index, 1,
                          all.size()});
      w2 = static_cast<std::uint32_t>(all.size());
      all.push_back(
          Param{Tensor{prefix + "w2_weight", dtype, {local, h, shard}}, 1, index, 1, all.size()});
    }
    for (const auto& [e, parts] : layer.experts) {
      const bool mine = e >= first && e < first + local;
      for (std::size_t p = 0; p < 3; ++p) {
        const Tensor& t = *parts[p];
        if (!mine) {
          Placement none;
          none.source = t;
          none.expert = true;
          none.owner_ep_rank = static_cast<std::uint32_t>(e / local);
          mapping->placements.emplace(t.name, std::move(none));
          continue;
        }
        const Shard s = p == kDown ? Shard::kDim1 : Shard::kDim0;
        if (!engine) {
          add_part(t, index, s, "");
          mapping->placements.at(t.name).expert = true;
          continue;
        }
        Placement pl;
        pl.source = t;
        pl.shard = s;
        pl.expert = true;
        const std::uint64_t j = e - first;
        if (p == kDown) {
          pl.param = w2;
          pl.part_offset = j * h * shard;
        } else {
          pl.param = w13;
          pl.part_offset = j * 2 * shard * h + (p == kUp ? shard * h : 0);
        }
        mapping->placements.emplace(t.name, std::move(pl));
      }
    }
  }
  for (const Tensor* t : skipped) {
    Placement none;
    none.source = *t;
    mapping->placements.emplace(t->name, std::move(none));
  }

  // 5. Final order: before-layers, layers by index (dense parts, then MoE parts), after-layers.
  std::vector<std::size_t> order(all.size());
  for (std::size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](std::size_t a, std::size_t b) {
    const Param& x = all[a];
    const Param& y = all[b];
    if (x.group != y.group) return x.group < y.group;
    if (x.group != 1) return false;
    if (x.layer != y.layer) return x.layer < y.layer;
    return x.source < y.source;
  });
  std::vector<std::uint32_t> final_of(all.size());
  for (std::size_t k = 0; k < order.size(); ++k) {
    final_of[order[k]] = static_cast<std::uint32_t>(k);
    mapping->params.push_back(all[order[k]].tensor);
  }
  for (auto& [name, p] : mapping->placements) {
    if (p.param != kNoParam) p.param = final_of[p.param];
  }
  mapping->dense_to_final.assign(dense_params.size(), kNoParam);
  for (std::size_t i = 0; i < dense_params.size(); ++i) {
    if (dense_slot[i] != kNoParam) mapping->dense_to_final[i] = final_of[dense_slot[i]];
  }
  for (const Tensor& p : mapping->params) {
    if (!element_count(p.shape)) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "moe model: parameter {} of shape {} is too large",
           p.name, shape_string(p.shape));
    }
  }
  (void)tp_rank;
  std::vector<Tensor> params = mapping->params;
  {
    std::lock_guard lock(mutex_);
    mapping_ = std::move(mapping);
  }
  return params;
}

std::shared_ptr<const MoeModel::Mapping> MoeModel::mapping(const char* caller) const {
  std::lock_guard lock(mutex_);
  if (!mapping_) {
    fail(FERRY_STATUS_FAILED_PRECONDITION, "moe model: {} called before target_layout", caller);
  }
  return mapping_;
}

std::vector<ferry_plan_op_t> MoeModel::plan(const std::vector<Tensor>& entries) const {
  const std::shared_ptr<const Mapping> m = mapping("plan");
  if (entries.size() > std::numeric_limits<std::uint32_t>::max()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "moe model: {} entries do not fit a plan", entries.size());
  }
  std::vector<ferry_plan_op_t> ops;
  std::vector<Tensor> dense_entries;
  std::vector<std::uint32_t> dense_index;
  std::unordered_set<std::string_view> seen;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const Tensor& e = entries[i];
    auto it = m->placements.find(e.name);
    if (it == m->placements.end()) {
      dense_entries.push_back(e);
      dense_index.push_back(static_cast<std::uint32_t>(i));
      continue;
    }
    const Placement& p = it->second;
    dense::check_entry("moe model", e, p.source.shape, seen);
    if (p.param == kNoParam) continue;
    const Block b = dense::block_of(p.source.shape, p.shard, p.part_offset,
                                    config_.dense.tp_rank, config_.dense.tp_size);
    ops.push_back(dense::make_op(b, static_cast<std::uint32_t>(i), e.dtype, p.param,
                          m->params[p.param].dtype));
  }
  if (!dense_entries.empty()) {
    for (ferry_plan_op_t op : dense_.plan(dense_entries)) {
      op.src_tensor = dense_index[op.src_tensor];
      op.dst_param = m->dense_to_final[op.dst_param];
      if (op.dst_param == kNoParam) {
        fail(FERRY_STATUS_INTERNAL, "moe model: entry '{}' planned into a stand-in parameter",
             entries[op.src_tensor].name);
      }
      ops.push_back(op);
    }
  }
  return ops;
}

ferry_plan_op_t MoeModel::locate(const Tensor& tensor) const {
  const std::shared_ptr<const Mapping> m = mapping("locate");
  auto it = m->placements.find(tensor.name);
  if (it == m->placements.end()) {
    if (m->dense_names.count(tensor.name) == 0 && tensor.name != "lm_head.weight") {
      fail(FERRY_STATUS_NOT_FOUND, "moe model: '{}' has no parameter region", tensor.name);
    }
    ferry_plan_op_t op = dense_.locate(tensor);
    op.dst_param = m->dense_to_final[op.dst_param];
    if (op.dst_param == kNoParam) {
      fail(FERRY_STATUS_NOT_FOUND, "moe model: '{}' has no parameter region", tensor.name);
    }
    return op;
  }
  const Placement& p = it->second;
  if (p.param == kNoParam) {
    if (p.expert) {
      fail(FERRY_STATUS_NOT_FOUND,
           "moe model: '{}' is an expert of ep rank {}, not of this rank {} (of {})", tensor.name,
           p.owner_ep_rank, config_.ep_rank, config_.ep_size);
    }
    fail(FERRY_STATUS_NOT_FOUND, "moe model: '{}' has no parameter region (not loaded by engines)",
         tensor.name);
  }
  if (!tensor.shape.empty() && tensor.shape != p.source.shape) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "moe model: '{}' has shape {}, the catalog said {}",
         tensor.name, shape_string(tensor.shape), shape_string(p.source.shape));
  }
  return dense::locate_op(dense::block_of(p.source.shape, p.shard, p.part_offset,
                                          config_.dense.tp_rank, config_.dense.tp_size),
                          tensor.dtype, p.source.dtype, p.param, m->params[p.param].dtype);
}

}  // namespace ferry::moe
