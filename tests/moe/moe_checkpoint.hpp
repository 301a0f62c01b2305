// tests/moe/moe_checkpoint.hpp: tiny Qwen3-MoE checkpoints with random bf16 values, written as
// real safetensors files (plus config.json) with the disk plugin's writer, and the expected
// contents of one (EP, TP) rank's stacked expert parameters, restated from the engine layout's
// definition (w13 = this rank's gate rows then up rows, per local expert; w2 = down columns).
#pragma once

#include <ferry/formats/safetensors.hpp>

#include <ferry/plugin.h>
#include <fmt/format.h>
#include <nlohmann/json.hpp>

#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <random>
#include <string>
#include <vector>

namespace ferry::moe_test {

struct MoeShape {
  std::uint64_t experts = 8;
  std::uint64_t hidden = 8;
  std::uint64_t inter = 4;  // moe_intermediate_size
  std::uint64_t q_rows = 8, kv_rows = 4, heads = 4, kv_heads = 2, head_dim = 2;
  std::uint64_t vocab = 16;
  std::uint32_t layers = 2;
};

struct Tensor {
  std::string name;
  std::vector<std::uint64_t> shape;
  std::vector<std::uint16_t> bf16;  // row-major values
};

// Random normal values of scale `scale` as bf16 (truncated; never NaN).
inline std::vector<std::uint16_t> random_bf16(std::uint64_t n, std::mt19937_64& rng, float scale) {
  std::normal_distribution<float> normal(0.0f, scale);
  std::vector<std::uint16_t> out(n);
  for (auto& v : out) {
    const float f = normal(rng);
    std::uint32_t u;
    std::memcpy(&u, &f, 4);
    v = static_cast<std::uint16_t>(u >> 16);
  }
  return out;
}

inline std::map<std::string, Tensor> make_moe_checkpoint(const MoeShape& s, std::uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::map<std::string, Tensor> out;
  auto add = [&](std::string name, std::vector<std::uint64_t> shape) {
    std::uint64_t n = 1;
    for (auto d : shape) n *= d;
    out[name] = Tensor{name, shape, random_bf16(n, rng, 0.05f)};
  };
  add("model.embed_tokens.weight", {s.vocab, s.hidden});
  for (std::uint32_t l = 0; l < s.layers; ++l) {
    const std::string p = fmt::format("model.layers.{}.", l);
    add(p + "input_layernorm.weight", {s.hidden});
    add(p + "self_attn.q_proj.weight", {s.q_rows, s.hidden});
    add(p + "self_attn.k_proj.weight", {s.kv_rows, s.hidden});
    add(p + "self_attn.v_proj.weight", {s.kv_rows, s.hidden});
    add(p + "self_attn.q_norm.weight", {s.head_dim});
    add(p + "self_attn.k_norm.weight", {s.head_dim});
    add(p + "self_attn.o_proj.weight", {s.hidden, s.q_rows});
    add(p + "post_attention_layernorm.weight", {s.hidden});
    add(p + "mlp.gate.weight", {s.experts, s.hidden});
    for (std::uint64_t e = 0; e < s.experts; ++e) {
      add(fmt::format("{}mlp.experts.{}.gate_proj.weight", p, e), {s.inter, s.hidden});
      add(fmt::format("{}mlp.experts.{}.up_proj.weight", p, e), {s.inter, s.hidden});
      add(fmt::format("{}mlp.experts.{}.down_proj.weight", p, e), {s.hidden, s.inter});
    }
  }
  add("model.norm.weight", {s.hidden});
  add("lm_head.weight", {s.vocab, s.hidden});
  return out;
}

// model.safetensors (experts deliberately in reverse order, so buckets mix layers and
// experts out of slot order) and config.json.
inline void write_moe_checkpoint(const std::filesystem::path& dir, const MoeShape& s,
                                 const std::map<std::string, Tensor>& tensors) {
  std::filesystem::create_directories(dir);
  const nlohmann::json config = {{"architectures", {"Qwen3MoeForCausalLM"}},
                                 {"model_type", "qwen3_moe"},
                                 {"num_hidden_layers", s.layers},
                                 {"num_experts", s.experts},
                                 {"num_attention_heads", s.heads},
                                 {"num_key_value_heads", s.kv_heads},
                                 {"tie_word_embeddings", false}};
  std::ofstream(dir / "config.json") << config.dump(2) << "\n";
  std::vector<safetensors::TensorData> data;
  for (auto it = tensors.rbegin(); it != tensors.rend(); ++it) {
    const Tensor& t = it->second;
    data.push_back(safetensors::TensorData{
        t.name, FERRY_DTYPE_BF16, t.shape,
        std::span(reinterpret_cast<const std::uint8_t*>(t.bf16.data()), t.bf16.size() * 2)});
  }
  safetensors::write_safetensors((dir / "model.safetensors").string(), data);
}

// Rows [r0, r1) x columns [c0, c1) of a row-major [R, C] tensor.
inline std::vector<std::uint16_t> slice(const Tensor& t, std::uint64_t r0, std::uint64_t r1,
                                        std::uint64_t c0, std::uint64_t c1) {
  const std::uint64_t cols = t.shape.size() > 1 ? t.shape[1] : 1;
  std::vector<std::uint16_t> out;
  for (std::uint64_t r = r0; r < r1; ++r) {
    for (std::uint64_t c = c0; c < c1; ++c) out.push_back(t.bf16[r * cols + c]);
  }
  return out;
}

// w13 and w2 of layer `l` for EP rank `er` of `ep`, TP rank `tr` of `tp`.
inline std::pair<std::vector<std::uint16_t>, std::vector<std::uint16_t>> expected_stacked(
    const std::map<std::string, Tensor>& t, const MoeShape& s, std::uint32_t l, std::uint32_t er,
    std::uint32_t ep, std::uint32_t tr, std::uint32_t tp) {
  std::vector<std::uint16_t> w13, w2;
  const std::uint64_t local = s.experts / ep, shard = s.inter / tp;
  for (std::uint64_t e = er * local; e < (er + 1) * local; ++e) {
    const std::string p = fmt::format("model.layers.{}.mlp.experts.{}.", l, e);
    for (const char* part : {"gate_proj.weight", "up_proj.weight"}) {
      const auto rows = slice(t.at(p + part), tr * shard, (tr + 1) * shard, 0, s.hidden);
      w13.insert(w13.end(), rows.begin(), rows.end());
    }
    const auto cols = slice(t.at(p + "down_proj.weight"), 0, s.hidden, tr * shard, (tr + 1) * shard);
    w2.insert(w2.end(), cols.begin(), cols.end());
  }
  return {w13, w2};
}

}  // namespace ferry::moe_test
