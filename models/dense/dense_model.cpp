// The dense model family's mapping and planning logic (see dense_model.hpp).
#include "dense_model.hpp"
#include "shard_block.hpp"

#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>

#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <algorithm>
#include <array>
#include <cctype>
#include <charconv>
#include <limits>
#include <map>
#include <string_view>
#include <unordered_set>

namespace ferry::dense {
namespace {

struct LayerRule {
  std::string_view suffix;  // after "model.layers.<N>."
  Shard shard;
  std::string_view fused;  // the engine layout's parameter suffix; empty: keeps its own name
  bool required;
};

// The per-layer checkpoint tensors, in parameter order. Optional groups (q/k/v biases of Qwen2,
// q/k norms of Qwen3) are all-or-nothing within a layer.
constexpr std::array<LayerRule, 14> kLayerRules = {{
    {"input_layernorm.weight", Shard::kReplicated, "", true},
    {"self_attn.q_proj.weight", Shard::kDim0, "self_attn.qkv_proj.weight", true},
    {"self_attn.k_proj.weight", Shard::kDim0, "self_attn.qkv_proj.weight", true},
    {"self_attn.v_proj.weight", Shard::kDim0, "self_attn.qkv_proj.weight", true},
    {"self_attn.q_proj.bias", Shard::kDim0, "self_attn.qkv_proj.bias", false},
    {"self_attn.k_proj.bias", Shard::kDim0, "self_attn.qkv_proj.bias", false},
    {"self_attn.v_proj.bias", Shard::kDim0, "self_attn.qkv_proj.bias", false},
    {"self_attn.q_norm.weight", Shard::kReplicated, "", false},
    {"self_attn.k_norm.weight", Shard::kReplicated, "", false},
    {"self_attn.o_proj.weight", Shard::kDim1, "", true},
    {"post_attention_layernorm.weight", Shard::kReplicated, "", true},
    {"mlp.gate_proj.weight", Shard::kDim0, "mlp.gate_up_proj.weight", true},
    {"mlp.up_proj.weight", Shard::kDim0, "mlp.gate_up_proj.weight", true},
    {"mlp.down_proj.weight", Shard::kDim1, "", true},
}};
enum LayerSlot : std::size_t {
  kInputNorm, kQ, kK, kV, kQBias, kKBias, kVBias, kQNorm, kKNorm, kO, kPostNorm, kGate, kUp, kDown,
};
const std::vector<std::vector<std::size_t>> kOptionalGroups = {
    {kQBias, kKBias, kVBias},
    {kQNorm, kKNorm},
};
// Parts fused into one engine parameter; they must share a dtype unless option dtype casts.
const std::vector<std::vector<std::size_t>> kFusedGroups = {
    {kQ, kK, kV},
    {kQBias, kKBias, kVBias},
    {kGate, kUp},
};

// Older Llama checkpoints carry this buffer; engines recompute it, so it has no parameter.
constexpr std::string_view kInvFreqSuffix = "self_attn.rotary_emb.inv_freq";

constexpr std::string_view kEmbed = "model.embed_tokens.weight";
constexpr std::string_view kFinalNorm = "model.norm.weight";
constexpr std::string_view kLmHead = "lm_head.weight";
constexpr std::string_view kLayerPrefix = "model.layers.";

constexpr std::uint32_t kNoParam = std::numeric_limits<std::uint32_t>::max();
constexpr std::size_t kMaxListed = 20;

// Joins names for a one-line message, capped so a broken 80-layer checkpoint stays readable.
std::string name_list(const std::vector<std::string>& names) {
  std::string out;
  for (std::size_t i = 0; i < names.size() && i < kMaxListed; ++i) {
    if (i > 0) out += ", ";
    out += names[i];
  }
  if (names.size() > kMaxListed) out += fmt::format(", ... and {} more", names.size() - kMaxListed);
  return out;
}

std::string shape_text(const std::vector<std::uint64_t>& shape) { return shape_string(shape); }

const char* layout_name(Layout layout) { return layout == Layout::kEngine ? "engine" : "hf"; }

// A name that is model.layers.<N>.<suffix>, N decimal without leading zeros.
struct LayerName {
  std::uint64_t index = 0;
  std::string_view suffix;
};
std::optional<LayerName> parse_layer_name(std::string_view name) {
  if (!name.starts_with(kLayerPrefix)) return std::nullopt;
  std::string_view rest = name.substr(kLayerPrefix.size());
  const std::size_t dot = rest.find('.');
  if (dot == std::string_view::npos || dot == 0) return std::nullopt;
  std::string_view digits = rest.substr(0, dot);
  if (digits.size() > 1 && digits[0] == '0') return std::nullopt;
  LayerName out;
  auto [end, ec] = std::from_chars(digits.data(), digits.data() + digits.size(), out.index);
  if (ec != std::errc() || end != digits.data() + digits.size()) return std::nullopt;
  out.suffix = rest.substr(dot + 1);
  return out;
}

std::optional<std::size_t> layer_slot(std::string_view suffix) {
  for (std::size_t i = 0; i < kLayerRules.size(); ++i) {
    if (kLayerRules[i].suffix == suffix) return i;
  }
  return std::nullopt;
}

std::optional<ferry_dtype_t> parse_float_dtype(std::string value) {
  std::optional<ferry_dtype_t> dtype = dtype_from_name(value);
  if (!dtype) {
    std::string upper = value;
    std::transform(upper.begin(), upper.end(), upper.begin(),
                   [](unsigned char c) { return static_cast<char>(std::toupper(c)); });
    if (upper == "FP32") upper = "F32";
    if (upper == "FP16") upper = "F16";
    if (upper == "FP64") upper = "F64";
    dtype = dtype_from_name(upper);
  }
  if (dtype == FERRY_DTYPE_F64 || dtype == FERRY_DTYPE_F32 || dtype == FERRY_DTYPE_F16 ||
      dtype == FERRY_DTYPE_BF16) {
    return dtype;
  }
  return std::nullopt;
}

std::optional<std::uint64_t> config_count(const nlohmann::json& config, const char* key) {
  auto it = config.find(key);
  if (it == config.end() || it->is_null()) return std::nullopt;
  if (!it->is_number_unsigned() || it->get<std::uint64_t>() == 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "config_json: '{}' must be a positive integer, got {}", key,
         it->dump());
  }
  return it->get<std::uint64_t>();
}

// Where one checkpoint tensor goes: its parameter (kNoParam: the engine keeps no copy), how it
// is sharded, and the element offset of this rank's part inside a fused parameter.
struct Placement {
  std::uint32_t param = kNoParam;
  Shard shard = Shard::kReplicated;
  std::uint64_t part_offset = 0;
  Tensor source;  // the checkpoint tensor as cataloged
};

using Dim = std::optional<std::uint64_t>;  // nullopt: any positive size

// Records `t` as mis-shaped unless its shape is `dims` (every dim positive).
void expect_shape(const Tensor* t, std::initializer_list<Dim> dims, std::vector<std::string>& bad) {
  if (t == nullptr) return;
  bool ok = t->shape.size() == dims.size();
  std::size_t i = 0;
  std::string expected = "[";
  for (const Dim& d : dims) {
    if (i > 0) expected += ", ";
    expected += d ? std::to_string(*d) : "*";
    if (ok && (t->shape[i] == 0 || (d && t->shape[i] != *d))) ok = false;
    ++i;
  }
  expected += "]";
  if (!ok) bad.push_back(fmt::format("{} (expected {}, got {})", t->name, expected, shape_text(t->shape)));
}

Dim dim_of(const Tensor* t, std::size_t i) {
  if (t == nullptr || t->shape.size() <= i || t->shape[i] == 0) return std::nullopt;
  return t->shape[i];
}

}  // namespace

