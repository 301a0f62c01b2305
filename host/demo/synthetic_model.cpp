// demo/synthetic_model.cpp: the synthetic Qwen3-shaped trainer model of `ferry demo` (see
// synthetic_model.hpp): generation, the deterministic optimizer-like step, checkpoint writing and
// checking, and the engine-layout fingerprints the receiver must report.
#include "demo/synthetic_model.hpp"

#include <ferry/kernels/cpu.hpp>
#include <ferry/sdk/dtype.hpp>
#include <ferry/sdk/error.hpp>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>

#include <ferry/formats/safetensors.hpp>

namespace ferry::demo {
namespace {

namespace fs = std::filesystem;

constexpr std::uint64_t kShardTargetBytes = 2ull << 30;  // more shards only for big models
constexpr float kLearningRate = 1e-3f;

std::uint64_t splitmix64(std::uint64_t& state) noexcept {
  std::uint64_t z = (state += 0x9E3779B97F4A7C15ull);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
  return z ^ (z >> 31);
}

// Uniform in [-1, 1) from the top 24 bits (exact in F32).
float uniform_pm1(std::uint64_t bits) noexcept {
  return static_cast<float>(bits >> 40) * (2.0f / 16777216.0f) - 1.0f;
}

// The generator state for (seed, step, tensor): step 0 is the initial weights.
std::uint64_t stream_state(std::uint64_t seed, std::uint64_t step, std::uint64_t tensor) noexcept {
  std::uint64_t s = seed;
  std::uint64_t a = splitmix64(s) ^ (step * 0xD1B54A32D192ED03ull);
  std::uint64_t b = splitmix64(a) ^ (tensor * 0xABC98388FB8FAC03ull);
  return splitmix64(b);
}

bool is_norm(const std::string& name) {
  return name.ends_with("norm.weight");
}

std::uint64_t checked_elements(const std::vector<std::uint64_t>& shape, const std::string& name) {
  auto n = element_count(shape);
  auto bytes = n ? checked_mul(*n, 2) : std::nullopt;
  if (!bytes) {
    fail(FERRY_STATUS_INVALID_ARGUMENT, "demo model: tensor {} of shape {} is too large", name,
         shape_string(shape));
  }
  return *n;
}

// Which fused engine parameter a checkpoint tensor belongs to, and its place in it.
struct EnginePart {
  std::string param;
  int order = 0;
};

EnginePart engine_part(const std::string& name) {
  struct Rule {
    const char* suffix;
    const char* fused;
    int order;
  };
  static constexpr Rule kRules[] = {
      {"self_attn.q_proj.weight", "self_attn.qkv_proj.weight", 0},
      {"self_attn.k_proj.weight", "self_attn.qkv_proj.weight", 1},
      {"self_attn.v_proj.weight", "self_attn.qkv_proj.weight", 2},
      {"mlp.gate_proj.weight", "mlp.gate_up_proj.weight", 0},
      {"mlp.up_proj.weight", "mlp.gate_up_proj.weight", 1},
  };
  for (const Rule& r : kRules) {
    if (name.ends_with(r.suffix)) {
      return {name.substr(0, name.size() - std::strlen(r.suffix)) + r.fused, r.order};
    }
  }
  return {name, 0};
}

}  // namespace

ModelShape ModelShape::from_sizes(std::uint64_t hidden, std::uint32_t layers, std::uint64_t vocab) {
  if (hidden == 0 || layers == 0 || vocab == 0) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "demo model: hidden size, layers and vocab size must be at least 1 (got {}, {}, {})",
         hidden, layers, vocab);
  }
  if (hidden > (1ull << 24) || vocab > (1ull << 32) || layers > 100000) {
    fail(FERRY_STATUS_INVALID_ARGUMENT,
         "demo model: hidden size {} (max 2^24), vocab size {} (max 2^32) or layers {} (max "
         "100000) is out of range",
         hidden, vocab, layers);
  }
  ModelShape s;
  s.hidden = hidden;
  s.layers = layers;
  s.vocab = vocab;
  s.heads = std::max<std::uint64_t>(1, hidden / s.head_dim);
  s.kv_heads = std::max<std::uint64_t>(1, s.heads / 4);
  s.intermediate = std::max<std::uint64_t>(64, (hidden * 11 / 4 + 32) / 64 * 64);
  return s;
}

std::string ModelShape::key() const { return fmt::format("h{}-l{}-v{}", hidden, layers, vocab); }

