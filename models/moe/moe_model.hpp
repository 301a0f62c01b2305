// moe_model.hpp: the MoE model families (Qwen3-MoE, Qwen2-MoE, DeepSeek-V3): how checkpoint
// tensors map onto one (tensor-parallel, expert-parallel) rank's parameters, with routed experts
// stacked into the engine layout (mlp.experts.w13_weight / w2_weight), and the 2-D block plans
// that apply them. Attention, norms, embeddings and dense MLP layers are delegated to the dense
// model (ferry::dense::DenseModel); pure logic, it never touches tensor data.
#pragma once

#include "dense_model.hpp"

#include <ferry/plugin.h>

#include <cstdint>
#include <memory>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

namespace ferry::moe {

using dense::Layout;
using dense::Options;
using dense::Tensor;

// Everything an instance is created with, already validated.
struct MoeConfig {
  dense::ModelConfig dense;  // layout, tp, dtype option, attention head counts
  std::uint32_t ep_rank = 0;
  std::uint32_t ep_size = 1;
  // config.json: num_experts (Qwen) or n_routed_experts (DeepSeek); num_nextn_predict_layers
  // (DeepSeek multi-token-prediction layers past num_hidden_layers, which engines do not load).
  std::optional<std::uint64_t> num_experts;
  std::uint64_t nextn_layers = 0;
  std::string config_json;  // passed on to the dense model ("" when none)
};

// Builds a MoeConfig from the plugin's create arguments. Options: `dtype` (as the dense model).
// Throws ferry::Error INVALID_ARGUMENT naming the bad layout, option, config field or rank/size.
MoeConfig make_config(const char* layout, std::uint32_t tp_rank, std::uint32_t tp_size,
                      std::uint32_t ep_rank, std::uint32_t ep_size, const Options& options,
                      const char* config_json);

// One rank's view of a MoE checkpoint. Threading as DenseModel: target_layout is serialized by
// the caller; plan and locate may run on any thread and see the last completed target_layout.
class MoeModel {
 public:
  explicit MoeModel(MoeConfig config);
  ~MoeModel();

  const MoeConfig& config() const noexcept { return config_; }

  // Checks the full checkpoint catalog and returns this rank's parameters: embeddings, then per
  // layer the dense model's attention/norm (and dense MLP) parameters followed by the MoE ones
  // (router, correction bias, shared expert(s), stacked experts), then the final norm and
  // lm_head. Throws ferry::Error: INVALID_ARGUMENT for unknown, duplicate or mis-shaped tensors
  // and sizes EP/TP cannot divide; NOT_FOUND listing missing tensors, and missing experts by
  // layer and index.
  std::vector<Tensor> target_layout(const std::vector<Tensor>& catalog);

  // The copy operations for one bucket's entries (src_tensor indexes `entries`). Experts of
  // other EP ranks yield no operation. Errors as DenseModel::plan.
  std::vector<ferry_plan_op_t> plan(const std::vector<Tensor>& entries) const;

  // Where this rank's part of checkpoint tensor `tensor.name` lives (see DenseModel::locate);
  // an expert of another EP rank is NOT_FOUND naming the rank that holds it.
  ferry_plan_op_t locate(const Tensor& tensor) const;

 private:
  struct Mapping;
  std::shared_ptr<const Mapping> mapping(const char* caller) const;

  MoeConfig config_;
  dense::DenseModel dense_;
  mutable std::mutex mutex_;  // guards mapping_ (the pointer)
  std::shared_ptr<const Mapping> mapping_;
};

}  // namespace ferry::moe