struct DenseModel::Mapping {
  std::vector<Tensor> params;
  std::unordered_map<std::string, Placement> placements;  // by checkpoint tensor name
  bool tied = false;  // the engine's lm_head is the embedding
};

ModelConfig make_config(const char* layout, std::uint32_t tp_rank, std::uint32_t tp_size,
                        const Options& options, const char* config_json) {
  ModelConfig config;
  const std::string_view layout_text = layout == nullptr ? "engine" : layout;
  if (layout_text == "engine") {
    config.layout = Layout::kEngine;
  } else if (layout_text == "hf") {
    config.layout = Layout::kHf;
  } else {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "dense model: unknown layout '{}' (known layouts: engine, hf)", layout_text);
  }
  config.tp_rank = tp_rank;
  config.tp_size = tp_size;

  bool have_dtype = false;
  for (const auto& [key, value] : options) {
    if (key != "dtype") {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "dense model: unknown option '{}' (known options: dtype)", key);
    }
    if (have_dtype) fail(FERRY_STATUS_INVALID_ARGUMENT, "dense model: option 'dtype' given twice");
    have_dtype = true;
    config.dtype = parse_float_dtype(value);
    if (!config.dtype) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "dense model: option 'dtype' = '{}' is not one of bf16, f16, f32, f64", value);
    }
  }

  if (config_json != nullptr) {
    nlohmann::json json;
    try {
      json = nlohmann::json::parse(config_json);
    } catch (const nlohmann::json::exception& e) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "dense model: config_json is not valid JSON: {}",
           e.what());
    }
    if (!json.is_object()) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "dense model: config_json must be a JSON object");
    }
    if (auto it = json.find("tie_word_embeddings"); it != json.end() && !it->is_null()) {
      if (!it->is_boolean()) {
        fail(FERRY_STATUS_INVALID_ARGUMENT,
             "dense model: config_json 'tie_word_embeddings' must be true or false, got {}",
             it->dump());
      }
      config.tie_word_embeddings = it->get<bool>();
    }
    config.num_attention_heads = config_count(json, "num_attention_heads");
    config.num_key_value_heads = config_count(json, "num_key_value_heads");
    config.num_hidden_layers = config_count(json, "num_hidden_layers");
    if (!config.num_key_value_heads) config.num_key_value_heads = config.num_attention_heads;
  }
  return config;
}

