// dense_model.hpp: the dense model family (Llama / Qwen2 / Qwen3): how checkpoint tensors map
// onto one tensor-parallel rank's parameters ("engine" fused or "hf" identity layout), and the
// 2-D block copy plans that apply them. Pure logic: it never touches tensor data.
#pragma once

#include <ferry/plugin.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

namespace ferry::dense {

// "engine": what SGLang / vLLM hold (q/k/v fused into qkv_proj, gate/up into gate_up_proj);
// "hf": every checkpoint tensor is its own parameter under its own name.
enum class Layout { kEngine, kHf };

// A checkpoint tensor or a parameter: a name, an element type and a shape.
struct Tensor {
  std::string name;
  ferry_dtype_t dtype = FERRY_DTYPE_INVALID;
  std::vector<std::uint64_t> shape;
};

// Everything an instance is created with, already validated.
struct ModelConfig {
  Layout layout = Layout::kEngine;
  std::uint32_t tp_rank = 0;
  std::uint32_t tp_size = 1;
  std::optional<ferry_dtype_t> dtype;  // option "dtype": parameters are cast to it
  bool tie_word_embeddings = false;    // config.json; also implied when lm_head is absent
  // From config.json when present; used to refuse shardings that split an attention head.
  std::optional<std::uint64_t> num_attention_heads;
  std::optional<std::uint64_t> num_key_value_heads;
  std::optional<std::uint64_t> num_hidden_layers;
};

using Options = std::vector<std::pair<std::string, std::string>>;

// Builds a ModelConfig from the plugin's create arguments. `layout` NULL means "engine";
// `config_json` may be NULL. Throws ferry::Error INVALID_ARGUMENT naming the bad layout, option
// key, config field or TP rank/size.
ModelConfig make_config(const char* layout, std::uint32_t tp_rank, std::uint32_t tp_size,
                        const Options& options, const char* config_json);

// The checks every family's plan() makes on manifest entry `entry` of a placed tensor: the shape
// the catalog gave it (`cataloged`), a valid dtype, and not twice in one bucket (`seen`: the names
// of this bucket's entries so far; the entry's name is added and must outlive `seen`). Throws
// INVALID_ARGUMENT prefixed with `who` ("moe model").
void check_entry(const char* who, const Tensor& entry, const std::vector<std::uint64_t>& cataloged,
                 std::unordered_set<std::string_view>& seen);

// One rank's view of a dense checkpoint. target_layout() fixes the catalog; plan() and locate()
// then read it. Threading: target_layout is serialized by the caller; plan and locate may run on
// any thread, concurrently with each other and with target_layout (they see the catalog of the
// last completed target_layout).
class DenseModel {
 public:
  explicit DenseModel(ModelConfig config);

  const ModelConfig& config() const noexcept { return config_; }

  // Checks the full, unsharded checkpoint catalog and returns this rank's parameters in a
  // deterministic order (embeddings, layers by index, final norm, lm_head). Throws ferry::Error:
  // INVALID_ARGUMENT listing unknown or duplicate names, NOT_FOUND listing missing tensors,
  // INVALID_ARGUMENT listing mis-shaped tensors (expected vs got), mixed dtypes inside a fused
  // parameter, or a dimension tensor parallelism cannot divide.
  std::vector<Tensor> target_layout(const std::vector<Tensor>& catalog);

  // The copy operations that apply `entries` (one bucket's manifest entries, in order; op
  // src_tensor is the index into `entries`) to the layout. Entries the engine does not keep
  // (rotary inv_freq, a tied lm_head) yield no operation. Throws FAILED_PRECONDITION before
  // target_layout, NOT_FOUND for a name outside the catalog, INVALID_ARGUMENT for a shape other
  // than the catalog's, a duplicate entry or an invalid dtype.
  std::vector<ferry_plan_op_t> plan(const std::vector<Tensor>& entries) const;

  // Where this rank's shard of checkpoint tensor `tensor.name` lives: dst_param, dst_offset,
  // dst_row_stride, rows, cols, dst_dtype. The src fields describe the shard as a compact
  // rows x cols block of the checkpoint dtype (src_tensor 0, src_offset 0, src_row_stride cols).
  // An empty `tensor.shape` means "name only"; otherwise it must equal the catalog's shape.
  // Throws NOT_FOUND for a name that has no parameter region.
  ferry_plan_op_t locate(const Tensor& tensor) const;

 private:
  struct Mapping;
  std::shared_ptr<const Mapping> mapping(const char* caller) const;

  ModelConfig config_;
  mutable std::mutex mutex_;  // guards mapping_ (the pointer, not what it points to)
  std::shared_ptr<const Mapping> mapping_;
};

}  // namespace ferry::dense