std::vector<TensorSpec> qwen3_tensors(const ModelShape& s) {
  std::vector<TensorSpec> out;
  auto add = [&](std::string name, std::vector<std::uint64_t> shape) {
    const std::uint64_t n = checked_elements(shape, name);
    out.push_back({std::move(name), std::move(shape), n});
  };
  const std::uint64_t q_rows = s.heads * s.head_dim;
  const std::uint64_t kv_rows = s.kv_heads * s.head_dim;
  add("model.embed_tokens.weight", {s.vocab, s.hidden});
  for (std::uint32_t i = 0; i < s.layers; ++i) {
    const std::string p = fmt::format("model.layers.{}.", i);
    add(p + "input_layernorm.weight", {s.hidden});
    add(p + "self_attn.q_proj.weight", {q_rows, s.hidden});
    add(p + "self_attn.k_proj.weight", {kv_rows, s.hidden});
    add(p + "self_attn.v_proj.weight", {kv_rows, s.hidden});
    add(p + "self_attn.o_proj.weight", {s.hidden, q_rows});
    add(p + "self_attn.q_norm.weight", {s.head_dim});
    add(p + "self_attn.k_norm.weight", {s.head_dim});
    add(p + "post_attention_layernorm.weight", {s.hidden});
    add(p + "mlp.gate_proj.weight", {s.intermediate, s.hidden});
    add(p + "mlp.up_proj.weight", {s.intermediate, s.hidden});
    add(p + "mlp.down_proj.weight", {s.hidden, s.intermediate});
  }
  add("model.norm.weight", {s.hidden});
  add("lm_head.weight", {s.vocab, s.hidden});
  return out;
}

SyntheticModel::SyntheticModel(ModelShape shape, std::uint64_t seed)
    : shape_(shape), seed_(seed), tensors_(qwen3_tensors(shape)) {
  master_.resize(tensors_.size());
  published_.resize(tensors_.size());
  for (std::size_t t = 0; t < tensors_.size(); ++t) {
    const auto sum = checked_add(bytes_, tensors_[t].elements * 2);
    if (!sum) fail(FERRY_STATUS_INVALID_ARGUMENT, "demo model: total size overflows");
    bytes_ = *sum;
    const bool norm = is_norm(tensors_[t].name);
    std::uint64_t state = stream_state(seed_, 0, t);
    auto& master = master_[t];
    auto& published = published_[t];
    master.resize(tensors_[t].elements);
    published.resize(tensors_[t].elements);
    for (std::uint64_t i = 0; i < master.size(); ++i) {
      const float u = uniform_pm1(splitmix64(state));
      master[i] = norm ? 1.0f + 0.05f * u : 0.05f * u;
      published[i] = kernels::f32_to_bf16(master[i]);
    }
  }
}

void SyntheticModel::apply_step(std::uint32_t step) {
  for (std::size_t t = 0; t < tensors_.size(); ++t) {
    std::uint64_t state = stream_state(seed_, step, t);
    auto& master = master_[t];
    auto& published = published_[t];
    for (std::uint64_t i = 0; i < master.size(); ++i) {
      master[i] += kLearningRate * uniform_pm1(splitmix64(state));
      published[i] = kernels::f32_to_bf16(master[i]);
    }
  }
}

std::span<const std::uint8_t> SyntheticModel::published(std::size_t index) const {
  const auto& p = published_.at(index);
  return {reinterpret_cast<const std::uint8_t*>(p.data()), p.size() * sizeof(std::uint16_t)};
}

void SyntheticModel::write_checkpoint(const fs::path& dir, const std::string& tag) const {
  fs::create_directories(dir);
  // Tensors in checkpoint order, dealt into at least two shards of at most about 2 GiB each.
  const std::uint64_t wanted = std::max<std::uint64_t>(2, (bytes_ + kShardTargetBytes - 1) /
                                                              kShardTargetBytes);
  const std::uint64_t target = std::max<std::uint64_t>(1, (bytes_ + wanted - 1) / wanted);
  std::vector<std::vector<std::size_t>> shards(1);
  std::uint64_t in_shard = 0;
  for (std::size_t t = 0; t < tensors_.size(); ++t) {
    if (in_shard >= target && !shards.back().empty()) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(t);
    in_shard += tensors_[t].elements * 2;
  }
  std::map<std::string, std::string> weight_map;
  const std::map<std::string, std::string> metadata{{"format", "pt"}, {"ferry_demo", tag}};
  for (std::size_t k = 0; k < shards.size(); ++k) {
    const std::string file =
        fmt::format("model-{:05}-of-{:05}.safetensors", k + 1, shards.size());
    std::vector<safetensors::TensorData> data;
    for (std::size_t t : shards[k]) {
      data.push_back({tensors_[t].name, FERRY_DTYPE_BF16, tensors_[t].shape, published(t)});
      weight_map[tensors_[t].name] = file;
    }
    safetensors::write_safetensors((dir / file).string(), data, metadata);
  }
  safetensors::write_index((dir / safetensors::kIndexFileName).string(), weight_map, bytes_);
  std::ofstream config(dir / "config.json");
  config << config_json() << "\n";
  if (!config.flush()) fail(FERRY_STATUS_IO, "cannot write {}", (dir / "config.json").string());
}