DenseModel::DenseModel(ModelConfig config) : config_(std::move(config)) {
  const std::uint32_t n = config_.tp_size;
  if (n == 0) fail(FERRY_STATUS_INVALID_ARGUMENT, "dense model: tp_size must be at least 1, got 0");
  if (config_.tp_rank >= n) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "dense model: tp_rank {} is not below tp_size {}",
         config_.tp_rank, n);
  }
  if (config_.num_attention_heads && *config_.num_attention_heads % n != 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "dense model: num_attention_heads {} is not divisible by tp_size {}",
         *config_.num_attention_heads, n);
  }
  if (config_.num_key_value_heads && *config_.num_key_value_heads < n) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "dense model: num_key_value_heads {} is below tp_size {}; replicating KV heads across "
         "ranks is not supported",
         *config_.num_key_value_heads, n);
  }
  if (config_.num_key_value_heads && *config_.num_key_value_heads % n != 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "dense model: num_key_value_heads {} is not divisible by tp_size {}",
         *config_.num_key_value_heads, n);
  }
}

std::vector<Tensor> DenseModel::target_layout(const std::vector<Tensor>& catalog) {
  const std::uint32_t n = config_.tp_size;

  // 1. Recognize every name.
  const Tensor* embed = nullptr;
  const Tensor* final_norm = nullptr;
  const Tensor* lm_head = nullptr;
  std::vector<const Tensor*> inv_freqs;
  std::map<std::uint64_t, std::array<const Tensor*, kLayerRules.size()>> layers;
  std::vector<std::string> unknown;
  std::vector<std::string> malformed;
  std::unordered_set<std::string_view> seen;
  for (const Tensor& t : catalog) {
    if (!seen.insert(t.name).second) {
      malformed.push_back(fmt::format("{} (listed twice)", t.name));
      continue;
    }
    if (dtype_size(t.dtype) == 0) {
      malformed.push_back(fmt::format("{} (invalid dtype {})", t.name, static_cast<int>(t.dtype)));
    }
    if (t.name == kEmbed) {
      embed = &t;
    } else if (t.name == kFinalNorm) {
      final_norm = &t;
    } else if (t.name == kLmHead) {
      lm_head = &t;
    } else if (auto layer = parse_layer_name(t.name)) {
      if (layer->suffix == kInvFreqSuffix) {
        inv_freqs.push_back(&t);
      } else if (auto slot = layer_slot(layer->suffix)) {
        auto [it, inserted] = layers.try_emplace(layer->index);
        if (inserted) it->second.fill(nullptr);
        it->second[*slot] = &t;
      } else {
        unknown.push_back(t.name);
      }
    } else {
      unknown.push_back(t.name);
    }
  }
  const std::uint64_t num_layers =
      config_.num_hidden_layers.value_or(layers.empty() ? 0 : layers.rbegin()->first + 1);
  for (const auto& [index, slots] : layers) {
    if (index < num_layers) continue;
    for (const Tensor* t : slots) {
      if (t != nullptr) {
        unknown.push_back(fmt::format("{} (config_json has num_hidden_layers {})", t->name,
                                      num_layers));
      }
    }
  }
  if (!unknown.empty()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "dense model: {} checkpoint tensor(s) are not part of a Llama/Qwen2/Qwen3 model: {}",
         unknown.size(), name_list(unknown));
  }
  if (!malformed.empty()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "dense model: malformed checkpoint catalog: {}",
         name_list(malformed));
  }

  // 2. Everything required is there.
  std::vector<std::string> missing;
  if (embed == nullptr) missing.emplace_back(kEmbed);
  for (std::uint64_t index = 0; index < num_layers; ++index) {
    auto it = layers.find(index);
    if (it == layers.end()) {
      missing.push_back(fmt::format("{}{}.* (the whole layer)", kLayerPrefix, index));
      continue;
    }
    const auto& slots = it->second;
    auto name = [&](std::size_t slot) {
      return fmt::format("{}{}.{}", kLayerPrefix, index, kLayerRules[slot].suffix);
    };
    for (std::size_t slot = 0; slot < kLayerRules.size(); ++slot) {
      if (kLayerRules[slot].required && slots[slot] == nullptr) missing.push_back(name(slot));
    }
    for (const auto& group : kOptionalGroups) {
      const bool any = std::any_of(group.begin(), group.end(),
                                   [&](std::size_t s) { return slots[s] != nullptr; });
      if (!any) continue;
      for (std::size_t s : group) {
        if (slots[s] == nullptr) missing.push_back(name(s));
      }
    }
  }
  if (final_norm == nullptr) missing.emplace_back(kFinalNorm);
  if (!missing.empty()) {
    fail(FERRY_STATUS_NOT_FOUND, "dense model: {} required checkpoint tensor(s) missing: {}",
         missing.size(), name_list(missing));
  }

  // 3. Shapes agree with each other.
  std::vector<std::string> bad;
  expect_shape(embed, {Dim{}, Dim{}}, bad);
  const Dim vocab = dim_of(embed, 0);
  const Dim hidden = dim_of(embed, 1);
  expect_shape(final_norm, {hidden}, bad);
  expect_shape(lm_head, {vocab, hidden}, bad);
  for (const auto& [index, s] : layers) {
    expect_shape(s[kInputNorm], {hidden}, bad);
    expect_shape(s[kPostNorm], {hidden}, bad);
    expect_shape(s[kQ], {Dim{}, hidden}, bad);
    expect_shape(s[kK], {Dim{}, hidden}, bad);
    const Dim q_rows = dim_of(s[kQ], 0);
    const Dim kv_rows = dim_of(s[kK], 0);
    expect_shape(s[kV], {kv_rows, hidden}, bad);
    expect_shape(s[kQBias], {q_rows}, bad);
    expect_shape(s[kKBias], {kv_rows}, bad);
    expect_shape(s[kVBias], {kv_rows}, bad);
    expect_shape(s[kQNorm], {Dim{}}, bad);
    expect_shape(s[kKNorm], {dim_of(s[kQNorm], 0)}, bad);
    expect_shape(s[kO], {hidden, q_rows}, bad);
    expect_shape(s[kGate], {Dim{}, hidden}, bad);
    const Dim inter = dim_of(s[kGate], 0);
    expect_shape(s[kUp], {inter, hidden}, bad);
    expect_shape(s[kDown], {hidden, inter}, bad);
  }
  for (const Tensor* t : inv_freqs) expect_shape(t, {Dim{}}, bad);
  for (const Tensor& t : catalog) {
    if (!element_count(t.shape)) {
      bad.push_back(fmt::format("{} (element count of {} overflows)", t.name, shape_text(t.shape)));
    }
  }
  if (!bad.empty()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "dense model: {} mis-shaped checkpoint tensor(s): {}",
         bad.size(), name_list(bad));
  }

  // 4. Fused parts share a dtype (unless everything is cast), and TP divides what it shards.
  if (config_.layout == Layout::kEngine && !config_.dtype) {
    std::vector<std::string> mixed;
    for (const auto& [index, s] : layers) {
      for (const auto& group : kFusedGroups) {
        const Tensor* first = s[group[0]];
        for (std::size_t slot : group) {
          const Tensor* t = s[slot];
          if (first != nullptr && t != nullptr && t->dtype != first->dtype) {
            mixed.push_back(fmt::format("{} is {} but {} is {}", t->name, dtype_name(t->dtype),
                                        first->name, dtype_name(first->dtype)));
            break;
          }
        }
      }
    }
    if (!mixed.empty()) {
      fail(FERRY_STATUS_INVALID_ARGUMENT,
           "dense model: parts of a fused parameter have different dtypes (set option dtype to "
           "cast them to one): {}",
           name_list(mixed));
    }
  }

  auto mapping = std::make_shared<Mapping>();
  mapping->tied = config_.tie_word_embeddings || lm_head == nullptr;
  std::vector<std::string> indivisible;
  std::unordered_map<std::string, std::uint32_t> param_index;
  // `layer_prefix` is "model.layers.<N>." for a layer tensor; a fused part's parameter is
  // layer_prefix + fused.
  auto add = [&](const Tensor& t, Shard shard, std::string_view layer_prefix,
                 std::string_view fused, bool keep) {
    Placement p;
    p.shard = shard;
    p.source = t;
    if (!keep) {
      mapping->placements.emplace(t.name, std::move(p));
      return;
    }
    std::vector<std::uint64_t> shape = t.shape;
    const std::size_t dim = shard == Shard::kDim1 ? 1 : 0;
    if (shard != Shard::kReplicated) {
      if (shape[dim] % n != 0) {
        indivisible.push_back(fmt::format("{} dim {} ({})", t.name, dim, shape[dim]));
        return;
      }
      shape[dim] /= n;
    }
    std::string name = t.name;
    if (config_.layout == Layout::kEngine && !fused.empty()) {
      name = fmt::format("{}{}", layer_prefix, fused);
    }
    auto [it, inserted] =
        param_index.try_emplace(name, static_cast<std::uint32_t>(mapping->params.size()));
    if (inserted) {
      mapping->params.push_back(Tensor{name, config_.dtype.value_or(t.dtype), shape});
    } else {
      // A later part of a fused parameter: its rows follow the earlier parts'.
      Tensor& param = mapping->params[it->second];
      p.part_offset = *element_count(param.shape);
      param.shape[0] += shape[0];
    }
    p.param = it->second;
    mapping->placements.emplace(t.name, std::move(p));
  };
  add(*embed, Shard::kDim0, "", "", true);
  for (std::uint64_t index = 0; index < num_layers; ++index) {
    const auto& s = layers.at(index);
    const std::string prefix = fmt::format("{}{}.", kLayerPrefix, index);
    for (std::size_t slot = 0; slot < kLayerRules.size(); ++slot) {
      const LayerRule& rule = kLayerRules[slot];
      if (s[slot] != nullptr) add(*s[slot], rule.shard, prefix, rule.fused, true);
    }
  }
  for (const Tensor* t : inv_freqs) add(*t, Shard::kReplicated, "", "", false);
  add(*final_norm, Shard::kReplicated, "", "", true);
  if (lm_head != nullptr) add(*lm_head, Shard::kDim0, "", "", !mapping->tied);
  if (!indivisible.empty()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "dense model: tp_size {} does not divide the sharded dimension of: {}", n,
         name_list(indivisible));
  }

  // Parameter sizes are sums of checked catalog sizes; make sure the sums fit too.
  for (const Tensor& p : mapping->params) {
    if (!element_count(p.shape)) {
      fail(FERRY_STATUS_INVALID_ARGUMENT, "dense model: parameter {} of shape {} is too large",
           p.name, shape_text(p.shape));
    }
  }

  std::vector<Tensor> params = mapping->params;
  {
    std::lock_guard lock(mutex_);
    mapping_ = std::move(mapping);
  }
  return params;
}

