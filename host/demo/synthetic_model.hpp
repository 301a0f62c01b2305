// demo/synthetic_model.hpp: the trainer side of `ferry demo`: a synthetic Qwen3-shaped model whose
// weights change deterministically every step (like an optimizer step), saved as a sharded
// safetensors checkpoint, and the fingerprints a receiver in the engine layout must report.
#pragma once

#include <cstdint>
#include <filesystem>
#include <map>
#include <span>
#include <string>
#include <vector>

namespace ferry::demo {

// The sizes of a scaled-down Qwen3 model. Attention uses head_dim 64, max(1, hidden / 64) query
// heads and max(1, heads / 4) key/value heads (grouped-query attention); the MLP's intermediate
// size is about 2.75 x hidden, rounded to a multiple of 64.
struct ModelShape {
  std::uint64_t hidden = 0;
  std::uint32_t layers = 0;
  std::uint64_t vocab = 0;
  std::uint64_t heads = 0;
  std::uint64_t kv_heads = 0;
  std::uint64_t head_dim = 64;
  std::uint64_t intermediate = 0;

  // Derives heads, kv_heads and intermediate. Throws ferry::Error INVALID_ARGUMENT when a size is
  // zero or the model would not fit in 64-bit byte counts.
  static ModelShape from_sizes(std::uint64_t hidden, std::uint32_t layers, std::uint64_t vocab);

  // "h512-l8-v8192": names the cache folder of this shape.
  std::string key() const;
};

// One checkpoint tensor (all are BF16, row-major).
struct TensorSpec {
  std::string name;
  std::vector<std::uint64_t> shape;
  std::uint64_t elements = 0;
};

// Every tensor of the model with its real Qwen3 name, in checkpoint order.
std::vector<TensorSpec> qwen3_tensors(const ModelShape& shape);

// The trainer's weights: an F32 master copy (what an optimizer updates) and the BF16 copy that
// is published to the receiver. Deterministic: the same shape, seed and steps give the same
// bytes on every machine. Not thread-safe; one trainer loop owns it.
class SyntheticModel {
 public:
  // Fills the weights from a fixed-seed generator: matrices uniform in +-0.05, norm weights
  // 1 +- 0.05 (never all zero).
  SyntheticModel(ModelShape shape, std::uint64_t seed);

  const ModelShape& shape() const noexcept { return shape_; }
  const std::vector<TensorSpec>& tensors() const noexcept { return tensors_; }
  // Bytes of one published (BF16) copy of every tensor.
  std::uint64_t bytes() const noexcept { return bytes_; }

  // The optimizer-like step `step` (1, 2, ...): w += lr * u(seed, step, tensor, element) with u
  // uniform in [-1, 1), in F32, then the BF16 copy is rounded from the master (nearest even).
  void apply_step(std::uint32_t step);

  // The published bytes of tensor `index`.
  std::span<const std::uint8_t> published(std::size_t index) const;

  // Writes the published weights into `dir` (created; must not hold another checkpoint): two or
  // more shards model-0000i-of-0000n.safetensors, model.safetensors.index.json and config.json.
  // `tag` is stored in every shard's __metadata__ under "ferry_demo".
  void write_checkpoint(const std::filesystem::path& dir, const std::string& tag) const;

  // Whether `dir` holds exactly this model's published weights: a valid checkpoint with the same
  // tensors (names, dtypes, shapes), `tag` in its metadata and byte-identical data. Never throws
  // for a bad or missing checkpoint; `why` says what differs.
  bool checkpoint_matches(const std::filesystem::path& dir, const std::string& tag,
                          std::string& why) const;

  // The fingerprints (docs/fingerprint.md) a receiver holding these weights in the engine layout
  // at tensor-parallel size 1 reports, by parameter name: q, k, v fused into
  // self_attn.qkv_proj.weight and gate, up into mlp.gate_up_proj.weight (each the dim-0
  // concatenation of its parts' bytes, in that order); every other tensor under its own name.
  std::map<std::string, std::uint64_t> engine_fingerprints() const;

  // The config.json of this model (Qwen3ForCausalLM, untied embeddings).
  std::string config_json() const;

 private:
  ModelShape shape_;
  std::uint64_t seed_;
  std::vector<TensorSpec> tensors_;
  std::vector<std::vector<float>> master_;
  std::vector<std::vector<std::uint16_t>> published_;
  std::uint64_t bytes_ = 0;
};

}  // namespace ferry::demo