bool SyntheticModel::checkpoint_matches(const fs::path& dir, const std::string& tag,
                                        std::string& why) const {
  try {
    if (!fs::is_regular_file(dir / "config.json")) {
      why = "no config.json";
      return false;
    }
    const auto checkpoint = safetensors::read_checkpoint(dir.string(), /*keep_open=*/true);
    std::map<std::string, std::size_t> index;
    for (std::size_t t = 0; t < tensors_.size(); ++t) index[tensors_[t].name] = t;
    if (checkpoint.tensor_count() != tensors_.size()) {
      why = fmt::format("{} tensors, expected {}", checkpoint.tensor_count(), tensors_.size());
      return false;
    }
    std::vector<std::uint8_t> buffer;
    for (const auto& file : checkpoint.files) {
      auto found = file.metadata.find("ferry_demo");
      if (found == file.metadata.end() || found->second != tag) {
        why = fmt::format("{} was not written by this demo model ({})", file.path, tag);
        return false;
      }
      for (const auto& info : file.tensors) {
        auto it = index.find(info.name);
        if (it == index.end()) {
          why = fmt::format("unexpected tensor {} in {}", info.name, file.path);
          return false;
        }
        const TensorSpec& spec = tensors_[it->second];
        if (info.dtype != FERRY_DTYPE_BF16 || info.shape != spec.shape) {
          why = fmt::format("tensor {} is {} {}, expected BF16 {}", info.name,
                            dtype_name(info.dtype), shape_string(info.shape),
                            shape_string(spec.shape));
          return false;
        }
        buffer.resize(info.size());
        safetensors::read_at(file.fd.get(), buffer, file.data_offset() + info.begin, file.path);
        const auto expected = published(it->second);
        if (!std::equal(buffer.begin(), buffer.end(), expected.begin(), expected.end())) {
          why = fmt::format("the bytes of tensor {} in {} differ", info.name, file.path);
          return false;
        }
      }
    }
    return true;
  } catch (const std::exception& e) {
    why = e.what();
    return false;
  }
}

std::map<std::string, std::uint64_t> SyntheticModel::engine_fingerprints() const {
  std::map<std::string, std::vector<std::pair<int, std::size_t>>> params;
  for (std::size_t t = 0; t < tensors_.size(); ++t) {
    EnginePart part = engine_part(tensors_[t].name);
    params[part.param].emplace_back(part.order, t);
  }
  std::map<std::string, std::uint64_t> out;
  std::vector<std::uint8_t> joined;
  for (auto& [name, parts] : params) {
    std::sort(parts.begin(), parts.end());
    if (parts.size() == 1) {
      const auto bytes = published(parts[0].second);
      out[name] = kernels::fingerprint_cpu(bytes.data(), bytes.size());
      continue;
    }
    joined.clear();
    for (const auto& [order, t] : parts) {
      const auto bytes = published(t);
      joined.insert(joined.end(), bytes.begin(), bytes.end());
    }
    out[name] = kernels::fingerprint_cpu(joined.data(), joined.size());
  }
  return out;
}

std::string SyntheticModel::config_json() const {
  nlohmann::ordered_json c;
  c["architectures"] = {"Qwen3ForCausalLM"};
  c["model_type"] = "qwen3";
  c["hidden_size"] = shape_.hidden;
  c["intermediate_size"] = shape_.intermediate;
  c["num_hidden_layers"] = shape_.layers;
  c["num_attention_heads"] = shape_.heads;
  c["num_key_value_heads"] = shape_.kv_heads;
  c["head_dim"] = shape_.head_dim;
  c["vocab_size"] = shape_.vocab;
  c["tie_word_embeddings"] = false;
  c["torch_dtype"] = "bfloat16";
  c["rms_norm_eps"] = 1e-6;
  c["rope_theta"] = 1000000.0;
  c["max_position_embeddings"] = 4096;
  return c.dump(2);
}

}  // namespace ferry::demo