void check_entry(const char* who, const Tensor& entry, const std::vector<std::uint64_t>& cataloged,
                 std::unordered_set<std::string_view>& seen) {
  if (entry.shape != cataloged) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: manifest entry '{}' has shape {}, the catalog said {}",
         who, entry.name, shape_text(entry.shape), shape_text(cataloged));
  }
  if (dtype_size(entry.dtype) == 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: manifest entry '{}' has invalid dtype {}", who,
         entry.name, static_cast<int>(entry.dtype));
  }
  if (!seen.insert(entry.name).second) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "{}: manifest entry '{}' appears twice", who, entry.name);
  }
}

std::shared_ptr<const DenseModel::Mapping> DenseModel::mapping(const char* caller) const {
  std::lock_guard lock(mutex_);
  if (!mapping_) {
    fail(FERRY_STATUS_FAILED_PRECONDITION, "dense model: {} called before target_layout", caller);
  }
  return mapping_;
}

std::vector<ferry_plan_op_t> DenseModel::plan(const std::vector<Tensor>& entries) const {
  const std::shared_ptr<const Mapping> m = mapping("plan");
  if (entries.size() > std::numeric_limits<std::uint32_t>::max()) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "dense model: {} entries do not fit a plan",
         entries.size());
  }
  std::vector<ferry_plan_op_t> ops;
  std::unordered_set<std::string_view> seen;
  for (std::size_t i = 0; i < entries.size(); ++i) {
    const Tensor& e = entries[i];
    auto it = m->placements.find(e.name);
    if (it == m->placements.end()) {
      fail(FERRY_STATUS_NOT_FOUND,
           "dense model: manifest entry {} '{}' is not in the checkpoint catalog given to "
           "target_layout",
           i, e.name);
    }
    const Placement& p = it->second;
    check_entry("dense model", e, p.source.shape, seen);
    if (p.param == kNoParam) continue;
    const Block b = block_of(p.source.shape, p.shard, p.part_offset, config_.tp_rank,
                             config_.tp_size);
    ops.push_back(make_op(b, static_cast<std::uint32_t>(i), e.dtype, p.param,
                          m->params[p.param].dtype));
  }
  return ops;
}

ferry_plan_op_t DenseModel::locate(const Tensor& tensor) const {
  const std::shared_ptr<const Mapping> m = mapping("locate");
  auto it = m->placements.find(tensor.name);
  const Placement* p = it == m->placements.end() ? nullptr : &it->second;
  if (tensor.name == kLmHead && m->tied) {
    // A tied lm_head is the embedding; answer with the embedding's region.
    p = &m->placements.at(std::string(kEmbed));
  }
  if (p == nullptr || p->param == kNoParam) {
    fail(FERRY_STATUS_NOT_FOUND, "dense model ({} layout): '{}' has no parameter region",
         layout_name(config_.layout), tensor.name);
  }
  if (!tensor.shape.empty() && tensor.shape != p->source.shape) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "dense model: '{}' has shape {}, the catalog said {}",
         tensor.name, shape_text(tensor.shape), shape_text(p->source.shape));
  }
  return locate_op(
      block_of(p->source.shape, p->shard, p->part_offset, config_.tp_rank, config_.tp_size),
      tensor.dtype, p->source.dtype, p->param, m->params[p->param].dtype);
}

}  // namespace ferry::dense
